"""The Responses API's conversation items -> the chat messages the serving door renders.

`input` is a string (one user message) or a list of items: messages (`{"role", "content"}`, with
`"type": "message"` or without; content a string or a list of `input_text` / `output_text` parts),
`function_call` (`call_id`, `name`, `arguments`), `function_call_output` (`call_id`, `output`) and
`compaction` (made by /v1/responses/compact, compact.py). A user message's `input_image` parts are
read as every dialect's images (pool/serving/images.py) and kept as data URLs (a fetched URL's image
too), so a later turn replays them without a fetch, within the store's byte caps; `file_id` is a
400. `reasoning` items are dropped (this server writes none and its models read none); anything
else (files, `item_reference`, hosted tools' items) is a 400 naming the item. The checked items are
kept in their normal form: only the fields the model reads, each content part's text (an image's
data URL), a call output's text (what the store keeps, so an
unknown field or a reasoning item is never stored nor copied into later turns). `messages()` turns
them into chat messages: a run of function_call items becomes one assistant message with
`tool_calls`, joined to the assistant text just before it."""

from __future__ import annotations

import base64
import binascii
import json
import uuid

from ...conf import get_settings
from ...errors import InvalidRequest
from ...serving.images import Image, ImageBudget, parts
from ..fields import check_count, image_budget

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
IMAGE = "input_image"
SKIPPED = ("reasoning",)
CALLED = ("function_call_output", "function_call", "reasoning")   # what cannot begin a truncated conversation
PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "compaction": "cmp"}
COMPACTED = "omlx1:"        # the start of this server's compaction contents


def input_items(value, images: dict[str, Image] | None = None) -> list[dict]:
    """`input` checked, as a list of items in their normal form (a string is one user message), each
    with an id, as OpenAI lists a response's input items. Each image read goes into `images`, by
    the data URL its normal form keeps."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", param="input")
    check_count(value, "input", get_settings().max_messages)
    for i, item in enumerate(value):
        check_item(item, f"input[{i}]")
    budget, images = image_budget(), {} if images is None else images
    return [normal(_read_images(item, f"input[{i}]", budget, images)) for i, item in enumerate(value)
            if item.get("type", "message") not in SKIPPED]


def _read_images(item: dict, where: str, budget: ImageBudget, images: dict[str, Image]) -> dict:
    """The item with each input_image part read and kept as a data URL (the client's own when it sent one)."""
    content = item.get("content")
    if not isinstance(content, list) or not any(part.get("type") == IMAGE for part in content):
        return item
    out = []
    for j, part in enumerate(content):
        if part.get("type") == IMAGE:
            url = part["image_url"]
            image = budget.url(url, f"{where}.content[{j}].image_url")
            url = url if url.startswith("data:") else image.data_url()
            images[url] = image
            part = {"type": IMAGE, "image_url": url, "detail": part.get("detail") or "auto"}
        out.append(part)
    return {**item, "content": out}


def read_images(items: list[dict], images: dict[str, Image]) -> None:
    """A conversation's images (a stored one's, read again) into `images`, every one counted against
    the request's image limits."""
    budget = image_budget()
    for i, item in enumerate(items):
        for j, part in enumerate(item.get("content") or ()) if item.get("type") == "message" else ():
            if isinstance(part, dict) and part.get("type") == IMAGE:
                known = images.get(part["image_url"])
                if known is not None:
                    budget.count(len(known.data), f"input[{i}].content[{j}].image_url")
                else:
                    images[part["image_url"]] = budget.url(part["image_url"], "previous_response_id")


def normal(item: dict) -> dict:
    """A checked item with only what the model reads (and its id)."""
    kind = item.get("type", "message")
    given = item.get("id")
    out: dict = {"id": given if isinstance(given, str) and given else f"{PREFIX[kind]}_{uuid.uuid4().hex}",
                 "type": kind}
    if kind == "message":
        content = item["content"]
        if isinstance(content, str):
            content = [{"type": "output_text" if item["role"] == "assistant" else "input_text", "text": content}]
        out.update(role=item["role"], content=[part if part["type"] == IMAGE else
                                               {"type": part["type"], "text": part["text"]} for part in content])
    elif kind == "function_call":
        out.update(call_id=item["call_id"], name=item["name"], arguments=item["arguments"])
    elif kind == "function_call_output":
        out.update(call_id=item["call_id"], output=_output_text(item.get("output"), "input"))
    else:
        out["encrypted_content"] = item["encrypted_content"]
    return out


def check_item(item, where: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where}.type must be a string", param=f"{where}.type")
    if kind == "message":
        _check_message(item, where)
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise InvalidRequest(f"{where}.{name} must be a string", param=f"{where}.{name}")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"{where}.call_id must be a string", param=f"{where}.call_id")
        _output_text(item.get("output"), f"{where}.output")
    elif kind == "compaction":
        compacted_text(item.get("encrypted_content"), f"{where}.encrypted_content")
    elif kind not in SKIPPED:
        raise InvalidRequest(f"{where}.type {kind!r} is not supported: this server takes messages with text, "
                             f"function_call, function_call_output and compaction items", param=f"{where}.type")
    if "id" in item and item["id"] is not None and not isinstance(item["id"], str):
        raise InvalidRequest(f"{where}.id must be a string", param=f"{where}.id")


