"""Fuzzed request bodies for every JSON route, through the ASGI application in this process (the demo
model, MiniLM and a tiny fixture model): each body gets a 200 or a 4xx in the route's error envelope (OpenAI's, or
Anthropic's on /v1/messages*), within a bounded time, and the server stays up with a snapshot that
browsers can parse. Hypothesis draws the bodies from a fixed seed (derandomize) and a bounded count,
so a run is the same every time; findings are collected and reported together, with their bodies."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pool.strict_json import dumps_finite, loads_strict
from tests.conftest import DEMO

MINILM = "all-MiniLM-L6-v2"
TINY = "tiny"                   # settings, load and unload are fuzzed on this one, not on the demo model
SMALL_MAX_TOKENS = 3            # valid bodies finish fast
SECONDS_PER_REQUEST = 30        # a body answered later than this is a hang
OPENAI, ANTHROPIC = "openai", "anthropic"


# ---- the verdict on one answer (pure) -------------------------------------------------------------

def envelope_problem(style: str, body) -> str | None:
    """Why a 4xx body is not the route's error envelope, or None."""
    if style == ANTHROPIC:
        ok = (isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict)
              and isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str))
    else:
        error = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and {"type", "param", "code"} <= set(error)
    return None if ok else f"not the {style} error envelope: {str(body)[:300]}"


def sse_problem(style: str, text: str) -> str | None:
    """Why an event stream is broken: a data line that is not strict JSON, an internal error, or no end."""
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    for item in data:
        if item == "[DONE]":
            continue
        try:
            event = loads_strict(item)
        except ValueError as e:
            return f"a data line is not strict JSON ({e}): {item[:200]}"
        error = event.get("error") if isinstance(event, dict) else None
        if isinstance(error, dict) and (error.get("code") == "internal_error" or error.get("type") == "api_error"):
            return f"the stream ended with an internal error: {item[:300]}"
    ended = data and (data[-1] == "[DONE]" if style == OPENAI else ('"message_stop"' in data[-1] or '"error"' in data[-1]))
    return None if ended else f"the stream did not end: {text[-300:]!r}"


def answer_problem(style: str, status: int, content_type: str, raw: bytes) -> str | None:
    """Why an answer breaks the rules (a 200 or a 4xx in the route's envelope, strict JSON), or None."""
    if not (status == 200 or 400 <= status < 500):
        return f"status {status}: {raw[:400]!r}"
    text = raw.decode("utf-8", errors="replace")
    if content_type.startswith("text/event-stream"):
        return sse_problem(style, text) if status == 200 else f"an event stream with status {status}"
    try:
        body = loads_strict(text)
    except ValueError as e:
        return f"status {status} with a body that is not strict JSON ({e}): {text[:300]}"
    return envelope_problem(style, body) if status >= 400 else None


@pytest.mark.parametrize("style, status, content_type, raw, problem", [
    (OPENAI, 200, "application/json", b'{"id": 1}', None),
    (OPENAI, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}', None),
    (ANTHROPIC, 404, "application/json", b'{"type": "error", "error": {"type": "not_found_error", "message": "m"}}',
     None),
    (OPENAI, 500, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": "x"}}',
     "status 500"),
    (OPENAI, 400, "application/json", b'{"type": "error", "error": {"type": "x", "message": "m"}}', "openai error"),
    (ANTHROPIC, 400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}',
     "anthropic error"),
    (OPENAI, 200, "application/json", b'{"keep_alive": NaN}', "not strict JSON"),
    (OPENAI, 400, "text/html", b"<h1>Bad Request</h1>", "not strict JSON"),
    (OPENAI, 200, "text/event-stream", b'data: {"a": 1}\n\ndata: [DONE]\n\n', None),
    (OPENAI, 200, "text/event-stream", b'data: {"a": 1}\n\n', "did not end"),
    (OPENAI, 200, "text/event-stream",
     b'data: {"error": {"code": "internal_error"}}\n\ndata: [DONE]\n\n', "internal error"),
    (ANTHROPIC, 200, "text/event-stream", b'event: message_stop\ndata: {"type": "message_stop"}\n\n', None),
])
def test_answer_problem(style, status, content_type, raw, problem):
    found = answer_problem(style, status, content_type, raw)
    assert (found is None) if problem is None else (problem in (found or "")), found


