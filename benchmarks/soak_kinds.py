"""The soak's request kinds, one line each in KINDS, and how one request of a kind is sent and judged.

A kind names its route, its share of the traffic, whether it streams, the body it sends (built from
the client's Ctx: model, randomness, its running chats) and the protocol its answer is read with.
Every request becomes one Result: what came back (status, error code, Retry-After), and its outcome.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

# outcomes of one request
OK = "ok"                      # a whole answer in the expected shape
ERROR = "error"                # an error status with its envelope
STREAM_ERROR = "stream_error"  # a stream that began (200) and ended with an error chunk
DISCONNECTED = "disconnected"  # the client left on purpose (a random disconnect)
DROPPED = "dropped"            # no answer: the connection closed without a response, or a stream ended unfinished
TIMEOUT = "timeout"            # no answer within the request timeout: a hang
BAD_ANSWER = "bad_answer"      # a 200 whose body is not the route's shape
CUT = "cut"                    # still running when the soak stopped its clients

WORDS = ("river lamp orange seven quiet harbor winter paper signal garden copper violet thunder "
         "meadow pocket silver anchor lantern marble canyon").split()
SYSTEM = ("You are a careful assistant in a long-running conversation about ships, lighthouses and "
          "the sea. Keep answers short. " * 6).strip()
MAX_TURNS = 5

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                  "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


@dataclass
class Result:
    kind: str
    model: str
    outcome: str
    status: int | None = None       # HTTP status; None when no response came
    code: str | None = None         # the error's code (OpenAI) or type (Anthropic), or the mid-stream error's
    retry_after: bool = False       # the error response carried Retry-After
    seconds: float = 0.0
    cached_tokens: int | None = None
    turn: int = 0                   # a multi-turn chat's turn (0: the first, or not a chat)
    text: str = ""
    detail: str = ""


@dataclass
class Ctx:
    """What one client knows when it builds a body: the model, its randomness, its chats so far."""
    model: str
    rng: random.Random
    chats: dict[str, list[dict]] = field(default_factory=dict)   # model -> the running multi-turn chat
    turn: int = 0                                                # the turn multiturn_body built

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def max_tokens(self) -> int:
        return self.rng.randint(4, 24)


def chat_body(ctx: Ctx) -> dict:
    return {"model": ctx.model, "messages": [{"role": "user", "content": ctx.words(ctx.rng.randint(3, 40))}],
            "max_tokens": ctx.max_tokens(), "temperature": ctx.rng.choice((0, 0.7))}


def completion_body(ctx: Ctx) -> dict:
    return {"model": ctx.model, "prompt": ctx.words(ctx.rng.randint(3, 60)), "max_tokens": ctx.max_tokens(),
            "temperature": ctx.rng.choice((0, 0.7))}


def multiturn_body(ctx: Ctx) -> dict:
    """The next turn of this client's chat with the model (a new chat after MAX_TURNS): every turn
    but the first should find the previous one in the prompt cache."""
    chat = ctx.chats.get(ctx.model)
    if chat is None or len(chat) > 2 * MAX_TURNS:
        chat = ctx.chats[ctx.model] = [{"role": "system", "content": SYSTEM + f" Chat {ctx.rng.randrange(10**6)}."}]
    ctx.turn = len(chat) // 2
    chat.append({"role": "user", "content": ctx.words(ctx.rng.randint(5, 20))})
    return {"model": ctx.model, "messages": list(chat), "max_tokens": ctx.max_tokens(), "temperature": 0}


def remember_turn(ctx: Ctx, result: Result) -> None:
    """After a multi-turn request: keep the answer as the assistant's turn, or drop the chat."""
    chat = ctx.chats.get(ctx.model)
    if chat is None:
        return
    if result.outcome == OK:
        chat.append({"role": "assistant", "content": result.text or "."})
    else:
        del ctx.chats[ctx.model]


