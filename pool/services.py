"""Service functions shared by the JSON API, the admin and the dashboard's websocket, so that all
three change the pool and the database the same way."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction

from .errors import BadRequest
from .models import EvictionEvent, ModelSettings

SETTINGS_FIELDS = {
    "is_pinned": bool, "ttl_seconds": int, "temperature": float, "top_p": float, "max_tokens": int,
    "alias": str, "is_hidden": bool, "display_name": str, "notes": str,
}
# oMLX's model_settings.json names for the same fields
OMLX_NAMES = {"model_alias": "alias"}


def settings_dict(row: ModelSettings | None, model_id: str) -> dict[str, Any]:
    values = {name: getattr(row, name) if row else None for name in SETTINGS_FIELDS}
    values["is_pinned"] = bool(values["is_pinned"])
    values["is_hidden"] = bool(values["is_hidden"])
    values["display_name"] = values["display_name"] or ""
    values["notes"] = values["notes"] or ""
    return {"model_id": model_id, **values}


def validate_settings(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    clean = {}
    for key, value in body.items():
        name = OMLX_NAMES.get(key, key)
        if name == "model_id":
            continue
        kind = SETTINGS_FIELDS.get(name)
        if kind is None:
            raise BadRequest(f"unknown setting '{key}'; known: {', '.join(SETTINGS_FIELDS)}", param=key)
        if value is None and name not in ("is_pinned", "is_hidden"):
            clean[name] = "" if kind is str and name in ("display_name", "notes") else None
            continue
        if kind is bool and not isinstance(value, bool):
            raise BadRequest(f"'{key}' must be true or false", param=key)
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise BadRequest(f"'{key}' must be a non-negative integer", param=key)
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise BadRequest(f"'{key}' must be a number", param=key)
        if kind is str and not isinstance(value, str):
            raise BadRequest(f"'{key}' must be a string", param=key)
        clean[name] = value
    if clean.get("temperature") is not None and not 0 <= clean["temperature"] <= 2:
        raise BadRequest("'temperature' must be between 0 and 2", param="temperature")
    if clean.get("top_p") is not None and not 0 < clean["top_p"] <= 1:
        raise BadRequest("'top_p' must be in (0, 1]", param="top_p")
    if clean.get("alias") == "":
        clean["alias"] = None
    return clean


def _save_settings(model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    with transaction.atomic():
        row, _ = ModelSettings.objects.get_or_create(model_id=model_id)
        for name, value in changes.items():
            setattr(row, name, value)
        try:
            row.save()
        except IntegrityError:
            raise BadRequest(f"the alias '{changes.get('alias')}' is already used by another model",
                             param="alias") from None
    return settings_dict(row, model_id)


async def update_model_settings(pool, model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Persist a partial change and apply it to the running pool at once."""
    entry = pool.resolve(model_id)
    clean = validate_settings(changes)
    alias = clean.get("alias")
    if alias and alias != entry.alias and alias in pool.entries and alias != entry.id:
        raise BadRequest(f"the alias '{alias}' is the id of another model", param="alias")
    values = await sync_to_async(_save_settings)(entry.id, clean)
    pool.apply_settings(entry.id, values)
    return values


async def get_model_settings(pool, model_id: str) -> dict[str, Any]:
    entry = pool.resolve(model_id)
    row = await ModelSettings.objects.filter(model_id=entry.id).afirst()
    return settings_dict(row, entry.id)


async def load_all_settings(pool) -> None:
    async for row in ModelSettings.objects.all():
        pool.apply_settings(row.model_id, settings_dict(row, row.model_id))


async def record_event(**fields) -> EvictionEvent:
    return await EvictionEvent.objects.acreate(**fields)


async def recent_events(*, model: str | None = None, reason: str | None = None, limit: int = 50) -> list[dict]:
    qs = EvictionEvent.objects.all()
    if model:
        qs = qs.filter(model_id=model)
    if reason:
        qs = qs.filter(reason=reason)
    return [e.as_dict() async for e in qs[:limit]]