@pytest.mark.parametrize("text, refused", [
    ('{"a": "\\ud83d\\ude00"}', None),                     # an escaped pair: one emoji
    ('"\\\\ud800"', None),                                    # an escaped backslash, then text
    ('{"a": -1e308, "b": 100000000000000000000000000000}', None),
    ('{"a": "\\ud800"}', "lone surrogate"),
    ('{"\\udfff": 1}', "lone surrogate"),
    ("NaN", "not a JSON number"),
    ("1e400", "out of range"),
    ("9" * 400, "out of range"),
    ("[" * 100_000, "nested too deeply"),
])
def test_loads_strict(text, refused):
    if refused is None:
        loads_strict(text)
    else:
        with pytest.raises(ValueError, match=refused):
            loads_strict(text)


@pytest.mark.parametrize("value, text", [
    ({"a": 1.5, "b": [1, "x", None]}, '{"a": 1.5, "b": [1, "x", null]}'),
    ({"keep_alive": float("nan")}, '{"keep_alive": null}'),
    ([float("inf"), {"b": (float("-inf"), 2.0)}], '[null, {"b": [null, 2.0]}]'),
])
def test_snapshots_are_encoded_without_non_finite_numbers(value, text):
    assert dumps_finite(value) == text
    loads_strict(text)                     # what a browser's JSON.parse takes


# ---- JSON text the encoder would not write --------------------------------------------------------

class Raw(str):
    """JSON text spliced into a body as it is: deep nesting, numbers Python cannot hold."""


