"""Stored responses (pool.models.StoredResponse), through Django's async ORM only: the event loop never
waits on the database in a thread of its own.

A response is written before it is answered (`keep`: before the JSON answer, or before a stream's
final event), so an id the client is given is one the store has: a write the database cannot take is
the 503 `response_not_stored` (a stream's `error` and `response.failed` events), never an id that
later turns out unknown. Retention (OMLX_RESPONSES_DAYS, OMLX_RESPONSES_MAX) is applied after each
write, in the background. An unknown id is a 404; an id whose time is up is a 400 (and its row goes).
A response belongs to the API key that made it (its name; '' without keys): to another key it is
unknown, a 404, as it would be on OpenAI's service for another organisation.

What is kept is what a later turn needs: the conversation's items in their normal form (items.py)
and the response. Two caps bound it: what one response adds (OMLX_RESPONSES_BYTES, refused with a
400 `response_too_large` and not stored) and what a conversation carries (OMLX_RESPONSES_CHAIN_BYTES,
a continuation past it refused with a 400 `conversation_too_large`); OMLX_MAX_MESSAGES counts a
conversation's items as it counts one `input`."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from django.db import DatabaseError, InterfaceError
from django.utils import timezone

from ...conf import get_settings
from ...errors import Busy, DatabaseBusy, InvalidRequest
from ...models import StoredResponse
from ...policy.limits import too_many
from ..errors import RouteNotFound
from .items import normal, size

log = logging.getLogger("pool.api.responses")
DB_ERRORS = (DatabaseError, InterfaceError)   # InterfaceError: a connection the database closed

_pruning: set[asyncio.Task] = set()
_streaming: dict[str, tuple[str, dict]] = {}   # response id -> (owner, its body while it streams: in_progress)


class ResponseNotFound(RouteNotFound):
    """404, in OpenAI's envelope (invalid_request_error)."""


def enabled() -> bool:
    return get_settings().responses_days > 0


def streaming(response: dict, owner: str) -> None:
    """A stored response that has begun streaming: GET shows it `in_progress` until it is written."""
    if enabled():
        _streaming[response["id"]] = (owner, response)


def streamed(response_id: str) -> None:
    _streaming.pop(response_id, None)


def check_conversation(earlier: list[dict], given: list[dict]) -> None:
    """A continuation's conversation within OMLX_MAX_MESSAGES items and OMLX_RESPONSES_CHAIN_BYTES."""
    settings = get_settings()
    problem = too_many(len(earlier) + len(given), settings.max_messages)
    if earlier and problem:
        raise InvalidRequest(f"'input' with the conversation of previous_response_id ({len(earlier)} items) "
                             f"{problem} (OMLX_MAX_MESSAGES)", param="input")
    total = size(earlier) + size(given)
    if earlier and total > settings.responses_chain_bytes:
        raise InvalidRequest(f"The conversation of previous_response_id with this input is about {total} bytes; "
                             f"a conversation carries at most {settings.responses_chain_bytes} "
                             f"(OMLX_RESPONSES_CHAIN_BYTES). Start a new one, or compact it "
                             f"(/v1/responses/compact).", param="previous_response_id",
                             code="conversation_too_large")


def check_input(given: list[dict]) -> None:
    """A stored request's input within OMLX_RESPONSES_BYTES, before anything is generated for it."""
    total = size(given) if enabled() else 0
    if total > get_settings().responses_bytes:
        _too_large(total, "input")


def _too_large(total: int, param: str | None) -> None:
    limit = get_settings().responses_bytes
    raise InvalidRequest(f"The response to store is about {total} bytes; one stored response adds at most {limit} "
                         f"(OMLX_RESPONSES_BYTES). Send less input, or store: false.", param=param,
                         code="response_too_large")


async def keep(response: dict, conversation: list[dict], given: list[dict], output: list[dict], owner: str) -> None:
    """Store the response before it is answered: a failure is the client's error, never an id."""
    if not enabled():
        return
    added = size(given) + size(response)
    if added > get_settings().responses_bytes:
        _too_large(added, None)
    try:
        await _write(response, conversation, [normal(item) for item in output], owner)
    except DB_ERRORS as e:
        log.error("could not store response %s: %s", response["id"], e)
        raise Busy(f"The answer was made but the response store could not keep it ({type(e).__name__}); it was "
                   f"not stored, so it has no id to continue or fetch. Try again, or send store: false.",
                   code="response_not_stored") from None
    streamed(response["id"])
    task = asyncio.get_running_loop().create_task(_prune())
    _pruning.add(task)
    task.add_done_callback(_pruned)


def _pruned(task: asyncio.Task) -> None:
    _pruning.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not prune stored responses: %s", task.exception())


async def _write(response: dict, conversation: list[dict], output: list[dict], owner: str) -> None:
    now = timezone.now()
    await StoredResponse.objects.acreate(
        id=response["id"], model=response["model"], created_at=now,
        expires_at=now + timedelta(days=get_settings().responses_days),
        input_items=conversation, output_items=output, response=response, owner=owner)


async def _prune() -> None:
    settings = get_settings()
    await StoredResponse.objects.filter(expires_at__lte=timezone.now()).adelete()
    if settings.responses_max:
        old = [pk async for pk in StoredResponse.objects.order_by("-created_at", "-id")
               .values_list("id", flat=True)[settings.responses_max:]]
        if old:
            await StoredResponse.objects.filter(id__in=old).adelete()


async def flush() -> None:
    """Wait for the retention work under way (tests, shutdown)."""
    await asyncio.gather(*list(_pruning), return_exceptions=True)


async def _row(response_id: str, owner: str, *, param: str | None, what: str) -> StoredResponse:
    try:
        row = await StoredResponse.objects.filter(id=response_id, owner=owner).afirst()
    except DB_ERRORS as e:
        raise DatabaseBusy(f"The response store does not answer ({type(e).__name__}); try again.") from None
    code = "previous_response_not_found" if param else "not_found"
    if row is None:
        raise ResponseNotFound(f"{what} with id '{response_id}' not found.", param=param, code=code)
    if row.expires_at <= timezone.now():
        await StoredResponse.objects.filter(id=response_id).adelete()
        raise InvalidRequest(f"{what} with id '{response_id}' has expired (responses are kept "
                             f"{get_settings().responses_days:g} days, OMLX_RESPONSES_DAYS).", param=param,
                             code="previous_response_expired" if param else "response_expired")
    return row


async def conversation(previous_response_id: str, owner: str) -> list[dict]:
    """The items a new turn continues: the previous response's input items, then its output."""
    row = await _row(previous_response_id, owner, param="previous_response_id", what="Previous response")
    return [*row.input_items, *row.output_items]


async def get(response_id: str, owner: str) -> dict:
    live = _streaming.get(response_id)
    if live is not None and live[0] == owner:
        return live[1]
    return (await _row(response_id, owner, param=None, what="Response")).response


async def input_items(response_id: str, owner: str) -> list[dict]:
    return (await _row(response_id, owner, param=None, what="Response")).input_items


async def delete(response_id: str, owner: str) -> None:
    await _row(response_id, owner, param=None, what="Response")
    await StoredResponse.objects.filter(id=response_id, owner=owner).adelete()
