"""Service functions shared by the JSON API, the admin, the websocket and the commands, so that all
of them change the pool and the database the same way.

Model settings have one write path: `write_model_settings` (the database; validated with the
model's field rules and `clean()`), and `update_model_settings` for a running pool (the same write,
then applied at once)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.db import transaction

from .errors import BadRequest
from .models import EvictionEvent, ModelSettings

SETTINGS_FIELDS = {
    "is_pinned": bool, "ttl_seconds": int, "temperature": float, "top_p": float, "max_tokens": int,
    "alias": str, "is_hidden": bool, "display_name": str, "notes": str,
    "max_kv_size": int, "kv_bits": int, "kv_group_size": int, "quantized_kv_start": int,
}
# oMLX's model_settings.json names for the same fields
OMLX_NAMES = {"model_alias": "alias"}
_TEXT = ("display_name", "notes")   # never null: empty means unset


def settings_dict(row: ModelSettings | None, model_id: str) -> dict[str, Any]:
    values = {name: getattr(row, name) if row else None for name in SETTINGS_FIELDS}
    for flag in ("is_pinned", "is_hidden"):
        values[flag] = bool(values[flag])
    for name in _TEXT:
        values[name] = values[name] or ""
    return {"model_id": model_id, **values}


def coerce_settings(body: Any) -> dict[str, Any]:
    """A JSON object of settings -> field values, checking JSON types only (the ranges are the
    model's). Unknown keys and oMLX's names are handled here."""
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
        if value is None and kind is not bool:
            clean[name] = "" if name in _TEXT else None
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
    if clean.get("alias") == "":
        clean["alias"] = None
    return clean


def invalid_settings(error: ValidationError) -> BadRequest:
    """The model's validation error as the API's: "'top_p' must be in (0, 1]", naming the field."""
    field, messages = next(iter(error.message_dict.items()))
    text = " ".join(m.rstrip(".") for m in messages)
    if field == "__all__":
        return BadRequest(text)
    return BadRequest(f"'{field}' {text}", param=field)


def write_model_settings(*, model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply a partial change to the model's row (created if missing) after the model's own
    validation; a ValidationError becomes a BadRequest naming the field. Returns the settings."""
    with transaction.atomic():
        row = ModelSettings.objects.filter(model_id=model_id).first() or ModelSettings(model_id=model_id)
        for name, value in changes.items():
            setattr(row, name, value)
        try:
            row.full_clean()
        except ValidationError as e:
            raise invalid_settings(e) from None
        row.save()
    return settings_dict(row, model_id)


async def update_model_settings(*, pool, model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Persist a partial change (a JSON body) and apply it to the running pool at once."""
    entry = pool.resolve(model_id)
    values = await sync_to_async(write_model_settings)(model_id=entry.id, changes=coerce_settings(changes))
    pool.apply_settings(entry.id, values)
    return values


async def get_model_settings(*, pool, model_id: str) -> dict[str, Any]:
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
