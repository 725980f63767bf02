"""`python manage.py pin ID`: never evict the model, and load it at start-up.

The pin is written to the database (ModelSettings, which the server reads when it starts) and,
when a server is running, sent to it as well (POST /admin/model/<id>/settings) so that its pool
changes at once. `unpin` is this command with the other value.
"""

from __future__ import annotations

from urllib.parse import quote

from django.core.management.base import BaseCommand, CommandError

from pool.catalog.discovery import discover
from pool.catalog.names import resolve_name
from pool.conf import get_settings
from pool.management.client import ServerRefused, call_server, server_url
from pool.models import ModelSettings
from pool.services import write_model_settings

from .models import db_settings

POST_TIMEOUT = 10.0  # the server writes its database before it answers


def resolve_model(name: str, snapshot: dict | None) -> str:
    """A model id from an id or an alias known on disk, in the database or to the running server."""
    settings = db_settings()
    known = {model_id: None for model_id in discover(get_settings().model_dirs)}
    known.update({model_id: row.alias for model_id, row in settings.items()})
    known.update({m["id"]: m.get("alias") for m in (snapshot or {}).get("models", [])})
    model_id = resolve_name(name, known.items())
    if model_id is None:
        listing = ", ".join(sorted(known)) or f"none (looked in {', '.join(str(d) for d in get_settings().model_dirs)})"
        raise CommandError(f"unknown model '{name}'. Available models: {listing}")
    return model_id


class Command(BaseCommand):
    help = "Pin a model: never evicted, loaded at start-up. A running server applies it at once."
    requires_system_checks = []  # checks import the URLconf and MLX: too slow for a one-line change
    pinned = True

    def add_arguments(self, parser):
        parser.add_argument("model", metavar="ID", help="a model id or alias")

    def handle(self, *args, model: str, **options):
        verb = "pinned" if self.pinned else "unpinned"
        try:
            snapshot, refused = call_server("GET", "/api/pool"), None
        except ServerRefused as e:
            snapshot, refused = None, e
        model_id = resolve_model(model, snapshot)
        changed = self._save(model_id)
        named = model_id if model == model_id else f"{model_id} (alias '{model}')"
        self.stdout.write(f"{named}: {verb} in the database" if changed else f"{named}: already {verb} in the database")

        url = server_url()
        if refused is not None:
            raise CommandError(f"the server at {url} answered {refused}; the running pool is unchanged "
                               f"until the server restarts")
        if snapshot is None:
            self.stdout.write(f"server not running at {url}: it reads the pin when it starts")
            return
        try:
            answer = call_server("POST", f"/admin/model/{quote(model_id, safe='/')}/settings",
                                 {"is_pinned": self.pinned}, timeout=POST_TIMEOUT)
        except ServerRefused as e:
            if e.status == 404:
                self.stderr.write(f"the server at {url} does not know '{model_id}' ({e.message}); "
                                  f"it reads the pin when it starts")
                return
            raise CommandError(f"the server at {url} answered {e}; the running pool is unchanged "
                               f"until the server restarts") from None
        if answer is None:
            raise CommandError(f"the server at {url} did not answer; the running pool may be unchanged "
                               f"until the server restarts")
        self.stdout.write(f"the running server at {url} applied it at once")

    def _save(self, model_id: str) -> bool:
        row = ModelSettings.objects.filter(model_id=model_id).first()
        if bool(row and row.is_pinned) == self.pinned:
            return False  # no row is the same as not pinned
        write_model_settings(model_id=model_id, changes={"is_pinned": self.pinned})
        return True
