"""What each route a fleet may serve on another host asks of it (fleet/routing.Want), read from the
request before the view runs. A body that is not JSON, or names no model, asks nothing: the view then
answers here with its own 400."""

from __future__ import annotations

import json
from typing import Any

from ..fleet.routing import Want


def _body(request) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def _messages(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


def _chat(body: dict[str, Any], model: str | None) -> Want | None:
    """A chat's want: its model and its messages (for prompt-prefix keys)."""
    return Want(model, messages=_messages(body.get("messages"))) if model else None


def openai_chat(request, kwargs) -> Want | None:
    body = _body(request)
    return _chat(body, _model(body))


def openai_completion(request, kwargs) -> Want | None:
    body = _body(request)
    model = _model(body)
    prompt = body.get("prompt")
    return Want(model, messages=[prompt] if isinstance(prompt, str) else None) if model else None


def anthropic_messages(request, kwargs) -> Want | None:
    body = _body(request)
    model = _model(body)
    messages = _messages(body.get("messages"))
    return Want(model, messages=[body.get("system"), *messages] if messages else None) if model else None


def responses_input(request, kwargs) -> Want | None:
    """OpenAI's Responses API: the instructions and the input as a chat's messages."""
    body = _body(request)
    model = _model(body)
    given = body.get("input")
    return Want(model, messages=[body.get("instructions"), *(given if isinstance(given, list) else [given])]) \
        if model else None


def model_in_body(request, kwargs) -> Want | None:
    model = _model(_body(request))
    return Want(model) if model else None


def model_in_body_here_first(request, kwargs) -> Want | None:
    """A question any host with the model's folder answers (count tokens): here when this host has it."""
    model = _model(_body(request))
    return Want(model, here_first=True) if model else None


def model_in_path(request, kwargs) -> Want | None:
    """An operator's call on a model: where ?host= says, else where the fleet would load it."""
    return Want(kwargs["model_id"], host=request.GET.get("host") or None)


def model_in_path_here_first(request, kwargs) -> Want | None:
    """A model's settings (the shared database), its card, its load plan: here when this host has it,
    or where ?host= says."""
    return Want(kwargs["model_id"], host=request.GET.get("host") or None, here_first=True)


def loaded_model_in_path(request, kwargs) -> Want | None:
    """An unload: where ?host= says, else a host that has the model loaded."""
    return Want(kwargs["model_id"], host=request.GET.get("host") or None, resident=True)


# ---- Ollama's routes: the model is `model` (or the older `name`), often with its `:latest` tag ----------

def _ollama_model(body: dict[str, Any]) -> str | None:
    model = body.get("model") if body.get("model") is not None else body.get("name")
    return model if isinstance(model, str) and model else None     # `:latest`: catalog/names.py resolves it


def ollama_chat(request, kwargs) -> Want | None:
    body = _body(request)
    model = _ollama_model(body)
    if model and not body.get("messages") and body.get("keep_alive") == 0:
        return Want(model, resident=True)           # Ollama's unload verb: where the model is loaded
    return _chat(body, model)


def ollama_generate(request, kwargs) -> Want | None:
    body = _body(request)
    model = _ollama_model(body)
    prompt = body.get("prompt")
    if model and not prompt and body.get("keep_alive") == 0:
        return Want(model, resident=True)           # Ollama's unload verb: where the model is loaded
    return Want(model, messages=[body.get("system"), prompt] if isinstance(prompt, str) else None) if model else None


def ollama_model(request, kwargs) -> Want | None:
    model = _ollama_model(_body(request))
    return Want(model) if model else None


def ollama_model_here_first(request, kwargs) -> Want | None:
    model = _ollama_model(_body(request))
    return Want(model, here_first=True) if model else None