def to_json(value) -> str:
    """A body as JSON text. Python's encoder writes NaN / Infinity as the bare tokens and a lone
    surrogate as its \\udXXX escape: exactly the input to test."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


def nested(depth: int, inner: str = "1") -> Raw:
    return Raw('{"a":' * depth + inner + "}" * depth)


def deep_schema(depth: int) -> Raw:
    return Raw('{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth)


# ---- the strategies -------------------------------------------------------------------------------

HUGE_INTS = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**399, -(10**399),
             Raw("9" * 5000)]                       # past Python's int-from-text limit
NON_FINITE = [float("nan"), float("inf"), float("-inf"), Raw("1e400"), Raw("-1e400")]
SURROGATES = ["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d"]      # sent as \udXXX escapes
DEEP = [Raw("[" * 100_000), Raw("[" * 900 + "]" * 900), nested(2000), nested(900)]
BIG = [list(range(10_000)), ["x"] * 10_000, [{}] * 10_000, "x" * 200_000]
CURATED = st.sampled_from(HUGE_INTS + NON_FINITE + SURROGATES + DEEP + BIG + [None, True, False, -1, 0, "", [], {}])
NASTY = st.one_of(   # the curated values as likely as all the generic ones together
    CURATED, CURATED, CURATED, CURATED, st.integers(), st.floats(), st.text(max_size=12),
    st.lists(st.integers() | st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=2),
)
UNKNOWN_FIELDS = st.sampled_from(["foo", "user", "metadata", "service_tier", "store", "thinking", "", "\ud800"])

texts = st.text(max_size=30) | st.sampled_from(SURROGATES + ["", "x" * 5_000, "héllo 🌍", "<|im_end|>", "{{ x }}"])
small_max_tokens = st.integers(1, SMALL_MAX_TOKENS)
max_tokens_values = small_max_tokens | st.sampled_from([-1, 0, 2**31, 2**63 - 1, 10**30, 10**6, 1.5, "3"])
unit_floats = st.floats(-1, 3) | st.sampled_from(NON_FINITE)
stops = texts | st.lists(texts, max_size=6)
schemas = st.sampled_from([{}, {"type": "object"}, {"type": "object", "properties": {"a": {"type": "integer"}},
                                                     "required": ["a"]},
                           {"type": "string"}, {"type": "array"}, {"$ref": "#/nope"}, {"type": "object", "x-y": 1},
                           {"type": "object", "properties": {"a": {"pattern": "("}}}, deep_schema(300), True, "x"])
tool_names = st.sampled_from(["get_weather", "a", "bad name", "", "x" * 65, "\ud800"])
openai_tools = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "code_interpreter"]),
     "function": st.fixed_dictionaries({"name": tool_names}, optional={"description": texts, "parameters": schemas,
                                                                        "strict": st.booleans()})}), max_size=2)
openai_tool_choice = st.sampled_from(["auto", "none", "required", "any",
                                      {"type": "function", "function": {"name": "get_weather"}},
                                      {"type": "function", "function": {"name": "missing"}}, {"type": "function"}])
response_formats = st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "xml"}, {},
                                    {"type": "json_object", "schema": {"type": "object"}}]) | st.builds(
    lambda schema, strict: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}},
    schemas, st.booleans() | st.just("yes"))
keep_alives = st.sampled_from([-1, "5m", "1h", "-1", "soon", "5 minutes", 3600, 1e9] + HUGE_INTS + NON_FINITE)
kv_ints = st.integers(-2, 2**16) | st.sampled_from([4, 8, 32, 64, 128, 2**63, 10**30])
token_ids = st.integers(-2, 60_000) | st.sampled_from([2**31, 2**63, 10**30])
logit_bias = st.dictionaries(st.sampled_from(["0", "1", "49151", "99999999", "-1", "abc", "1e3", "\ud800"]),
                             st.floats(-200, 200) | st.sampled_from(NON_FINITE), max_size=3)


def openai_messages():
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": texts})
    call = {"id": st.just("call_1"), "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": tool_names, "arguments": st.sampled_from(['{"a": 1}', "{", "", "1"])})}
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"])},
        optional={"content": texts | st.lists(part, max_size=2) | st.none(), "tool_call_id": texts,
                  "tool_calls": st.lists(st.fixed_dictionaries(call), max_size=2), "name": texts})
    return st.lists(message, min_size=1, max_size=4)


def anthropic_messages():
    block = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_1"), "name": tool_names,
                               "input": st.just({"a": 1}) | st.just([]) | st.just(nested(900))}),
        st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1")},
                              optional={"content": texts, "is_error": st.booleans() | st.just("no")}),
        st.fixed_dictionaries({"type": st.sampled_from(["thinking", "image", "document", "server_tool_use"])}))
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                     "content": texts | st.lists(block, max_size=3)})
    return st.lists(message, min_size=1, max_size=4)


anthropic_tools = st.lists(st.fixed_dictionaries(
    {"name": tool_names}, optional={"type": st.sampled_from(["custom", "web_search_20250305"]), "description": texts,
                                    "input_schema": schemas}), max_size=2)
anthropic_tool_choice = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "any", "tool", "none", "all"])},
    optional={"name": tool_names, "disable_parallel_tool_use": st.booleans() | st.just(1)})

SAMPLING = {"temperature": unit_floats, "top_p": unit_floats, "stop": stops, "seed": st.integers(-2, 2**64 + 1),
            "n": st.integers(-1, 9) | st.just(True), "stream": st.booleans() | st.just("yes"),
            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | st.just("no")}),
            "max_tokens": max_tokens_values, "max_completion_tokens": max_tokens_values,
            "logit_bias": logit_bias, "presence_penalty": unit_floats, "frequency_penalty": unit_floats,
            "repetition_penalty": unit_floats, "keep_alive": keep_alives, "cache_prompt": st.booleans(),
            "max_kv_size": kv_ints, "kv_bits": kv_ints, "kv_group_size": kv_ints, "quantized_kv_start": kv_ints,
            "model": st.sampled_from([DEMO, "nope", "", MINILM, 5])}
CHAT_FIELDS = {**SAMPLING, "messages": openai_messages(), "tools": openai_tools, "tool_choice": openai_tool_choice,
               "parallel_tool_calls": st.booleans() | st.just(0), "response_format": response_formats,
               "logprobs": st.booleans() | st.integers(-1, 6), "top_logprobs": st.integers(-1, 25)}
COMPLETION_FIELDS = {**SAMPLING, "prompt": texts | st.lists(texts, max_size=2) | st.lists(token_ids, max_size=3),
                     "logprobs": st.integers(-1, 6) | st.booleans(), "echo": st.booleans(), "suffix": texts}
MESSAGES_FIELDS = {"model": SAMPLING["model"], "max_tokens": max_tokens_values, "messages": anthropic_messages(),
                   "system": texts | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]),
                                                                     "text": texts}), max_size=2),
                   "stop_sequences": st.lists(texts, max_size=3) | texts, "temperature": unit_floats,
                   "top_p": unit_floats, "top_k": st.integers(-1, 100) | st.sampled_from(HUGE_INTS),
                   "stream": st.booleans() | st.just("yes"), "tools": anthropic_tools,
                   "tool_choice": anthropic_tool_choice, "metadata": st.just({"user_id": "u"})}
EMBEDDING_FIELDS = {"model": st.sampled_from([MINILM, DEMO, "nope", ""]),
                    "input": texts | st.lists(texts, max_size=3) | st.lists(token_ids, max_size=4)
                    | st.lists(st.lists(token_ids, max_size=3), max_size=2),
                    "encoding_format": st.sampled_from(["float", "base64", "int8", "", None]),
                    "dimensions": st.integers(-1, 1000) | st.sampled_from(HUGE_INTS), "user": texts,
                    "keep_alive": keep_alives}
SETTINGS_FIELDS = {"is_pinned": st.booleans(), "is_hidden": st.booleans(), "ttl_seconds": st.integers(-1, 10**6),
                   "temperature": unit_floats, "top_p": unit_floats, "max_tokens": st.integers(-1, 10**6),
                   "alias": st.sampled_from(["alpha", DEMO, "", None, "a/b"]) | texts, "display_name": texts,
                   "notes": texts, "model_alias": texts, "model_id": texts,
                   "max_kv_size": kv_ints, "kv_bits": kv_ints, "kv_group_size": kv_ints, "quantized_kv_start": kv_ints}
UNLOAD_FIELDS = {"force": st.booleans() | st.just("yes")}


def bodies(base: dict, fields: dict) -> st.SearchStrategy:
    """The route's valid base body with one or two fields given a plausible or a nasty value, maybe one
    removed, maybe an unknown field added; now and then not an object at all."""
    names = sorted(set(base) | set(fields))

    def changed(chosen):
        return st.fixed_dictionaries({name: st.one_of(fields.get(name, NASTY), NASTY) for name in chosen})

    def build(changes, removed, unknown):
        body = {k: v for k, v in base.items() if k not in removed}
        return {**body, **changes, **unknown}
    chosen = st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True) if names else st.just([])
    objects = st.builds(build, chosen.flatmap(changed), st.sets(st.sampled_from(names), max_size=1) if names
                        else st.just(set()), st.dictionaries(UNKNOWN_FIELDS, NASTY, max_size=1))
    return st.one_of(objects, objects, objects, objects, NASTY)


# ---- the server and the probe -------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir, make_model, minilm_dir):
    s = module_asgi_server({DEMO: demo_model_dir, TINY: make_model("tiny-20", 20), MINILM: minilm_dir})
    # a body without max_tokens takes the model's default: keep it small too
    assert s.post(f"/admin/model/{DEMO}/settings", {"max_tokens": SMALL_MAX_TOKENS}).status_code == 200
    return s


@dataclass
class Finding:
    route: str
    body: str
    problem: str

    def __str__(self):
        body = self.body if len(self.body) < 400 else f"{self.body[:300]}... ({len(self.body)} chars)"
        return f"{self.route} {body}\n    -> {self.problem}"


def answer(server, path: str, payload: bytes, content_type="application/json") -> tuple[int, str, bytes]:
    """POST a raw body; the whole answer, streamed or not, within SECONDS_PER_REQUEST (else TimeoutError)."""
    deadline = time.monotonic() + SECONDS_PER_REQUEST
    with server.stream_request("POST", path, content=payload, timeout=SECONDS_PER_REQUEST,
                               headers={**server.headers, "Content-Type": content_type}) as r:
        chunks = []
        for chunk in r.iter_bytes():
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise TimeoutError
        return r.status_code, r.headers.get("content-type", ""), b"".join(chunks)


def probe(server, path: str, payload: bytes, style: str, *, snapshot: bool = True) -> str | None:
    """Send one body; why the answer or the server afterwards breaks the rules, or None."""
    try:
        status, content_type, raw = answer(server, path, payload)
    except (TimeoutError, httpx.TimeoutException):
        return f"no answer within {SECONDS_PER_REQUEST} s"
    except httpx.HTTPError as e:
        return f"the connection failed: {e!r}"
    problem = answer_problem(style, status, content_type, raw)
    if problem:
        return problem
    if not server.alive():
        return "the server died"
    return snapshot_problem(server) if snapshot else None


def snapshot_problem(server) -> str | None:
    """A value a body left in the pool (keep_alive, a setting) must not break browsers' JSON.parse."""
    snapshot = server.fetch("GET", "/api/pool", headers=server.headers, timeout=10)
    try:
        loads_strict(snapshot.text)
    except ValueError as e:
        return f"afterwards /api/pool is not strict JSON ({e})"
    return None


