"""Request bodies of Ollama's /api/chat, /api/generate, /api/embed and /api/embeddings -> the serving
door's specs, with Ollama's field names: `options` (temperature, top_p, top_k, seed, stop, num_predict,
num_ctx, repeat_penalty, presence_penalty, frequency_penalty; others Ollama's runners take are
accepted and ignored), `format` ("json" or a JSON schema), `keep_alive`, `stream` (default true).

`num_ctx` is the context this request may use: prompt + answer must fit in it (never more than the
model's own); it changes no load, so a client that sizes it per request (Aider) causes no reload.
A tool call in a chat's history carries its arguments as an object, as Ollama's do."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ...conf import get_settings
from ...errors import InvalidRequest
from ...serving.constraints import UnsupportedSchema, json_object, json_schema
from ...serving.images import Image, ImageBudget, parts
from ...serving.specs import MAX_INPUTS, CompletionSpec, EmbeddingSpec
from ...tools.request import parse_tool_request
from ..fields import check_count, image_budget, keep_alive, stop_strings
from .names import model_field

ROLES = ("system", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20     # Ollama's limit, as OpenAI's


@dataclass(frozen=True)
class OllamaRequest:
    spec: CompletionSpec
    stream: bool


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _model(body: dict) -> str:
    return model_field(body)


def _stream(body: dict) -> bool:
    value = body.get("stream", True)
    if not isinstance(value, bool):
        raise _bad("stream must be true or false", "stream")
    return value


def _number(options: dict, name: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < lo or value > hi or (lo_open and value == lo):
        raise _bad(f"options.{name} must be a number {'>' if lo_open else '>='} {lo} and <= {hi}", f"options.{name}")
    return float(value)


def _integer(options: dict, name: str, lo: int, hi: int = 2**31 - 1) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(f"options.{name} must be an integer between {lo} and {hi}", f"options.{name}")
    return value


def sampling(body: dict) -> dict[str, Any]:
    """`options` -> CompletionSpec's sampling fields."""
    options = body.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise _bad("options must be an object", "options")
    _integer(options, "top_k", 0)                  # validated; the sampler has no top-k (docs/api.md)
    num_predict = _integer(options, "num_predict", -2)
    repeat = _number(options, "repeat_penalty", 0, 10, lo_open=True)
    fields: dict[str, Any] = {
        "temperature": _number(options, "temperature", 0, 2),
        "top_p": _number(options, "top_p", 0, 1, lo_open=True),
        "seed": _integer(options, "seed", -(2**63), 2**63 - 1),
        "max_tokens": num_predict if num_predict is not None and num_predict > 0 else None,
        "context_limit": _integer(options, "num_ctx", 1),
        "repetition_penalty": None if repeat is None or repeat == 1 else repeat,
        "presence_penalty": _number(options, "presence_penalty", -2, 2) or 0.0,
        "frequency_penalty": _number(options, "frequency_penalty", -2, 2) or 0.0,
        "stop": stop_strings(options.get("stop"), name="options.stop", where="options.stop", max_count=None),
        "keep_alive": keep_alive(body),
        "constraint": constraint(body.get("format")),
        "logprobs": logprobs(body),
    }
    return fields


