"""Stored responses (pool.models.StoredResponse), through Django's async ORM only: the event loop never
waits on the database in a thread of its own.

A response is written by a background task (`keep`) so that writing never holds up the answer, and
the task is remembered until it is done: a `previous_response_id`, GET or DELETE that names a
response still being written waits for that write first (a client may send the next turn the moment
it reads `response.completed`). Retention: OMLX_RESPONSES_DAYS and OMLX_RESPONSES_MAX, applied
after each write. An unknown id is a 404; an id whose time is up is a 400 (and its row goes). A
response belongs to the API key that made it (its name; '' without keys): to another key it is
unknown, a 404, as it would be on OpenAI's service for another organisation."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from ...conf import get_settings
from ...errors import DatabaseBusy, InvalidRequest
from ...models import StoredResponse
from ..errors import RouteNotFound

log = logging.getLogger("pool.api.responses")

_writing: dict[str, asyncio.Task] = {}     # response id -> the task writing it
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


def keep(response: dict, input_items: list[dict], output_items: list[dict], owner: str) -> None:
    """Write the response in the background (the caller does not wait)."""
    if not enabled():
        return
    task = asyncio.get_running_loop().create_task(_write(response, input_items, output_items, owner))
    _writing[response["id"]] = task
    task.add_done_callback(lambda t: _done(response["id"], t))


def _done(response_id: str, task: asyncio.Task) -> None:
    _writing.pop(response_id, None)
    if not task.cancelled() and task.exception() is not None:
        log.error("could not store response %s: %s", response_id, task.exception())


async def _write(response: dict, input_items: list[dict], output_items: list[dict], owner: str) -> None:
    settings = get_settings()
    now = timezone.now()
    await StoredResponse.objects.acreate(
        id=response["id"], model=response["model"], created_at=now,
        expires_at=now + timedelta(days=settings.responses_days),
        input_items=input_items, output_items=output_items, response=response, owner=owner)
    await StoredResponse.objects.filter(expires_at__lte=now).adelete()
    if settings.responses_max:
        old = [pk async for pk in StoredResponse.objects.order_by("-created_at", "-id")
               .values_list("id", flat=True)[settings.responses_max:]]
        if old:
            await StoredResponse.objects.filter(id__in=old).adelete()


async def flush() -> None:
    """Wait for every write under way (tests, shutdown)."""
    await asyncio.gather(*list(_writing.values()), return_exceptions=True)


async def _row(response_id: str, owner: str, *, param: str | None, what: str) -> StoredResponse:
    pending = _writing.get(response_id)
    if pending is not None:
        await asyncio.gather(pending, return_exceptions=True)
    try:
        row = await StoredResponse.objects.filter(id=response_id, owner=owner).afirst()
    except DatabaseError as e:
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
    if live is not None and live[0] == owner and response_id not in _writing:
        return live[1]
    return (await _row(response_id, owner, param=None, what="Response")).response


async def input_items(response_id: str, owner: str) -> list[dict]:
    return (await _row(response_id, owner, param=None, what="Response")).input_items


async def delete(response_id: str, owner: str) -> None:
    await _row(response_id, owner, param=None, what="Response")
    await StoredResponse.objects.filter(id=response_id, owner=owner).adelete()
