"""The openai-agents SDK's default model provider (OpenAIProvider: the Responses API) against a real
server with the demo model: an Agent with one function tool, run by Runner.run, calls the tool, gets
its output back to the model as a function_call_output item, and finishes; and the same streamed
(Runner.run_streamed reads the Responses event stream)."""

import pytest
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.items import ToolCallItem, ToolCallOutputItem
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

from tests.conftest import DEMO

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
    """
    CALLS.append(city)
    return f"It is 21 degrees and sunny in {city}."


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir})


@pytest.fixture
async def run_config(server):
    """The default model provider (the Responses API), pointed at the server. A client of its own per
    test, closed after it: the SDK's shared HTTP client would outlive each test's event loop, and an
    unclosed one leaves its sockets to the garbage collector."""
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    yield RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True), tracing_disabled=True)
    await client.close()


def agent(**kw) -> Agent:
    return Agent(name="Weather", instructions="You answer questions about the weather. Use the tool.",
                 tools=[get_weather], model=DEMO,
                 model_settings=ModelSettings(tool_choice="required", max_tokens=60, temperature=0), **kw)


async def test_runner_calls_the_tool_and_stops_on_its_output(run_config):
    CALLS.clear()
    result = await Runner.run(agent(tool_use_behavior="stop_on_first_tool"), "What is the weather in Paris?",
                              run_config=run_config, max_turns=2)
    assert len(CALLS) == 1 and result.final_output.startswith("It is 21 degrees and sunny")
    assert any(isinstance(item, ToolCallItem) for item in result.new_items)


async def test_runner_round_trip_to_a_final_answer(run_config):
    """After the tool, the SDK sends the call and its output back (tool_choice reset to auto) and the
    model answers in text."""
    CALLS.clear()
    result = await Runner.run(agent(), "What is the weather in Paris?", run_config=run_config, max_turns=4)
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds and CALLS
    assert isinstance(result.final_output, str) and result.final_output
    assert result.context_wrapper.usage.requests >= 2 and result.context_wrapper.usage.input_tokens > 0


async def test_streamed_run(run_config):
    CALLS.clear()
    result = Runner.run_streamed(agent(tool_use_behavior="stop_on_first_tool"), "Weather in Rome?",
                                 run_config=run_config, max_turns=2)
    kinds = [event.type async for event in result.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert len(CALLS) == 1 and result.final_output.startswith("It is 21 degrees")
