"""POST /v1/responses/compact (the SDK's `client.responses.compact`): a long conversation made short.

OpenAI's answer is `{"id", "object": "response.compaction", "created_at", "output", "usage"}`, its
`output` every user message of the conversation followed by one `compaction` item, which a client
sends back as `input` in place of what it replaced. This server's version runs no model: the
compaction item carries the conversation's latest answer (its last assistant message, or the
compaction it came from), which the model reads as an assistant message when it comes back; tool
calls, their outputs and the other answers are left out. The conversation is `input` and/or the
stored conversation of `previous_response_id`; nothing is stored."""

from __future__ import annotations

import time

from django.http import JsonResponse

from ...errors import InvalidRequest
from ...runtime import get_runtime
from ..auth import require_key
from ..fields import json_body, off_loop
from ..route import api_route
from . import store
from .items import compacted_text, compaction_item, input_items
from .routes import owner
from .shapes import new_id, output_text_of, usage


@api_route("POST", auth=require_key)
async def compact(request):
    body = json_body(request)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    get_runtime().router.resolve(model)               # an unknown model is a 404, as on /v1/responses
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest("'previous_response_id' must be a string", param="previous_response_id")
    if body.get("input") is None and previous is None:
        raise InvalidRequest("'input' or 'previous_response_id' is required", param="input")
    given = await off_loop(input_items, body["input"]) if body.get("input") is not None else []
    earlier = await store.conversation(previous, owner(request)) if previous else []
    return JsonResponse(compacted([*earlier, *given]))


def compacted(items: list[dict]) -> dict:
    """The compaction of a conversation (items in their normal form)."""
    users = [item for item in items if item["type"] == "message" and item["role"] == "user"]
    return {"id": new_id("resp"), "object": "response.compaction", "created_at": int(time.time()),
            "output": [*users, compaction_item(latest_answer(items))], "usage": usage(0, 0, 0)}


def latest_answer(items: list[dict]) -> str:
    for item in reversed(items):
        if item["type"] == "message" and item["role"] == "assistant":
            return output_text_of([item])
        if item["type"] == "compaction":
            return compacted_text(item["encrypted_content"], "input")
    return ""