ROUTES = {   # path -> (envelope, base body, fields)
    "/v1/chat/completions": (OPENAI, {"model": DEMO, "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": SMALL_MAX_TOKENS}, CHAT_FIELDS),
    "/v1/completions": (OPENAI, {"model": DEMO, "prompt": "Once", "max_tokens": SMALL_MAX_TOKENS}, COMPLETION_FIELDS),
    "/v1/messages": (ANTHROPIC, {"model": DEMO, "max_tokens": SMALL_MAX_TOKENS,
                                 "messages": [{"role": "user", "content": "hi"}]}, MESSAGES_FIELDS),
    "/v1/messages/count_tokens": (ANTHROPIC, {"model": DEMO, "messages": [{"role": "user", "content": "hi"}]},
                                  MESSAGES_FIELDS),
    "/v1/embeddings": (OPENAI, {"model": MINILM, "input": "hello"}, EMBEDDING_FIELDS),
    f"/admin/model/{TINY}/settings": (OPENAI, {"is_pinned": False}, SETTINGS_FIELDS),
    f"/api/models/{TINY}/load": (OPENAI, {}, {}),
    f"/api/models/{TINY}/unload": (OPENAI, {"force": False}, UNLOAD_FIELDS),
    "/api/rediscover": (OPENAI, {}, {}),
    "/api/enforcer/tick": (OPENAI, {}, {}),
}
EXAMPLES = {"/v1/chat/completions": 40, "/v1/completions": 20, "/v1/messages": 30, "/v1/messages/count_tokens": 15,
            "/v1/embeddings": 15, f"/admin/model/{TINY}/settings": 30, f"/api/models/{TINY}/load": 4,
            f"/api/models/{TINY}/unload": 4, "/api/rediscover": 3, "/api/enforcer/tick": 3}
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def fuzz_route(server, path: str, findings: list[Finding]) -> int:
    style, base, fields = ROUTES[path]
    sent = []

    @settings(FUZZ, max_examples=EXAMPLES[path])
    @given(bodies(base, fields))
    def one(body):
        text = to_json(body)
        sent.append(text)
        problem = probe(server, path, text.encode("utf-8", "surrogatepass"), style)
        if problem:
            findings.append(Finding(path, text, problem))
            if "no answer" in problem or "died" in problem:
                raise AssertionError(str(findings[-1]))     # a wedged or dead server answers nothing more
    one()
    return len(sent)


