"""The Responses API's limits and the SDK's other calls, through HTTP on the site served in this
process with the demo model: what the store keeps (normal items only; OMLX_RESPONSES_BYTES,
OMLX_RESPONSES_CHAIN_BYTES, OMLX_MAX_MESSAGES over a chain), `truncation: "auto"` in a bounded number
of tokenisations, wrong types named as 400s, the context error naming `input`, the answer that the
server's own limit ended, `retrieve(stream=True)` and `compact`. A failing store is in
test_responses_store.py."""

import json

import pytest

import pool.serving.completion as completion_module
from pool.api.responses import routes
from pool.errors import ContextLengthExceeded
from tests.conftest import DEMO

MEGABYTE = 1_000_000
PER_RESPONSE, PER_CHAIN, MAX_ITEMS = 12_000, 20_000, 6


@pytest.fixture(scope="module")
def server(module_asgi_server, stand_in_demo_dir):
    return module_asgi_server({DEMO: stand_in_demo_dir}, OMLX_RESPONSES_BYTES=PER_RESPONSE,
                              OMLX_RESPONSES_CHAIN_BYTES=PER_CHAIN, OMLX_MAX_MESSAGES=MAX_ITEMS)


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def create(server, **body):
    return server.post("/v1/responses", {"model": DEMO, "max_output_tokens": 2, "temperature": 0, **body})


def error(answer, status: int = 400) -> dict:
    assert answer.status_code == status, answer.text
    return answer.json()["error"]


# ---- what the store keeps (D3) ------------------------------------------------------------------

def test_reasoning_items_and_unknown_fields_are_not_stored_nor_carried(server):
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "r" * MEGABYTE}
    first = create(server, input=[reasoning, {"role": "user", "content": "Say hi.", "junk": "j" * MEGABYTE}]).json()
    previous, sizes = first["id"], []
    for _ in range(2):                                   # 118-byte continuations
        reply = create(server, input="Again.", previous_response_id=previous).json()
        previous = reply["id"]
        items = server.get(f"/v1/responses/{previous}/input_items", params={"order": "asc", "limit": 100}).json()
        sizes.append(len(json.dumps(items)))
    assert [i["type"] for i in items["data"]][:1] == ["message"] and "junk" not in items["data"][0]
    assert items["data"][0]["content"] == [{"type": "input_text", "text": "Say hi."}]
    assert max(sizes) < 5_000, sizes


