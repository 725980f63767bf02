"""Adapters over the demo model through the server: listed with their base in every dialect's list,
named through the official openai and ollama clients, each answering as mlx-lm's own
load(adapter_path=...) does (over the demo's two-layer stand-in, which raw mlx-lm reads in a
twentieth of the time), side by side, sharing the base's weights and never each other's KV."""

import asyncio

import pytest

from tests.conftest import DEMO

PIRATE, POET = f"{DEMO}:pirate", f"{DEMO}:poet"
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


def mlx_lm_answer(base, adapter, tokens: int = 12) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(str(base), adapter_path=str(adapter) if adapter else None)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=tokens)


def pirate_and_poet(make_adapter, base, prefix: str = "") -> dict:
    """The two adapters over `base`, by the names they are served under (built once per run as prefix + name)."""
    return {name: make_adapter(prefix + name, base, seed=seed) for name, seed in (("pirate", 1), ("poet", 2))}


@pytest.fixture
def adapters(make_adapter, demo_model_dir):
    return pirate_and_poet(make_adapter, demo_model_dir)


@pytest.fixture
def stand_in(make_adapter, stand_in_demo_dir) -> dict:
    """The demo's name over its two-layer stand-in, and adapters over that: raw mlx-lm reads it 20x faster."""
    return {DEMO: stand_in_demo_dir, **pirate_and_poet(make_adapter, stand_in_demo_dir, "stand-in-")}


def test_adapters_are_listed_with_their_base(start_server, adapters):
    server = start_server(adapters)
    models = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert models[PIRATE]["parent"] == DEMO and models[POET]["parent"] == DEMO
    assert "parent" not in models[DEMO]
    assert models[PIRATE]["context_length"] == models[DEMO]["context_length"]
    tags = {m["name"]: m for m in server.get("/api/tags").json()["models"]}
    assert tags[PIRATE]["details"]["parent_model"] == f"{DEMO}:latest"
    assert tags[PIRATE]["digest"] != tags[POET]["digest"] != tags[f"{DEMO}:latest"]["digest"]
    shown = server.post("/api/show", {"model": PIRATE}).json()
    assert shown["details"]["parent_model"] == f"{DEMO}:latest" and "completion" in shown["capabilities"]


def test_each_adapter_answers_as_mlx_lm_loads_it_through_the_clients(start_server, stand_in):
    import ollama

    server = start_server(stand_in)
    base = stand_in[DEMO]
    client = server.openai()
    answers = {}
    for name in (DEMO, PIRATE, POET):
        reply = client.chat.completions.create(model=name, messages=QUESTION, max_tokens=12, temperature=0)
        answers[name] = reply.choices[0].message.content
    assert answers[DEMO] == mlx_lm_answer(base, None)
    assert answers[PIRATE] == mlx_lm_answer(base, stand_in["pirate"])
    assert answers[POET] == mlx_lm_answer(base, stand_in["poet"])
    assert len(set(answers.values())) == 3          # the adapters change the answer: a mix-up would show
    native = ollama.Client(host=server.url).chat(model=PIRATE, messages=QUESTION,
                                                 options={"num_predict": 12, "temperature": 0})
    assert native.message.content == answers[PIRATE]

    pool = {m["id"]: m for m in server.pool()["models"]}
    assert pool[PIRATE]["state"] == pool[POET]["state"] == pool[DEMO]["state"] == "loaded"
    # the adapters hold their own arrays only: the base's weights are shared, not copied
    assert pool[PIRATE]["measured_bytes"] < pool[DEMO]["measured_bytes"] / 20


def test_adapters_run_side_by_side_and_never_share_a_prompt_cache(start_server, adapters):
    server = start_server(adapters)

    async def ask_all():
        import openai

        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x")
        calls = [client.chat.completions.create(model=name, messages=QUESTION, max_tokens=12, temperature=0)
                 for name in (PIRATE, POET, PIRATE, POET)]
        return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

    together = asyncio.run(ask_all())
    assert together[0] == together[2] != together[1] == together[3]
    alone = {name: server.chat(name, messages=QUESTION, max_tokens=12, temperature=0).json() for name in (PIRATE, POET)}
    assert [alone[PIRATE]["choices"][0]["message"]["content"], alone[POET]["choices"][0]["message"]["content"]] == \
        together[:2]
    # n > 1: the prompt read once with the adapter, each choice decoding with it
    twice = server.chat(PIRATE, messages=QUESTION, max_tokens=12, temperature=0, n=2, cache_prompt=False).json()
    assert [c["message"]["content"] for c in twice["choices"]] == together[:1] * 2
    # the same conversation on another adapter (or the base) starts from nothing: its KV differs
    follow = QUESTION + [{"role": "assistant", "content": together[0]}, {"role": "user", "content": "And then?"}]
    first = server.chat(PIRATE, messages=follow, max_tokens=4, temperature=0).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] > 0         # its own earlier turn
    other = server.chat(POET, messages=follow, max_tokens=4, temperature=0).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < first["usage"]["prompt_tokens_details"][
        "cached_tokens"]
    base = server.chat(DEMO, messages=follow, max_tokens=4, temperature=0).json()
    assert base["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
