"""A draft model through the server, set the documented ways: `manage.py draft` against the running
server and the settings API. The pair loads as one model (its measured bytes count both), a lone
request's trace shows the tokens proposed and accepted, /metrics counts them, the answer is the
plain one, a request naming a draft of its own (mlx_lm.server's fields) is served by the model's,
and an unload lets go of both."""

from tests.conftest import DEMO
from tests.pool.test_commands import manage

STAND_IN_DEMO = True       # the demo's name over a two-layer random llama: answers only compare with answers
DRAFT = "demo-draft"      # the served model's own folder again: a draft that always agrees
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


def test_a_draft_set_with_manage_py_serves_and_is_traced(start_server, stand_in_demo_dir):
    server = start_server({DRAFT: stand_in_demo_dir}, OMLX_API_KEY="sekret")
    plain = server.chat(DEMO, messages=QUESTION, max_tokens=24, temperature=0).json()
    alone_bytes = server.model(DEMO)["measured_bytes"]
    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200

    done = manage(server, "draft", DEMO, DRAFT)
    assert done.returncode == 0, done.stderr
    assert f"{DEMO}: draft {DRAFT} in the database" in done.stdout
    answer = server.chat(DEMO, messages=QUESTION, max_tokens=24, temperature=0)
    assert answer.json()["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]

    model = server.model(DEMO)
    assert model["draft"]["model"] == DRAFT and model["measured_bytes"] == alone_bytes + model["draft"]["bytes"]
    assert server.model(DRAFT)["state"] == "unloaded"          # read inside its model's engine, not as a model
    trace = server.get(f"/api/requests/{answer.headers['x-omlx-request-id']}").json()
    assert trace["draft_proposed"] > 0 and trace["draft_accepted"] == trace["draft_proposed"]
    metrics = server.get("/metrics").text
    assert f'draft_tokens_total{{model="{DEMO}",outcome="accepted"}} {float(trace["draft_accepted"])}' in metrics
    # mlx_lm.server's request fields name a draft per request: here the model's setting decides
    theirs = server.chat(DEMO, messages=QUESTION, max_tokens=24, temperature=0, draft_model="other", num_draft_tokens=5)
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["choices"][0]["message"] == answer.json()["choices"][0]["message"]
    assert server.model(DEMO)["draft"]["model"] == DRAFT

    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200
    assert server.model(DEMO)["draft"] is None
    removed = server.post(f"/admin/model/{DEMO}/settings", {"draft_model": ""})
    assert removed.status_code == 200 and removed.json()["draft_model"] == ""
    server.chat(DEMO, messages=QUESTION, max_tokens=4)
    assert server.model(DEMO)["draft"] is None and server.model(DEMO)["measured_bytes"] == alone_bytes


def test_a_model_cannot_be_its_own_draft(start_server):
    server = start_server(OMLX_API_KEY="sekret")
    refused = server.post(f"/admin/model/{DEMO}/settings", {"draft_model": DEMO})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "draft_model", refused.text
    done = manage(server, "draft", DEMO, DEMO)
    assert done.returncode != 0 and "its own draft" in done.stderr


def test_with_a_draft_constraints_logprobs_and_stops_answer_as_without(start_server, stand_in_demo_dir):
    """Structured output (a grammar: never drafted), logprobs and a stop string (a word from the
    middle of the answer, so that it stops it), each as the same model without a draft answers."""
    plain = start_server()
    drafted = start_server({DRAFT: stand_in_demo_dir})
    assert drafted.post(f"/admin/model/{DEMO}/settings", {"draft_model": DRAFT}).status_code == 200
    schema = {"type": "object", "properties": {"sea": {"type": "string"}}, "required": ["sea"]}
    bodies = [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
        {"logprobs": True, "top_logprobs": 2},
    ]
    whole = plain.chat(DEMO, messages=QUESTION, max_tokens=20, temperature=0).json()["choices"][0]["message"]["content"]
    stop = whole[len(whole) // 2:][:4]
    bodies.append({"stop": [stop]})
    for body in bodies:
        a = plain.chat(DEMO, messages=QUESTION, max_tokens=20, temperature=0, **body)
        b = drafted.chat(DEMO, messages=QUESTION, max_tokens=20, temperature=0, **body)
        assert a.status_code == b.status_code == 200, b.text
        assert b.json()["choices"][0]["message"] == a.json()["choices"][0]["message"], body
        if "stop" in body:
            choice = b.json()["choices"][0]
            assert choice["finish_reason"] == "stop" and stop not in choice["message"]["content"]
        if "logprobs" in body:
            tokens = [(t["token"], round(t["logprob"], 3)) for t in b.json()["choices"][0]["logprobs"]["content"]]
            assert tokens == [(t["token"], round(t["logprob"], 3))
                              for t in a.json()["choices"][0]["logprobs"]["content"]]
    grammar, with_logprobs = drafted.get("/api/requests").json()["data"][-1:-3:-1]     # newest first
    assert grammar["draft_proposed"] == 0 and with_logprobs["draft_proposed"] > 0     # a grammar never drafts
    assert drafted.model(DEMO)["draft"]["model"] == DRAFT
