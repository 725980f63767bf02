"""POST /v1/embeddings, in OpenAI's shape: `input` as a string, a list of strings, a list of token
ids or a list of token-id lists; `encoding_format` float or base64 (little-endian float32);
`dimensions` (the model's own only); `usage`."""

from __future__ import annotations

import base64

from django.http import JsonResponse

from ...errors import InvalidRequest
from ...runtime import get_runtime
from ...serving.specs import MAX_INPUTS, EmbeddingSpec
from .. import wants
from ..auth import require_key
from ..fields import json_body, keep_alive
from ..route import api_route

ENCODING_FORMATS = ("float", "base64")


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_input(value) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's four shapes of `input` -> one tuple of inputs, each a text or a tuple of token ids."""
    shape = "'input' must be a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list):
        raise InvalidRequest(shape, param="input")
    elif value and all(_is_token(t) for t in value):
        value = [value]
    if not value:
        raise InvalidRequest("'input' must not be empty", param="input")
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'input' has {len(value)} items; at most {MAX_INPUTS} per request", param="input")
    inputs = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            inputs.append(item)
        elif isinstance(item, list) and all(_is_token(t) for t in item):
            inputs.append(tuple(item))
        else:
            raise InvalidRequest(f"{shape}; item {i} is neither a string nor a list of integers", param="input")
        if not item:
            raise InvalidRequest(f"'input' item {i} is empty", param="input")
        if isinstance(item, list) and min(item) < 0:
            raise InvalidRequest(f"'input' item {i} has a negative token id", param="input")
    return tuple(inputs)


def parse_embeddings(body: dict) -> tuple[EmbeddingSpec, str]:
    """A request body -> (what the serving door needs, the encoding format)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    if "input" not in body:
        raise InvalidRequest("'input' is required", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ENCODING_FORMATS:
        raise InvalidRequest(f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _is_token(dimensions) or dimensions < 1):
        raise InvalidRequest("'dimensions' must be a positive integer", param="dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidRequest("'user' must be a string", param="user")
    spec = EmbeddingSpec(model=model, inputs=parse_input(body["input"]), dimensions=dimensions,
                         keep_alive=keep_alive(body))
    return spec, fmt


def encode_vector(result, index: int, fmt: str) -> list[float] | str:
    if fmt == "base64":   # as OpenAI's: the float32 values' little-endian bytes
        return base64.b64encode(result.little_endian_bytes(index)).decode("ascii")
    return result.floats(index)


def response_body(result, fmt: str) -> dict:
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(result, i, fmt)}
            for i in range(len(result))]
    return {"object": "list", "data": data, "model": result.model_id,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


@api_route("POST", auth=require_key, wants=wants.model_in_body)
async def embeddings(request):
    spec, fmt = parse_embeddings(json_body(request))
    result = await get_runtime().router.embed(spec)
    return JsonResponse(response_body(result, fmt))