def unload_after_body(ctx: Ctx) -> dict:
    return {**chat_body(ctx), "keep_alive": 0}        # Ollama's meaning: unload when the request ends


def tools_body(ctx: Ctx) -> dict:
    choice = ctx.rng.choice(("auto", "required", {"type": "function", "function": {"name": "get_weather"}}))
    return {"model": ctx.model, "messages": [{"role": "user", "content": "What is the weather in " + ctx.words(2)}],
            "tools": [WEATHER_TOOL], "tool_choice": choice, "max_tokens": 48, "temperature": 0}


def json_schema_body(ctx: Ctx) -> dict:
    return {"model": ctx.model, "messages": [{"role": "user", "content": "A person as JSON: " + ctx.words(4)}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
            "max_tokens": 48, "temperature": 0}


def anthropic_body(ctx: Ctx) -> dict:
    return {"model": ctx.model, "system": "Answer briefly.", "max_tokens": ctx.max_tokens(),
            "messages": [{"role": "user", "content": ctx.words(ctx.rng.randint(3, 30))}]}


def embeddings_body(ctx: Ctx) -> dict:
    return {"model": ctx.model, "input": [ctx.words(ctx.rng.randint(2, 30)) for _ in range(ctx.rng.randint(1, 8))]}


@dataclass(frozen=True)
class Kind:
    name: str
    route: str
    weight: float                     # share of the traffic (normalised over the kinds that run)
    stream: bool
    body: Callable[[Ctx], dict]
    protocol: str = "openai"          # how the answer is read: openai | anthropic | embeddings
    models: str = "chat"              # which models it picks from: chat | embeddings
    turns: bool = False               # a multi-turn chat: the answer becomes the next turn's history


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
KINDS = (
    Kind("chat", CHAT, 2, False, chat_body),
    Kind("chat-stream", CHAT, 3, True, chat_body),
    Kind("completion", COMPLETIONS, 1, False, completion_body),
    Kind("completion-stream", COMPLETIONS, 1, True, completion_body),
    Kind("multiturn", CHAT, 2, False, multiturn_body, turns=True),
    Kind("multiturn-stream", CHAT, 2, True, multiturn_body, turns=True),
    Kind("chat-keep-alive-0", CHAT, 0.2, False, unload_after_body),
    Kind("tools", CHAT, 0.7, False, tools_body),
    Kind("tools-stream", CHAT, 0.3, True, tools_body),
    Kind("json-schema", CHAT, 0.7, False, json_schema_body),
    Kind("anthropic", "/v1/messages", 0.5, False, anthropic_body, protocol="anthropic"),
    Kind("anthropic-stream", "/v1/messages", 0.5, True, anthropic_body, protocol="anthropic"),
    Kind("embeddings", "/v1/embeddings", 0.7, False, embeddings_body, protocol="embeddings", models="embeddings"),
)


# ---- one request --------------------------------------------------------------------------------

def error_info(body: bytes) -> tuple[str | None, str]:
    """(code, message) of an error envelope: OpenAI's `error.code` (else its type), Anthropic's `error.type`."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return None, body[:160].decode(errors="replace")
    if not isinstance(error, dict):
        return None, str(error)[:160]
    return error.get("code") or error.get("type"), str(error.get("message", ""))[:160]


def answer_ok(protocol: str, stream: bool, body: dict) -> bool:
    """Does a non-streamed 200 have the route's shape?"""
    if protocol == "embeddings":
        return bool(body.get("data")) and all(isinstance(d.get("embedding"), (list, str)) for d in body["data"])
    if protocol == "anthropic":
        return body.get("type") == "message" and isinstance(body.get("content"), list)
    return bool(body.get("choices")) and "usage" in body


def answer_text(protocol: str, body: dict) -> str:
    if protocol == "anthropic":
        return "".join(block.get("text", "") for block in body.get("content", []))
    choice = (body.get("choices") or [{}])[0]
    return (choice.get("message") or {}).get("content") or choice.get("text") or ""


class StreamReader:
    """Reads one SSE answer: its text, its usage, an error chunk, and whether it ended properly
    (OpenAI: `data: [DONE]`; Anthropic: a `message_stop` event)."""

    def __init__(self, protocol: str):
        self.protocol, self.parts, self.usage, self.error, self.done, self.chunks = protocol, [], {}, None, False, 0

    def line(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        if line == "data: [DONE]":
            self.done = self.protocol == "openai"
            return
        data = json.loads(line[6:])
        self.chunks += 1
        if "error" in data and data.get("type", "error") == "error":
            self.error = data["error"].get("code") or data["error"].get("type") or "unknown"
        elif self.protocol == "anthropic":
            self.done = self.done or data.get("type") == "message_stop"
            delta = data.get("delta") or {}
            self.parts.append(delta.get("text") or "")
        else:
            for choice in data.get("choices") or []:
                self.parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
            self.usage = data.get("usage") or self.usage


def cached_tokens(usage: dict) -> int | None:
    details = (usage or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


async def send(client: httpx.AsyncClient, url: str, kind: Kind, ctx: Ctx, *, disconnect_after: int | None,
               timeout: float) -> Result:
    """One request of `kind`. `disconnect_after`: leave after that many chunks (streams) or after a
    short random wait (otherwise); None: read the whole answer."""
    body = kind.body(ctx)
    if kind.stream:
        body["stream"] = True
        if kind.protocol == "openai":
            body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    result = Result(kind.name, ctx.model, DROPPED, turn=ctx.turn)
    try:
        async with asyncio.timeout(timeout):
            if kind.stream:
                await _streamed(client, url + kind.route, body, kind, result, disconnect_after)
            elif disconnect_after is not None:
                try:
                    async with asyncio.timeout(ctx.rng.uniform(0.05, 1.5)):
                        await _whole(client, url + kind.route, body, kind, result)
                except TimeoutError:
                    result.outcome = DISCONNECTED
            else:
                await _whole(client, url + kind.route, body, kind, result)
    except TimeoutError:
        result.outcome, result.detail = TIMEOUT, f"no answer within {timeout:.0f} s"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.outcome, result.detail = DROPPED, f"{type(e).__name__}: {e}"
    result.seconds = time.perf_counter() - started
    if kind.turns:
        remember_turn(ctx, result)
    return result


async def _whole(client, url: str, body: dict, kind: Kind, result: Result) -> None:
    r = await client.post(url, json=body)
    result.status = r.status_code
    if r.status_code != 200:
        result.outcome, (result.code, result.detail) = ERROR, error_info(r.content)
        result.retry_after = "retry-after" in r.headers
        return
    data = r.json()
    if not answer_ok(kind.protocol, False, data):
        result.outcome, result.detail = BAD_ANSWER, r.text[:200]
        return
    result.outcome, result.text = OK, answer_text(kind.protocol, data)
    result.cached_tokens = cached_tokens(data.get("usage"))


async def _streamed(client, url: str, body: dict, kind: Kind, result: Result, disconnect_after: int | None) -> None:
    async with client.stream("POST", url, json=body) as r:
        result.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            result.outcome, (result.code, result.detail) = ERROR, error_info(r.content)
            result.retry_after = "retry-after" in r.headers
            return
        reader = StreamReader(kind.protocol)
        if disconnect_after == 0:
            result.outcome = DISCONNECTED
            return
        async for line in r.aiter_lines():
            reader.line(line)
            if disconnect_after is not None and reader.chunks >= disconnect_after:
                result.outcome = DISCONNECTED      # leaving the `async with` closes the connection
                return
    result.text, result.cached_tokens = "".join(reader.parts), cached_tokens(reader.usage)
    if reader.error is not None:
        result.outcome, result.code = STREAM_ERROR, reader.error
    elif reader.done:
        result.outcome = OK
    else:
        result.outcome, result.detail = DROPPED, f"the stream ended after {reader.chunks} chunks without its end"
