"""`python manage.py keys create NAME [--models ID,ID] [--rate N] [--shares-cache]`, `keys list`,
`keys revoke NAME`, `keys rotate NAME`: named API keys (pool/keys). `create` and `rotate` print the
key once; only its SHA-256 is stored. A running server refuses a revoked key within a second."""

from __future__ import annotations

import re

from django.core.management.base import BaseCommand, CommandError

from pool.keys.models import ApiKey
from pool.keys.services import KeyRefused, create_key, revoke_key, rotate_key

RATE = re.compile(r"^(\d+)(?:/min)?$")


def parse_rate(text: str | None) -> int | None:
    """'60' or '60/min' -> 60."""
    if text is None:
        return None
    match = RATE.match(text.strip())
    if not match or int(match.group(1)) < 1:
        raise CommandError(f"--rate takes requests a minute, as 60 or 60/min (got '{text}')")
    return int(match.group(1))


class Command(BaseCommand):
    help = "Named API keys: create (prints the key once), list, revoke, rotate."
    requires_system_checks = []  # checks import the URLconf and MLX: too slow for a one-line change

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True)
        create = verbs.add_parser("create", help="make a key and print it (once)")
        create.add_argument("name")
        create.add_argument("--models", default="", help="model ids it may use, separated by commas (default: all)")
        create.add_argument("--rate", default=None, help="requests a minute, as 60 or 60/min (default: no limit)")
        create.add_argument("--shares-cache", action="store_true",
                            help="share the prompt cache with the other sharing keys (default: its own)")
        verbs.add_parser("list", help="every key, without its secret")
        for verb, doc in (("revoke", "refuse the key from now on"), ("rotate", "a new secret for the key")):
            verbs.add_parser(verb, help=doc).add_argument("name")

    def handle(self, *args, verb: str, **options):
        try:
            if verb == "create":
                models = [m.strip() for m in options["models"].split(",") if m.strip()]
                _, plain = create_key(name=options["name"], models=models, rate_per_minute=parse_rate(options["rate"]),
                                      shares_cache=options["shares_cache"])
                self.stdout.write(plain)
                self.stderr.write(f"the key '{options['name']}' (shown once: it is stored hashed)")
            elif verb == "revoke":
                revoke_key(name=options["name"])
                self.stdout.write(f"{options['name']}: revoked")
            elif verb == "rotate":
                _, plain = rotate_key(name=options["name"])
                self.stdout.write(plain)
                self.stderr.write(f"the key '{options['name']}' has a new secret (shown once); the old one is refused")
            else:
                self._list()
        except KeyRefused as e:
            raise CommandError(str(e)) from None

    def _list(self) -> None:
        rows = list(ApiKey.objects.all())
        if not rows:
            self.stdout.write("no named keys (OMLX_API_KEY, if set, is the key 'bootstrap')")
        for key in rows:
            state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
            used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
            self.stdout.write(f"{key.name}\t{key.prefix}…\t{state}\tmodels: {', '.join(key.models) or 'all'}\t"
                              f"rate: {f'{key.rate_per_minute}/min' if key.rate_per_minute else 'none'}\t"
                              f"cache: {'shared' if key.shares_cache else 'own'}\tlast used: {used}")
