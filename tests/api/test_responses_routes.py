"""OpenAI's Responses API on a real server (Daphne) with the demo model and the official `openai`
client: a text answer, a function-tool round trip, text.format json_schema, the stream's events in
order with their sequence numbers, previous_response_id across three turns with the prompt cache
warm, GET / DELETE of a stored response, and the errors in OpenAI's envelope. The parsing on its own
is in test_responses_parse.py; the Agents SDK in test_responses_agents.py."""

import json

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEMO

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir})


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.openai()


def test_text_answer(client):
    reply = client.responses.create(model=DEMO, input="What is the capital of France?", temperature=0,
                                    max_output_tokens=24, metadata={"case": "text"})
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.status in ("completed", "incomplete")
    assert reply.model == DEMO and reply.metadata == {"case": "text"} and reply.store is True
    assert [item.type for item in reply.output] == ["message"]
    message = reply.output[0]
    assert message.role == "assistant" and message.content[0].type == "output_text"
    assert "Paris" in reply.output_text
    usage = reply.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0


def test_max_output_tokens_is_incomplete(client):
    reply = client.responses.create(model=DEMO, input="Tell me a long story about a dragon.", max_output_tokens=3)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3


def test_instructions_and_message_items(client):
    reply = client.responses.create(
        model=DEMO, instructions="Answer with one word.", temperature=0, max_output_tokens=10,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}])
    assert reply.instructions == "Answer with one word." and "Paris" in reply.output_text


def test_function_tool_round_trip(client):
    first = client.responses.create(model=DEMO, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
                                    temperature=0, store=False)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert first.tools[0].name == "get_weather" and first.parallel_tool_calls is False

    history = [{"role": "user", "content": "What is the weather in Paris?"},
               calls[0].model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"celsius": 21})}]
    answer = client.responses.create(model=DEMO, input=history, tools=[WEATHER], max_output_tokens=30,
                                     temperature=0, store=False)
    assert answer.output and answer.output[0].type in ("message", "function_call")


def test_tool_choice_named(client):
    reply = client.responses.create(model=DEMO, input="Weather in Rome?", tools=[WEATHER], max_output_tokens=60,
                                    tool_choice={"type": "function", "name": "get_weather"}, store=False)
    assert [item.type for item in reply.output] == ["function_call"]


def test_text_format_json_schema(client):
    reply = client.responses.create(model=DEMO, input="Name a city in Italy as JSON.", max_output_tokens=60,
                                    text={"format": {"type": "json_schema", "name": "city", "schema": CITY,
                                                     "strict": True}}, store=False)
    jsonschema.validate(json.loads(reply.output_text), CITY)
    assert reply.text.format.type == "json_schema"


def test_text_format_json_object(client):
    reply = client.responses.create(model=DEMO, input="Give me a JSON object about Paris.", max_output_tokens=40,
                                    text={"format": {"type": "json_object"}}, store=False)
    if reply.status == "completed":
        assert isinstance(json.loads(reply.output_text), dict)


EXPECTED_TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added", "response.output_text.delta"]
EXPECTED_TAIL = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                 "response.completed"]