def logprobs(body: dict) -> int | None:
    """`logprobs` (true/false) and `top_logprobs` (0 to 20) -> the top tokens each token's logprob
    carries, or None for none; `top_logprobs` alone asks for nothing, as Ollama's."""
    wanted = body.get("logprobs", False)
    if not isinstance(wanted, bool):
        raise _bad("logprobs must be true or false", "logprobs")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise _bad(f"top_logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
    return (top or 0) if wanted else None


def constraint(value):
    """`format`: "json", a JSON schema, or nothing."""
    if value is None or value == "":
        return None
    if value == "json":
        return json_object()
    if not isinstance(value, dict):
        raise _bad('format must be "json" or a JSON schema object', "format")
    try:
        return json_schema(value)
    except UnsupportedSchema as e:
        raise InvalidRequest(f"format cannot be enforced: {e.feature}", param="format",
                             code="unsupported_schema") from None


def images(value, where: str, budget: ImageBudget) -> list[Image]:
    """`images`: a list of base64 strings (no data: prefix, as Ollama's)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list of base64-encoded images", where)
    return [budget.base64(text, f"{where}[{k}]") for k, text in enumerate(value)]


def refuse_thinking(body: dict, model: str) -> None:
    think = body.get("think")
    if think not in (None, False):
        raise _bad(f"think: '{model}' does not support thinking on this server; leave 'think' out or false", "think")


# ---- /api/chat -----------------------------------------------------------------------------------

def parse_chat(body: dict) -> OllamaRequest:
    model = _model(body)
    refuse_thinking(body, model)
    messages = chat_messages(body.get("messages"), model)
    tools = parse_tool_request({"tools": body["tools"]}) if body.get("tools") else None
    tool_fields = {"tools": tools.tools, "tool_choice": tools.tool_choice,
                   "parallel_tool_calls": tools.parallel_tool_calls} if tools is not None else {}
    check_count(body.get("tools"), "tools", get_settings().max_tools)
    return OllamaRequest(CompletionSpec(model=model, messages=messages, **sampling(body), **tool_fields),
                         stream=_stream(body))


def chat_messages(messages, model: str) -> list[dict]:
    """Ollama's messages -> OpenAI-style chat messages (tool calls with JSON-string arguments, tool
    results paired with the call they answer, by name, else in order). None or [] is Ollama's load
    verb: no messages."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise _bad("messages must be a list", "messages")
    check_count(messages, "messages", get_settings().max_messages)
    budget = image_budget()
    out: list[dict] = []
    pending: list[dict] = []          # the last assistant turn's calls not yet answered
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object with a role ({', '.join(ROLES)})", where)
        if not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        content = m.get("content", "")
        if not isinstance(content, str):
            raise _bad(f"{where}.content must be a string", f"{where}.content")
        pictures = images(m.get("images"), f"{where}.images", budget)
        if pictures and m["role"] != "user":
            raise _bad(f"{where}.images: only user messages carry images", f"{where}.images")
        message: dict[str, Any] = {"role": m["role"], "content": parts([*pictures, content])}
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = _calls(m["tool_calls"], f"{where}.tool_calls", len(out))
            message["tool_calls"], pending = calls, list(calls)
        elif m["role"] == "tool":
            name = m.get("tool_name") or m.get("name")
            call = next((c for c in pending if c["function"]["name"] == name), pending[0] if pending else None)
            if call is not None:
                pending.remove(call)
                message["tool_call_id"] = call["id"]
        out.append(message)
    return out


def _calls(calls, where: str, turn: int) -> list[dict]:
    if not isinstance(calls, list):
        raise _bad(f"{where} must be a list", where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(f'{where}[{j}] must be {{"function": {{"name", "arguments"}}}}', f"{where}[{j}]")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            text = arguments
        elif isinstance(arguments, dict):
            text = json.dumps(arguments)
        else:
            raise _bad(f"{where}[{j}].function.arguments must be an object", f"{where}[{j}].function.arguments")
        out.append({"id": f"call_{turn}_{j}", "type": "function",
                    "function": {"name": function["name"], "arguments": text}})
    return out


# ---- /api/generate -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GenerateRequest:
    model: str
    prompt: str
    system: str | None
    raw: bool
    suffix: str | None
    stream: bool
    fields: dict[str, Any]        # sampling and keep_alive, for the CompletionSpec
    images: tuple[Image, ...] = ()

    @property
    def content(self) -> str | list[dict]:
        """The user message: its images, then its prompt (images.parts)."""
        return parts([*self.images, self.prompt])

    @property
    def empty(self) -> bool:
        """Ollama's load and unload verbs: no prompt and no suffix."""
        return not self.prompt and not self.suffix and not self.images


def parse_generate(body: dict) -> GenerateRequest:
    model = _model(body)
    refuse_thinking(body, model)
    pictures = images(body.get("images"), "images", image_budget())
    texts = {}
    for name in ("prompt", "system", "suffix", "template"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise _bad(f"{name} must be a string", name)
        texts[name] = value
    if texts["template"]:
        raise _bad("template: Go templates are Ollama's; this server renders the model's own chat template "
                   "(send raw: true with a prompt you formatted yourself)", "template")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise _bad("raw must be true or false", "raw")
    if body.get("context") is not None:
        raise _bad("context: the deprecated token context is not supported; send the conversation to /api/chat",
                   "context")
    if pictures and (raw or texts["suffix"]):
        raise _bad("images: a raw prompt or a suffix cannot carry images (the chat template places them)", "images")
    return GenerateRequest(model=model, prompt=texts["prompt"] or "", system=texts["system"], raw=raw,
                           suffix=texts["suffix"] or None, stream=_stream(body), fields=sampling(body),
                           images=tuple(pictures))


# ---- /api/embed, /api/embeddings -----------------------------------------------------------------

def parse_embed(body: dict, *, legacy: bool) -> EmbeddingSpec:
    model = _model(body)
    value = body.get("prompt" if legacy else "input")
    inputs = [value] if isinstance(value, str) else value
    name = "prompt" if legacy else "input"
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) and t for t in inputs):
        raise _bad(f"{name} must be a non-empty string" + ("" if legacy else " or a list of them"), name)
    check_count(inputs, name, MAX_INPUTS)
    if body.get("truncate") is not None and not isinstance(body["truncate"], bool):
        raise _bad("truncate must be true or false", "truncate")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise _bad("dimensions must be a positive integer", "dimensions")
    return EmbeddingSpec(model=model, inputs=tuple(inputs), dimensions=dimensions, keep_alive=keep_alive(body),
                         truncate=body.get("truncate", True))
