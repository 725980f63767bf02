"""Ollama's POST /api/embed (`input`: a string or a list; `embeddings`, with its counters) and the
older POST /api/embeddings (`prompt`: one string; `embedding`), through the router as /v1/embeddings.
An input longer than the model's context is cut to it (Ollama's `truncate`, true by default); with
`truncate: false` it is a 400."""

from __future__ import annotations

import time

from django.http import JsonResponse

from ...runtime import get_runtime
from .. import wants
from ..auth import require_key
from ..dialects import OLLAMA
from ..fields import json_body
from ..route import api_route
from .parse import parse_embed


@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_model)
async def embed(request):
    start = time.monotonic()
    spec = parse_embed(json_body(request), legacy=False)
    result = await _embed(spec)
    total = int((time.monotonic() - start) * 1e9)
    return JsonResponse({"model": spec.model, "embeddings": [result.floats(i) for i in range(len(result))],
                         "total_duration": total, "load_duration": 0, "prompt_eval_count": result.prompt_tokens})


@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_model)
async def embeddings(request):
    result = await _embed(parse_embed(json_body(request), legacy=True))
    return JsonResponse({"embedding": result.floats(0)})


async def _embed(spec):
    return await get_runtime().router.embed(spec)