def test_fuzzed_bodies_get_a_200_or_a_4xx_in_the_envelope(server):
    findings: list[Finding] = []
    counts = {}
    for path in ROUTES:
        started = time.monotonic()
        counts[path] = fuzz_route(server, path, findings)
        print(f"{path}: {counts[path]} bodies in {time.monotonic() - started:.1f} s")
    print(f"fuzzed bodies: {sum(counts.values())}")
    assert server.get("/health").status_code == 200
    server.wait_for(lambda: all(m["active_requests"] == 0 for m in server.pool()["models"]), timeout=10)
    assert not findings, f"{len(findings)} of {sum(counts.values())} bodies broke the rules:\n" + "\n".join(
        str(f) for f in findings)


# ---- every field, one nasty value at a time ---------------------------------------------------------

# One of each class, each put alone into an otherwise valid body: hypothesis's combinations may miss a
# single field's class (a lone surrogate in `display_name`), this grid cannot. The classes JSON parsing
# refuses for every field alike (NaN tokens, 100k `[`, 5000 digits) are in RAW_BODIES below.
GRID = {"true": True, "a string": "x", "an object": {}, "-1": -1, "0": 0, "2**63": 2**63, "400 digits": 10**399,
        "1e400": Raw("1e400"), "1e308": 1e308, "a lone surrogate": "\ud800",
        "10k numbers": list(range(10_000)), "900 levels": nested(900)}


