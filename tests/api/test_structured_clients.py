"""Structured output as the popular clients ask for it, against a real server with the demo model:
LangChain's `ChatOpenAI.with_structured_output` (its default method, `json_schema` and
`function_calling`) and instructor (`Mode.TOOLS`, `Mode.JSON_SCHEMA`). Their schemas come from a
pydantic model and bound nothing (no `additionalProperties`, no integer range): issue 24 saw the
demo model add keys and digits until max_tokens. Each must come back a valid object, well within
60 tokens."""

from __future__ import annotations

import instructor
import pytest
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel

from tests.conftest import DEMO

ROOM = 200          # max_tokens: room enough that a runaway shows as more than ENDS_WITHIN
ENDS_WITHIN = 60
QUESTION = [{"role": "user", "content": "Tell me about Paris."}]


class City(BaseModel):
    name: str
    population: int


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir})


@pytest.fixture
def openai_client(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.mark.parametrize("method", [None, "json_schema", "function_calling"])
def test_langchain_with_structured_output_ends_with_a_city(server, openai_client, method):
    llm = ChatOpenAI(model=DEMO, base_url=server.url + "/v1", api_key="none", temperature=0, max_tokens=ROOM,
                     max_retries=0, root_client=openai_client, client=openai_client.chat.completions)
    kw = {} if method is None else {"method": method}
    out = llm.with_structured_output(City, include_raw=True, **kw).invoke(QUESTION)
    assert out["parsing_error"] is None and isinstance(out["parsed"], City), out["raw"]
    used = out["raw"].response_metadata["token_usage"]["completion_tokens"]
    assert used <= ENDS_WITHIN, out["raw"]


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_ends_with_a_city(openai_client, mode):
    client = instructor.from_openai(openai_client, mode=mode)
    city, completion = client.chat.completions.create_with_completion(
        model=DEMO, messages=QUESTION, response_model=City, max_retries=1, temperature=0, max_tokens=ROOM)
    assert isinstance(city, City) and city.name
    assert completion.usage.completion_tokens <= ENDS_WITHIN, completion
