"""`python manage.py draft ID DRAFT` (or `--none`): the draft model that proposes tokens for ID
(docs/configuration.md#draft-models), written to the database and sent to a running server, which
reads it at the model's next load."""

from __future__ import annotations

from urllib.parse import quote

from django.core.management.base import BaseCommand, CommandError

from pool.management.client import ServerRefused, call_server, server_url
from pool.services import write_model_settings

from .pin import POST_TIMEOUT, resolve_model


class Command(BaseCommand):
    help = "Name the draft model of a model (speculative decoding), or none. It takes effect at the model's next load."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("model", metavar="ID", help="a model id or alias")
        parser.add_argument("draft", metavar="DRAFT", nargs="?", help="the draft's id or alias")
        parser.add_argument("--none", action="store_true", help="no draft")

    def handle(self, *args, model: str, draft: str | None = None, none: bool = False, **options):
        if none == (draft is not None):
            raise CommandError("name a DRAFT, or give --none")
        try:
            snapshot, refused = call_server("GET", "/api/pool"), None
        except ServerRefused as e:
            snapshot, refused = None, e
        model_id = resolve_model(model, snapshot)
        draft_id = resolve_model(draft, snapshot) if draft is not None else ""
        if draft_id == model_id:
            raise CommandError("a model cannot be its own draft")
        write_model_settings(model_id=model_id, changes={"draft_model": draft_id})
        self.stdout.write(f"{model_id}: draft {draft_id or 'none'} in the database")
        url = server_url()
        if refused is not None or snapshot is None:
            self.stdout.write(f"no server answering at {url}: it reads the draft when it starts")
            return
        try:
            call_server("POST", f"/admin/model/{quote(model_id, safe='/')}/settings", {"draft_model": draft_id},
                        timeout=POST_TIMEOUT)
        except ServerRefused as e:
            raise CommandError(f"the server at {url} answered {e}") from None
        self.stdout.write(f"the running server at {url} takes it at the model's next load")