def test_stream_events_in_order(client):
    with client.responses.stream(model=DEMO, input="What is the capital of France?", max_output_tokens=30,
                                 temperature=0) as stream:
        events = list(stream)
    final = events[-1].response
    kinds = [e.type for e in events]
    assert kinds[:5] == EXPECTED_TEXT_EVENTS
    assert set(kinds[5:-4]) <= {"response.output_text.delta"}
    assert kinds[-4:] == EXPECTED_TAIL[:3] + [kinds[-1]] and kinds[-1] in ("response.completed",
                                                                            "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-4].text == final.output_text and "Paris" in deltas
    assert events[0].response.status == "in_progress" and final.usage.output_tokens > 0
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_stream_function_call_events(client):
    with client.responses.stream(model=DEMO, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=60, temperature=0, store=False) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    call = kinds.index("response.function_call_arguments.delta")
    assert kinds[call - 1] == "response.output_item.added" and kinds[call + 1:call + 3] == [
        "response.function_call_arguments.done", "response.output_item.done"]
    done = events[call + 2].item
    assert done.type == "function_call" and done.status == "completed"
    assert json.loads(events[call + 1].arguments) == json.loads(done.arguments)
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_previous_response_id_three_turns(client):
    turns = ["My name is Ada. Remember it.", "I live in Paris.", "What is my name?"]
    previous, cached, inputs = None, [], []
    for text in turns:
        reply = client.responses.create(model=DEMO, input=text, previous_response_id=previous, max_output_tokens=20,
                                        instructions="You are a helpful assistant.", temperature=0)
        assert reply.previous_response_id == previous
        previous = reply.id
        cached.append(reply.usage.input_tokens_details.cached_tokens)
        inputs.append(reply.usage.input_tokens)
    assert inputs[0] < inputs[1] < inputs[2]                     # each turn carries the ones before
    assert cached[0] < cached[1] < cached[2], cached               # and finds them in the prompt cache
    assert cached[1] >= inputs[0] - 1 and cached[2] >= inputs[1] - 1
    items = client.responses.input_items.list(reply.id, order="asc").data     # the whole conversation
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2 + [
        ("message", "user")]
    assert items[0].content[0].text == turns[0] and items[-1].content[0].text == turns[2]


def test_stream_then_continue_at_once(client):
    """The stored response is written in the background: the next turn, sent the moment the stream
    ends, still finds it."""
    with client.responses.stream(model=DEMO, input="Say hello.", max_output_tokens=8) as stream:
        first = list(stream)[-1].response            # response.completed, or .incomplete after 8 tokens
    reply = client.responses.create(model=DEMO, input="Again.", previous_response_id=first.id, max_output_tokens=8)
    assert reply.usage.input_tokens > first.usage.input_tokens


def test_get_and_delete(client):
    reply = client.responses.create(model=DEMO, input="Say hi.", max_output_tokens=5)
    got = client.responses.retrieve(reply.id)
    assert got.id == reply.id and got.output_text == reply.output_text and got.usage == reply.usage
    items = client.responses.input_items.list(reply.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "Say hi."
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)


def test_a_response_still_streaming_is_in_progress(client):
    with client.responses.stream(model=DEMO, input="Count to fifty.", max_output_tokens=200) as stream:
        created = next(iter(stream)).response                # response.created
        during = client.responses.retrieve(created.id)
        final = list(stream)[-1].response
    assert during.status == "in_progress" and during.output == []
    assert client.responses.retrieve(created.id).status == final.status != "in_progress"


def test_store_false_is_not_kept(client):
    reply = client.responses.create(model=DEMO, input="Say hi.", max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_unknown_previous_response_id_is_a_404(server):
    answer = httpx.post(server.url + "/v1/responses", json={"model": DEMO, "input": "hi",
                                                            "previous_response_id": "resp_nope"})
    assert answer.status_code == 404
    assert answer.json() == {"error": {"message": "Previous response with id 'resp_nope' not found.",
                                       "type": "invalid_request_error", "param": "previous_response_id",
                                       "code": "previous_response_not_found"}}


@pytest.mark.parametrize("body, param", [
    ({"input": "hi"}, "model"),
    ({"model": DEMO}, "input"),
    ({"model": DEMO, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url"),
    ({"model": DEMO, "input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
    ({"model": DEMO, "input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"model": DEMO, "input": "hi", "background": True}, "background"),
    ({"model": DEMO, "input": "hi", "temperature": 3}, "temperature"),
])
def test_bad_bodies_are_400s_naming_the_field(server, body, param):
    answer = httpx.post(server.url + "/v1/responses", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_unknown_model_is_openai_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="no-such-model", input="hi")
    assert caught.value.body["code"] == "model_not_found"
