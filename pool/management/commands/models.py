"""`python manage.py models`: every model with its state, size, pin, alias and TTL.

The state comes from the running server (GET /api/pool) when one answers; otherwise the models are
discovered on disk and shown as unloaded.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from pool.catalog.discovery import discover
from pool.conf import get_settings
from pool.database import DatabaseNotReady, ensure_schema
from pool.management.client import ServerRefused, call_server, server_url
from pool.models import ModelSettings
from pool.policy.units import format_bytes
from pool.policy.vocabulary import ModelState


def format_size(n: int | None) -> str:
    """Decimal units, like the sizes in OMLX_* settings: 269079552 -> '269.1 MB'."""
    return "-" if n is None else format_bytes(n)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    for unit, scale in (("h", 3600), ("m", 60)):
        if s >= scale and s % scale == 0:
            return f"{s // scale}{unit}"
    return f"{s}s"


def db_settings() -> dict[str, ModelSettings]:
    """Every settings row; the schema is brought up to date first, as `serve` does."""
    try:
        ensure_schema()
        return {row.model_id: row for row in ModelSettings.objects.all()}
    except (DatabaseNotReady, DatabaseError) as e:
        raise CommandError(str(e)) from None


def render_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [headers, *rows]]


class Command(BaseCommand):
    help = "List models: state (live from a running server, else from disk), size, pinned, alias, TTL."
    requires_system_checks = []  # checks import the URLconf and MLX: too slow for a listing

    def handle(self, *args, **options):
        settings = db_settings()
        try:
            snapshot = call_server("GET", "/api/pool")
            refused = None
        except ServerRefused as e:
            snapshot, refused = None, e
        if snapshot is not None:
            rows, footer = self._live_rows(snapshot, settings), f"(live state from the server at {server_url()})"
        else:
            rows = self._disk_rows(settings)
            footer = (f"(server not running at {server_url()}; states are from disk)" if refused is None else
                      f"(the server at {server_url()} answered {refused}; states are from disk)")
        headers = ["ID", "STATE", "SIZE", "PINNED"]
        show_alias = any(r["alias"] for r in rows)
        show_ttl = any(r["ttl"] for r in rows)
        if show_alias:
            headers.append("ALIAS")
        if show_ttl:
            headers.append("TTL")
        table = []
        for r in rows:
            line = [r["id"], r["state"], format_size(r["size"]), r["pinned"]]
            if show_alias:
                line.append(r["alias"] or "")
            if show_ttl:
                line.append(r["ttl"])
            table.append(line)
        for line in render_table(headers, table):
            self.stdout.write(line)
        if not rows:
            self.stdout.write("no models found in " + ", ".join(str(d) for d in get_settings().model_dirs))
        if any(r["pinned"].endswith("*") for r in rows):
            self.stdout.write("* the running server and this database disagree (is OMLX_HOME the server's?)")
        self.stdout.write(footer)

    def _live_rows(self, snapshot: dict, settings: dict[str, ModelSettings]) -> list[dict]:
        rows = []
        for m in sorted(snapshot.get("models", []), key=lambda m: m["id"]):
            row = settings.get(m["id"])
            pinned = "yes" if m.get("pinned") else "no"
            if row is not None and row.is_pinned != bool(m.get("pinned")):
                pinned += "*"
            rows.append({"id": m["id"], "state": m.get("state", "?"), "size": m.get("size_bytes"), "pinned": pinned,
                         "alias": m.get("alias"), "ttl": format_seconds(m.get("ttl_seconds"))})
        live = {m["id"] for m in snapshot.get("models", [])}
        rows += self._missing_rows(settings, live)
        return rows

    def _disk_rows(self, settings: dict[str, ModelSettings]) -> list[dict]:
        found = discover(get_settings().model_dirs)
        idle_ttl = get_settings().idle_ttl
        rows = []
        for model_id in sorted(found):
            row = settings.get(model_id)
            ttl = row.ttl_seconds if row is not None and row.ttl_seconds is not None else idle_ttl
            rows.append({"id": model_id, "state": ModelState.UNLOADED, "size": found[model_id].size_bytes,
                         "pinned": "yes" if row is not None and row.is_pinned else "no",
                         "alias": row.alias if row is not None else None, "ttl": format_seconds(ttl)})
        return rows + self._missing_rows(settings, set(found))

    @staticmethod
    def _missing_rows(settings: dict[str, ModelSettings], present: set[str]) -> list[dict]:
        """Settings rows whose model is not in the model folders (imported, or the folder moved)."""
        return [{"id": model_id, "state": "missing", "size": None, "pinned": "yes" if row.is_pinned else "no",
                 "alias": row.alias, "ttl": format_seconds(row.ttl_seconds)}
                for model_id, row in sorted(settings.items()) if model_id not in present]
