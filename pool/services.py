"""Service functions shared by the JSON API, the admin, the websocket and the commands, so that all
of them change the pool and the database the same way.

Model settings have one write path: `write_model_settings` (the database; validated with the
model's field rules and `clean()`), and `update_model_settings` for a running pool (the same write,
then applied at once).

A settings write the database cannot store (locked by another process past OMLX_DB_BUSY_TIMEOUT,
the disk full, the folder read-only) is the client's error (pool/storage.py's `client_error`: 503
with Retry-After, or 507) and is not applied to the running pool either: the database is what a
restart reads, so a change applied only in memory would vanish then, and a client told to retry
must find nothing half done. History rows are the server's own writes: `record_event` waits only
HISTORY_BUSY_SECONDS for a lock, and the event log keeps what it could not write (pool/events.py)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction

from . import storage
from .errors import InvalidRequest
from .models import EvictionEvent, ModelSettings
from .strict_json import has_lone_surrogate

# A history write waits this long for another process's lock, then the row is kept for later:
# an unload or an enforcer action must not wait OMLX_DB_BUSY_TIMEOUT for its record.
HISTORY_BUSY_SECONDS = 0.2

SETTINGS_FIELDS = {
    "is_pinned": bool, "ttl_seconds": int, "temperature": float, "top_p": float, "max_tokens": int,
    "alias": str, "is_hidden": bool, "display_name": str, "notes": str,
    "max_kv_size": int, "kv_bits": int, "kv_group_size": int, "quantized_kv_start": int,
    "trace_body_bytes": int, "draft_model": str,
}
# oMLX's model_settings.json names for the same fields
OMLX_NAMES = {"model_alias": "alias"}
_TEXT = ("display_name", "notes", "draft_model")   # never null: empty means unset


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
        raise InvalidRequest("the body must be a JSON object")
    clean = {}
    for key, value in body.items():
        name = OMLX_NAMES.get(key, key)
        if name == "model_id":
            continue
        kind = SETTINGS_FIELDS.get(name)
        if kind is None:
            raise InvalidRequest(f"unknown setting '{key}'; known: {', '.join(SETTINGS_FIELDS)}", param=key)
        if value is None and kind is not bool:
            clean[name] = "" if name in _TEXT else None
            continue
        if kind is bool and not isinstance(value, bool):
            raise InvalidRequest(f"'{key}' must be true or false", param=key)
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidRequest(f"'{key}' must be a non-negative integer", param=key)
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InvalidRequest(f"'{key}' must be a number", param=key)
        if kind is str and not isinstance(value, str):
            raise InvalidRequest(f"'{key}' must be a string", param=key)
        if kind is str and has_lone_surrogate(value):     # SQLite cannot store it (a 500 otherwise)
            raise InvalidRequest(f"'{key}' holds a lone surrogate (\\ud800-\\udfff without its pair)", param=key)
        if kind is str and "\x00" in value:             # PostgreSQL's text cannot hold it (a 500 otherwise)
            raise InvalidRequest(f"'{key}' holds a NUL character (\\u0000)", param=key)
        clean[name] = value
    if clean.get("alias") == "":
        clean["alias"] = None
    return clean


def invalid_settings(error: ValidationError) -> InvalidRequest:
    """The model's validation error as the API's: "'top_p' must be in (0, 1]", naming the field."""
    field, messages = next(iter(error.message_dict.items()))
    text = " ".join(m.rstrip(".") for m in messages)
    if field == "__all__":
        return InvalidRequest(text)
    return InvalidRequest(f"'{field}' {text}", param=field)


def busy_seconds() -> float:
    """The configured busy timeout (settings.py passes OMLX_DB_BUSY_TIMEOUT to sqlite3.connect)."""
    return float(connection.settings_dict["OPTIONS"].get("timeout", 5))


@contextmanager
def storing(what: str) -> Iterator[None]:
    """A client's database write: a storage fault is reported and becomes the client's error."""
    try:
        yield
    except DatabaseError as e:
        fault = _fault(e)
        if fault is None:
            raise
        _reopen_later()
        storage.health.failed(storage.Component.DATABASE, fault, f"{what}: {e}")
        raise storage.client_error(fault, retry_after=busy_seconds()) from None
    storage.health.succeeded(storage.Component.DATABASE)


@contextmanager
def busy_timeout(seconds: float) -> Iterator[None]:
    """This thread's connection waits at most `seconds` for a lock inside the block (SQLite's; a
    server database has its own lock waits)."""
    if connection.vendor != "sqlite":
        yield
        return
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {int(busy_seconds() * 1000)}")
        except DatabaseError:
            connection.close()   # the next use opens a fresh one, with the configured timeout


def write_model_settings(*, model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply a partial change to the model's row (created if missing) after the model's own
    validation; a ValidationError becomes a InvalidRequest naming the field, a storage fault a 503/507
    (pool/storage.py). Returns the settings.

    On a server database the writers of a fleet run side by side (SQLite's take turns): the row is
    created once (get_or_create) and locked for the change (select_for_update), so no write undoes
    another's; a unique value another host took meanwhile (an alias) fails once, and the second try
    is refused by the validation, naming the field."""
    try:
        return _write_model_settings(model_id, changes)
    except IntegrityError:
        return _write_model_settings(model_id, changes)