def _check_message(item: dict, where: str) -> None:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}", param=f"{where}.role")
    _pieces(item.get("content"), f"{where}.content", images=role == "user")


def _check_image(part: dict, where: str) -> None:
    if part.get("file_id") is not None:
        raise InvalidRequest(f"{where}.file_id: file ids are not supported (this server has no Files API); send the "
                             "image as image_url, a data URL (data:image/png;base64,...)", param=f"{where}.file_id")
    if not isinstance(part.get("image_url"), str):
        raise InvalidRequest(f"{where}.image_url must be a URL (data:image/png;base64,...)", param=f"{where}.image_url")
    if part.get("detail", "auto") not in ("auto", "low", "high"):
        raise InvalidRequest(f"{where}.detail must be one of auto, low, high", param=f"{where}.detail")


def _pieces(content, where: str, *, images: bool = False,
            read: dict[str, Image] | None = None) -> list[str | Image]:
    """A message's content checked, as its texts and (with `read`) its images in order."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of text parts", param=where)
    pieces: list[str | Image] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == IMAGE and images:
            _check_image(part, f"{where}[{j}]")
            if read is not None:
                pieces.append(read[part["image_url"]])
            continue
        if not isinstance(kind, str) or kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            allowed = "input_text, output_text and (in user messages) input_image"
            raise InvalidRequest(f"{where}[{j}]: only {allowed} parts are supported"
                                 + (f" (got {kind!r})" if isinstance(kind, str) else ""), param=f"{where}[{j}]")
        pieces.append(part["text"])
    return pieces


def _text(content, where: str) -> str:
    return "".join(p for p in _pieces(content, where) if isinstance(p, str))


def _output_text(output, where: str) -> str:
    if isinstance(output, (dict, list)) and not (isinstance(output, list) and all(isinstance(p, dict) for p in output)):
        return json.dumps(output)
    return _text(output, where) if output is not None else ""


def compaction_item(text: str) -> dict:
    """What /v1/responses/compact leaves of the conversation's answers: a `compaction` item whose
    `encrypted_content` (not encrypted: this server's own encoding) the model reads as an assistant
    message when it comes back in `input`."""
    encoded = base64.b64encode(text.encode()).decode()
    return {"id": f"cmp_{uuid.uuid4().hex}", "type": "compaction", "encrypted_content": COMPACTED + encoded}


def compacted_text(content, where: str) -> str:
    if isinstance(content, str) and content.startswith(COMPACTED):
        try:
            return base64.b64decode(content[len(COMPACTED):], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            pass
    raise InvalidRequest(f"{where} must be the encrypted_content of a compaction made by this server's "
                         f"/v1/responses/compact", param=where)


def messages(items: list[dict], images: dict[str, Image] | None = None) -> list[dict]:
    """Checked items -> chat messages (system for developer); `images` holds each input_image's
    Image by its data URL (input_items, read_images)."""
    out: list[dict] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": parts(_pieces(item["content"], "input", images=role == "user",
                                                                read=images or {}))})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _output_text(item.get("output"), "input")})
        elif kind == "compaction":
            out.append({"role": "assistant", "content": compacted_text(item["encrypted_content"], "input")})
    return out


def cuts(items: list[dict]) -> list[int]:
    """`truncation: "auto"`: where the conversation may begin, longest first: each drops the oldest
    turn (an item, and any calls or call outputs left without their partner), down to one item."""
    starts, start = [0], 0
    while len(items) - start > 1:
        start += 1
        while len(items) - start > 1 and items[start].get("type") in CALLED:
            start += 1
        starts.append(start)
    return starts


def size(value) -> int:
    """About the bytes `value` takes as JSON: its strings' characters, and a few per value. Cheap (no
    copy of a long string), for the store's caps."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return sum(size(k) + size(v) + 2 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(size(v) + 1 for v in value) + 2
    return 8
