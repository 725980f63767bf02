"""Fuzzed request bodies for every JSON route, through the ASGI application in this process (the demo's
name on a tiny random llama, MiniLM and a tiny fixture model): each body gets a 200 or a 4xx in the route's
error envelope (OpenAI's, Anthropic's on /v1/messages*, Ollama's on /api/chat and its neighbours), within
a bounded time, and the server stays up with a snapshot that browsers can parse. Hypothesis draws the
bodies from a fixed seed (derandomize) and a bounded count, so a run is the same every time; findings are collected and
reported together, with their bodies.
The bodies are drawn by tests/api/fuzz_strategies.py and judged by tests/api/fuzz_verdict.py."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from pool.strict_json import loads_strict
from tests.api.fuzz_strategies import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    MESSAGES_FIELDS,
    MINILM,
    OLLAMA_CHAT_FIELDS,
    OLLAMA_EMBED_FIELDS,
    OLLAMA_EMBEDDINGS_FIELDS,
    OLLAMA_GENERATE_FIELDS,
    OLLAMA_SHOW_FIELDS,
    RESPONSES_FIELDS,
    SETTINGS_FIELDS,
    SMALL_MAX_TOKENS,
    TINY,
    UNLOAD_FIELDS,
    Raw,
    bodies,
    nested,
    to_json,
)
from tests.api.fuzz_verdict import ANTHROPIC, OLLAMA, OPENAI, RESPONSES, answer_problem
from tests.conftest import DEMO

SECONDS_PER_REQUEST = 30        # a body answered later than this is a hang


# ---- the server and the probe -------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_asgi_server, stand_in_demo_dir, make_model, minilm_dir):
    # the bodies are under test, not the answers
    s = module_asgi_server({DEMO: stand_in_demo_dir, TINY: make_model("tiny-20", 20), MINILM: minilm_dir})
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
    "/v1/responses": (RESPONSES, {"model": DEMO, "input": "hi", "max_output_tokens": SMALL_MAX_TOKENS},
                      RESPONSES_FIELDS),
    "/api/chat": (OLLAMA, {"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                           "options": {"num_predict": SMALL_MAX_TOKENS}}, OLLAMA_CHAT_FIELDS),
    "/api/generate": (OLLAMA, {"model": DEMO, "prompt": "Once", "stream": False,
                               "options": {"num_predict": SMALL_MAX_TOKENS}}, OLLAMA_GENERATE_FIELDS),
    "/api/embed": (OLLAMA, {"model": MINILM, "input": "hello"}, OLLAMA_EMBED_FIELDS),
    "/api/embeddings": (OLLAMA, {"model": MINILM, "prompt": "hello"}, OLLAMA_EMBEDDINGS_FIELDS),
    "/api/show": (OLLAMA, {"model": DEMO}, OLLAMA_SHOW_FIELDS),
    "/api/requests/req_nope/cancel": (OPENAI, {}, {}),
}
EXAMPLES = {"/v1/chat/completions": 40, "/v1/completions": 20, "/v1/messages": 30, "/v1/messages/count_tokens": 15,
            "/v1/embeddings": 15, f"/admin/model/{TINY}/settings": 30, f"/api/models/{TINY}/load": 4,
            f"/api/models/{TINY}/unload": 4, "/api/rediscover": 3, "/api/enforcer/tick": 3,
            "/v1/responses": 30, "/api/chat": 30, "/api/generate": 25, "/api/embed": 10, "/api/embeddings": 8,
            "/api/show": 8, "/api/requests/req_nope/cancel": 3}
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
               f"/api/models/{TINY}/load": [], "/api/rediscover": [], "/api/enforcer/tick": [],
               "/api/requests/req_nope/cancel": []}
PARALLEL = 4   # generation routes take these bodies at once (batched); settings one by one (one SQLite row)
GENERATING = ("/v1/", "/api/chat", "/api/generate", "/api/embed")


def test_every_field_with_each_class_of_nasty_value(server):
    findings, sent, started = [], 0, time.monotonic()
    for path, (style, base, fields) in ROUTES.items():
        base = {**base, "max_tokens": 1} if "max_tokens" in base else base
        for field in GRID_FIELDS.get(path, sorted(set(base) | set(fields))):
            cases = {name: to_json({**base, field: value}).encode() for name, value in GRID.items()}
            with ThreadPoolExecutor(PARALLEL if path.startswith(GENERATING) else 1) as pool:
                def send(payload, path=path, style=style):     # this iteration's route, bound
                    return probe(server, path, payload, style, snapshot=False)
                problems = pool.map(send, cases.values())
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
    "2k objects in messages": b'{"model":"%s","max_tokens":1,"messages":[' % DEMO.encode()
    + to_json(nested(2000)).encode() + b"]}",
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
    field = {"/v1/completions": "prompt", "/v1/embeddings": "input", "/v1/responses": "input",
             "/api/generate": "prompt", "/api/embed": "input", "/api/embeddings": "prompt"}.get(path)
    if field:
        return {**base, field: huge}
    if "messages" in base:
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


# ---- ids in the path ---------------------------------------------------------------------------------

PATH_IDS = ["x", "resp_nope", "resp_" + "0" * 48, "..%2F..%2Fetc", "%00", "%C3%A9", "%ED%A0%80", "a" * 600,
            "resp_1;drop table pool_storedresponse"]


def test_stored_response_ids_in_the_path_get_a_404_in_the_envelope(server):
    findings = []
    for rid in PATH_IDS:
        for method, path in (("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                             ("GET", f"/v1/responses/{rid}/input_items")):
            r = server.fetch(method, path, headers=server.headers, timeout=SECONDS_PER_REQUEST)
            problem = answer_problem(OPENAI, r.status_code, r.headers.get("content-type", ""), r.content)
            if problem or r.status_code != 404:
                findings.append(Finding(f"{method} {path}", "", problem or f"status {r.status_code}"))
    assert server.get("/health").status_code == 200
    assert not findings, "\n".join(str(f) for f in findings)


REQUEST_QUERIES = [{"since": "x"}, {"since": "1e400"}, {"since": "-1"}, {"limit": "-1"}, {"limit": "9" * 30},
                   {"limit": "1.5"}, {"before": "%00"}, {"before": "req_nope"}, {"status": "abc"}, {"status": "9" * 30},
                   {"model": "a" * 5000}, {"key": "\u00e9"}]


def test_the_request_log_takes_any_query_with_a_200_or_a_4xx(server):
    findings = []
    for params in REQUEST_QUERIES:
        for path in ("/api/requests", "/api/requests/summary", "/api/requests/live"):
            r = server.fetch("GET", path, params=params, headers=server.headers, timeout=SECONDS_PER_REQUEST)
            problem = answer_problem(OPENAI, r.status_code, r.headers.get("content-type", ""), r.content)
            if problem:
                findings.append(Finding(f"GET {path}", str(params)[:200], problem))
    assert server.get("/health").status_code == 200
    assert not findings, "\n".join(str(f) for f in findings)