def _write_model_settings(model_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    with storing(f"a settings write for {model_id}"), transaction.atomic():
        ModelSettings.objects.get_or_create(model_id=model_id)
        row = ModelSettings.objects.select_for_update().get(model_id=model_id)
        for name, value in changes.items():
            setattr(row, name, value)
        try:
            row.full_clean()
        except ValidationError as e:
            raise invalid_settings(e) from None
        row.save()
    return settings_dict(row, model_id)


async def update_model_settings(*, router, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Persist a partial change (a JSON body) and apply it to the running router and hosts at once."""
    model_id = router.resolve(name).model_id
    values = await sync_to_async(write_model_settings)(model_id=model_id, changes=coerce_settings(changes))
    router.apply_model_settings(model_id, values)
    return values


async def get_model_settings(*, router, name: str) -> dict[str, Any]:
    model_id = router.resolve(name).model_id
    row = await ModelSettings.objects.filter(model_id=model_id).afirst()
    return settings_dict(row, model_id)


async def load_all_settings(router) -> None:
    async for row in ModelSettings.objects.all():
        router.apply_model_settings(row.model_id, settings_dict(row, row.model_id))


def _fault(error: DatabaseError) -> storage.Fault | None:
    """The storage fault behind a database error, kept on it for the event log to read. SQLite says
    "disk I/O error" as often as "full" on a full disk: the data folder is asked then."""
    fault = storage.classify(error)
    if fault == storage.Fault.IO and connection.vendor == "sqlite":   # a server database has no folder here
        fault = storage.fault_of(error, Path(connection.settings_dict["NAME"]).parent)
    if fault is not None:
        error.storage_fault = fault
    return fault


def _reopen_later() -> None:
    """After a storage fault, this thread's next query opens a fresh connection: SQLite opens a
    file it may not write read-only, and such a connection would stay so after the folder heals."""
    if not connection.in_atomic_block:
        connection.close()


def store_event(**fields) -> EvictionEvent:
    try:
        with busy_timeout(HISTORY_BUSY_SECONDS):
            return EvictionEvent.objects.create(**fields)
    except DatabaseError as e:
        if _fault(e) is not None:
            _reopen_later()
        raise


async def record_event(**fields) -> EvictionEvent:
    """The event log's recorder: raises on a storage fault, and the log keeps the row for later."""
    return await sync_to_async(store_event)(**fields)


async def recent_events(*, model: str | None = None, reason: str | None = None, limit: int = 50) -> list[dict]:
    qs = EvictionEvent.objects.all()
    if model:
        qs = qs.filter(model_id=model)
    if reason:
        qs = qs.filter(reason=reason)
    return [e.as_dict() async for e in qs[:limit]]