# The fields each route parses itself; completions and count_tokens share the rest with chat and messages.
GRID_FIELDS = {"/v1/completions": ["prompt", "logprobs", "echo", "suffix", "max_tokens"],
               "/v1/messages/count_tokens": ["messages", "system", "tools"],
               f"/api/models/{TINY}/load": [], "/api/rediscover": [], "/api/enforcer/tick": []}
PARALLEL = 4   # generation routes take these bodies at once (batched); settings one by one (one SQLite row)


def test_every_field_with_each_class_of_nasty_value(server):
    findings, sent, started = [], 0, time.monotonic()
    for path, (style, base, fields) in ROUTES.items():
        base = {**base, "max_tokens": 1} if "max_tokens" in base else base
        for field in GRID_FIELDS.get(path, sorted(set(base) | set(fields))):
            cases = {name: to_json({**base, field: value}).encode() for name, value in GRID.items()}
            with ThreadPoolExecutor(PARALLEL if path.startswith("/v1/") else 1) as pool:
                problems = pool.map(lambda payload: probe(server, path, payload, style, snapshot=False), cases.values())
                findings += [Finding(path, f"{field}: <{name}>", p) for name, p in zip(cases, problems) if p]
            sent += len(cases)
            if problem := snapshot_problem(server):
                findings.append(Finding(path, f"{field}: <one of {', '.join(GRID)}>", problem))
    print(f"grid: {sent} bodies in {time.monotonic() - started:.1f} s")
    assert server.get("/health").status_code == 200
    assert not findings, f"{len(findings)} of {sent} bodies broke the rules:\n" + "\n".join(str(f) for f in findings)


# ---- hand-written bodies: what an encoder never writes -----------------------------------------------

RAW_BODIES = {
    "100k [": b"[" * 100_000,
    "100k { in messages": b'{"model":"%s","messages":[' % DEMO.encode() + b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    + b"]}",
    "2k objects in messages": b'{"model":"%s","max_tokens":1,"messages":[' % DEMO.encode() + to_json(nested(2000)).encode()
    + b"]}",
    "NaN at the top": b"NaN",
    "a 5000-digit number": b'{"max_tokens":' + b"9" * 5000 + b"}",
    "not UTF-8": b'{"model":"\xff\xfe"}',
    "UTF-16": '{"model":"x"}'.encode("utf-16"),
    "a BOM": b'\xef\xbb\xbf{"model":"x"}',
    "empty": b"",
    "null": b"null",
    "a list": b"[]",
    "a string": b'"x"',
    "truncated": b'{"model":',
    "a lone surrogate key": b'{"\\ud800":1}',
    "duplicate keys": b'{"max_tokens":1,"max_tokens":-1}',
    "a NUL": b'{"model":"a\\u0000b","prompt":"\\u0000"}',
}


def enormous(path: str) -> dict:
    """A body whose text is ~4 MB, in the route's own prompt field."""
    huge = "word " * 800_000
    style, base, _ = ROUTES[path]
    field = {"/v1/completions": "prompt", "/v1/embeddings": "input"}.get(path)
    if field:
        return {**base, field: huge}
    if path.startswith("/v1/"):
        return {**base, "messages": [{"role": "user", "content": huge}]}
    return {**base, "notes": huge} if "settings" in path else {**base, "x": huge}


def test_hand_written_bodies_get_a_4xx_in_the_envelope(server):
    findings, sent = [], 0
    for path, (style, _, _) in ROUTES.items():
        cases = {**RAW_BODIES, "a ~4 MB prompt": to_json(enormous(path)).encode(),
                 "10k messages": to_json({**ROUTES[path][1], "messages": [{"role": "user", "content": "x"}] * 10_000})
                 .encode()}
        for name, payload in cases.items():
            sent += 1
            problem = probe(server, path, payload, style)
            if problem:
                findings.append(Finding(path, f"<{name}>", problem))
    print(f"hand-written bodies: {sent}")
    assert server.get("/health").status_code == 200
    assert not findings, "\n".join(str(f) for f in findings)