def test_a_response_over_its_cap_is_refused_before_generating(server):
    answer = create(server, input="word " * (PER_RESPONSE // 4))
    assert error(answer) | {"message": ""} == {"message": "", "type": "invalid_request_error", "param": "input",
                                               "code": "response_too_large"}
    assert "OMLX_RESPONSES_BYTES" in answer.json()["error"]["message"]


def test_a_conversation_over_its_cap_is_refused_when_continued(server):
    text = "=" * (PER_CHAIN // 3)    # a third of the chain's cap a turn, in ~100 tokens (BPE merges the run)
    previous = None
    for _ in range(2):
        reply = create(server, input=text, previous_response_id=previous)
        assert reply.status_code == 200, reply.text
        previous = reply.json()["id"]
    refused = error(create(server, input=text, previous_response_id=previous))
    assert refused["param"] == "previous_response_id" and refused["code"] == "conversation_too_large"


def test_a_chain_longer_than_max_messages_is_refused_like_a_long_input(server):
    turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}] * 2
    first = create(server, input=[*turns, {"role": "user", "content": "Bye."}])      # 5 items, and 1 answer
    assert first.status_code == 200, first.text
    refused = error(create(server, input="Again.", previous_response_id=first.json()["id"]))
    assert refused["param"] == "input" and "OMLX_MAX_MESSAGES" in refused["message"]
    assert error(create(server, input=[*turns] * 2))["param"] == "input"             # as a long input is


# ---- wrong types, and the context error's field (D8, C5) ----------------------------------------

@pytest.mark.parametrize("item, param", [
    ({"role": {"a": 1}, "content": "Hi"}, "input[0].role"),
    ({"role": ["user"], "content": "Hi"}, "input[0].role"),
    ({"type": {"a": 1}, "role": "user", "content": "Hi"}, "input[0].type"),
    ({"type": ["message"], "role": "user", "content": "Hi"}, "input[0].type"),
    ({"role": "user", "content": [{"type": {"a": 1}, "text": "Hi"}]}, "input[0].content[0]"),
    ({"type": "compaction", "encrypted_content": "made elsewhere"}, "input[0].encrypted_content"),
])
def test_a_wrong_type_in_an_item_is_a_400_naming_it(server, item, param):
    refused = error(create(server, input=[item]))
    assert refused["type"] == "invalid_request_error" and refused["param"] == param


def test_the_context_error_names_input(server):
    refused = error(create(server, input="hello " * 9000, store=False))
    assert refused["code"] == "context_length_exceeded" and refused["param"] == "input"
    assert "input" in refused["message"] and "messages" not in refused["message"]


# ---- the server's own output limit (C3) ---------------------------------------------------------

def test_an_answer_the_servers_limit_ended_says_so(server, client):
    assert server.post(f"/admin/model/{DEMO}/settings", {"max_tokens": 4}).status_code == 200
    try:
        reply = client.responses.create(model=DEMO, input="Tell me a long story about a dragon.", store=False)
    finally:
        server.post(f"/admin/model/{DEMO}/settings", {"max_tokens": None})
    assert reply.status == "incomplete" and reply.max_output_tokens is None      # as the request sent it
    details = reply.incomplete_details
    assert details.reason == "max_output_tokens" and reply.usage.output_tokens == 4
    assert details.model_extra == {"limit": "server_default", "max_output_tokens": 4}


# ---- retrieve(stream=True) and compact (C5) ------------------------------------------------------

def test_retrieve_with_stream_replays_the_events(client):
    reply = client.responses.create(model=DEMO, input="What is the capital of France?", max_output_tokens=12,
                                    temperature=0)
    events = list(client.responses.retrieve(reply.id, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if reply.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == reply.output_text
    assert events[-1].response.model_dump() == reply.model_dump()
    later = list(client.responses.retrieve(reply.id, stream=True, starting_after=2))
    assert [e.sequence_number for e in later] == list(range(3, len(events)))


def test_compact_keeps_the_user_messages_and_the_latest_answer(client):
    first = client.responses.create(model=DEMO, input="My name is Ada.", max_output_tokens=8, temperature=0)
    compacted = client.responses.compact(model=DEMO, previous_response_id=first.id, input="And I live in Paris.")
    assert compacted.object == "response.compaction" and compacted.usage.total_tokens == 0
    assert [(i.type, getattr(i, "role", None)) for i in compacted.output] == [
        ("message", "user"), ("message", "user"), ("compaction", None)]
    assert compacted.output[0].content[0].text == "My name is Ada."
    again = client.responses.create(model=DEMO, max_output_tokens=4, store=False,
                                    input=[*[i.model_dump(exclude_none=True, warnings=False) for i in compacted.output],
                                           {"role": "user", "content": "What is my name?"}])
    assert again.status in ("completed", "incomplete")
    assert again.usage.input_tokens > first.usage.input_tokens      # the compacted answer was read


# ---- truncation: "auto" (D4) --------------------------------------------------------------------

def test_truncation_of_2048_items_takes_few_tokenisations(start_asgi_server, demo_model_dir, tmp_path, monkeypatch):
    """The demo model with a context of 1,024 tokens (its config says so), so the prompt that fits is
    read quickly on a CPU; the 2,048 items are about 14,000 tokens, and short enough to be tokenised."""
    small = tmp_path / "small-context"
    small.mkdir()
    for path in demo_model_dir.iterdir():
        if path.name != "config.json":
            (small / path.name).symlink_to(path)
    config = json.loads((demo_model_dir / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    server = start_asgi_server({DEMO: small}, demo=False)
    calls = []
    prompt = completion_module._prompt

    async def counted(*args, **kw):
        calls.append(1)
        if len(calls) > 50:                      # one per dropped turn would take minutes: fail at once
            raise RuntimeError("tokenised more than 50 times")
        return await prompt(*args, **kw)

    monkeypatch.setattr(completion_module, "_prompt", counted)
    items = [{"role": ("user", "assistant")[i % 2], "content": f"n{i}"} for i in range(2048)]
    assert sum(len(i["content"]) for i in items) < 16 * 1024            # tokenised, not refused by its size
    reply = server.post("/v1/responses", {"model": DEMO, "input": items, "truncation": "auto", "store": False,
                                          "max_output_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert len(calls) <= 2 * 12 + 2, len(calls)
    assert 900 < reply.json()["usage"]["input_tokens"] < 1024


@pytest.mark.parametrize("fits", [1, 2, 3, 7, 40, 99, 100])
async def test_truncation_finds_the_tail_dropping_one_turn_at_a_time_would(monkeypatch, fits):
    """Bisection over the turns' boundaries gives the conversation the one-at-a-time loop gave: the
    longest tail (calls kept with their outputs) of at most `fits` items."""
    items = [{"type": ("message", "function_call", "function_call_output")[i % 3], "id": str(i)} for i in range(100)]
    tried = []

    class Opened:
        async def aclose(self):
            pass

    async def attempt(req, tail):
        tried.append(len(tail))
        if len(tail) > fits:
            raise ContextLengthExceeded(part="prompt", context=10, prompt_param="messages", prompt_tokens=11)
        return Opened()

    monkeypatch.setattr(routes, "_try", attempt)
    req = routes.ResponsesRequest(model=DEMO, input=[], truncation="auto")
    _, kept = await routes._open(req, items)
    expected = items
    while len(expected) > fits:                  # the loop it replaces
        expected = expected[1:]
        while len(expected) > 1 and expected[0]["type"] != "message":
            expected = expected[1:]
    assert kept == expected and len(tried) <= 10
