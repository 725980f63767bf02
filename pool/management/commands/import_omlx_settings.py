"""`python manage.py import_omlx_settings PATH [--dry-run]`: oMLX's model_settings.json -> ModelSettings.

The file is `{"version": 1, "models": {"<model id>": {<non-null settings>}}}`, keyed by folder name.
Fields this project has are upserted (model_alias -> alias); the others (oMLX has many more) are
reported and skipped. Fields the file leaves out are left as they are, so an import never clears
notes written here. Everything is validated before anything is written: one bad entry imports nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from pool.catalog.discovery import discover
from pool.conf import get_settings
from pool.errors import InvalidRequest
from pool.management.client import ServerRefused, call_server, server_url
from pool.models import ModelSettings
from pool.services import OMLX_NAMES, SETTINGS_FIELDS, coerce_settings, invalid_settings, write_model_settings

from .models import db_settings


def known_key(key: str) -> bool:
    return OMLX_NAMES.get(key, key) in SETTINGS_FIELDS


def read_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file (oMLX keeps it at ~/.omlx/model_settings.json)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"{path}: cannot read it: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CommandError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise CommandError(f'{path}: expected {{"version": 1, "models": {{"<model id>": {{...}}}}}}')
    for model_id, values in data["models"].items():
        if not model_id.strip() or len(model_id) > 255:
            raise CommandError(f"{path}: invalid model id {model_id!r}")
        if not isinstance(values, dict):
            raise CommandError(f"{path}: the settings of '{model_id}' must be an object, not {type(values).__name__}")
    return data


def _check_ranges(model_id: str, changes: dict[str, Any]) -> None:
    """The model's own field rules, on every entry before anything is written."""
    try:
        ModelSettings(model_id=model_id, **changes).clean_fields(exclude=["model_id", "alias"])
    except ValidationError as e:
        raise invalid_settings(e) from None


class Command(BaseCommand):
    help = "Import oMLX's model_settings.json (pins, TTLs, aliases, sampling defaults) into ModelSettings."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("path", metavar="PATH", type=Path, help="oMLX's model_settings.json")
        parser.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")

    def handle(self, *args, path: Path, dry_run: bool = False, **options):
        data = read_file(path.expanduser())
        if data.get("version", 1) != 1:
            self.stderr.write(f"{path}: version {data.get('version')!r}, expected 1; importing the known fields")
        existing = db_settings()
        on_disk = set(discover(get_settings().model_dirs))

        plans, problems = [], []
        for model_id, values in data["models"].items():
            try:
                changes = coerce_settings({k: v for k, v in values.items() if known_key(k)})
                _check_ranges(model_id, changes)
            except InvalidRequest as e:
                problems.append(f"{model_id}: {e.message}")
                continue
            skipped = sorted(k for k in values if not known_key(k) and k != "model_id")
            plans.append((model_id, changes, skipped))
        problems += self._alias_problems(plans, existing, on_disk)
        if problems:
            raise CommandError(f"{path}: nothing imported:\n  " + "\n  ".join(problems))

        counts = {"created": 0, "updated": 0, "unchanged": 0}
        for model_id, changes, skipped in plans:
            row = existing.get(model_id)
            diff = {k: v for k, v in changes.items() if row is None or getattr(row, k) != v}
            status = "created" if row is None else "updated" if diff else "unchanged"
            counts[status] += 1
            line = f"{model_id}: {'would be ' if dry_run else ''}{status}"
            if diff:
                line += " (" + ", ".join(f"{k}={v!r}" for k, v in diff.items()) + ")"
            if skipped:
                line += "; skipped: " + ", ".join(skipped)
            if model_id not in on_disk:
                line += "; not in the model folders"
            self.stdout.write(line)

        if not dry_run:
            self._write(plans, existing)
        summary = ", ".join(f"{n} {status}" for status, n in counts.items())
        self.stdout.write(f"{len(plans)} models: {summary}" + (" (dry run: nothing written)" if dry_run else ""))
        if not dry_run and counts["created"] + counts["updated"]:
            self._note_running_server()

    @staticmethod
    def _alias_problems(plans, existing: dict[str, ModelSettings], on_disk: set[str]) -> list[str]:
        """Aliases are unique and must not name another model; checked on the state after the import."""
        imported = {model_id: changes for model_id, changes, _ in plans}
        # Rows the file leaves alone keep their aliases; the file's models are checked against them.
        final = [(m, row.alias) for m, row in sorted(existing.items()) if m not in imported]
        final += [(m, changes["alias"] if "alias" in changes else getattr(existing.get(m), "alias", None))
                  for m, changes in imported.items()]
        ids = on_disk | set(existing) | set(imported)
        problems, owners = [], {}
        for model_id, alias in final:
            if not alias:
                continue
            if alias in owners:
                problems.append(f"{model_id}: the alias '{alias}' is already used by '{owners[alias]}'")
            elif alias in ids and alias != model_id:
                problems.append(f"{model_id}: the alias '{alias}' is the id of another model")
            owners.setdefault(alias, model_id)
        return problems

    @staticmethod
    def _write(plans, existing: dict[str, ModelSettings]) -> None:
        model_id = None
        try:
            with transaction.atomic():
                # Aliases may move between models in one import: clear the moving ones first.
                for model_id, changes, _ in plans:
                    if "alias" in changes and model_id in existing and existing[model_id].alias != changes["alias"]:
                        write_model_settings(model_id=model_id, changes={"alias": None})
                for model_id, changes, _ in plans:
                    write_model_settings(model_id=model_id, changes=changes)
        except (InvalidRequest, IntegrityError) as e:
            raise CommandError(f"nothing imported: {model_id}: {getattr(e, 'message', e)}") from None

    def _note_running_server(self) -> None:
        """A running server re-reads the settings when it re-discovers its models."""
        try:
            answer = call_server("POST", "/api/rediscover", {})
        except ServerRefused as e:
            self.stdout.write(f"the server at {server_url()} refused to reload the settings ({e.message}); "
                              "it applies them when it restarts")
            return
        if answer is not None:
            self.stdout.write(f"applied to the running server at {server_url()}")
