"""Every architecture of the fixtures (pool/catalog/fixture_archs.py: llama-shaped, hybrid, sliding-window,
MoE, MLA, nested text_config), tiny random-weight models built with mlx-lm's own classes, served by one
real server and compared with raw mlx-lm greedy decoding on the same folder: the answers, the prompt
cache on a repeat and on follow-up turns (a system prompt longer than gemma3's 512-token window, so its
sliding layers wrap), four chats at once, the KV estimate against what mlx-lm's caches hold, the KV
limits each can take, structured output and a forced tool call."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from pool.catalog.fixture_archs import ARCHS

ANSWER_TOKENS = 10
SYSTEM = " ".join(["The harbour master keeps the tide tables, the ledger of ships and the lighthouse key."] * 36)
QUESTIONS = ["When does the evening tide turn?", "Which ship came in last night?", "How far is the lighthouse?"]
TOGETHER = ["Who keeps the ledger?", "What colour is the lighthouse?", "Is the harbour open?", "How deep is it?"]

# What each architecture's caches are (make_prompt_cache) and the KV limits mlx-lm lets them take:
# max_kv_size where every layer is a plain KVCache a rotating one can replace; kv_bits where every
# layer that keeps every token can be quantized and nothing else would be left unquantized by mistake.
CACHES = {
    "llama": ("every token", True, True), "qwen3": ("every token", True, True),
    "qwen3_moe": ("every token", True, True), "phi3": ("every token", True, True),
    "deepseek_v3": ("every token", True, False),      # MLA: one latent per token, no quantized kernel for it
    "gemma3_text": ("window", False, False), "gemma3": ("window", False, False), "gpt_oss": ("window", False, False),
    "qwen3_5": ("state", False, True), "lfm2": ("state", False, True), "falcon_h1": ("state", False, False),
}


def test_the_table_covers_every_fixture_architecture():
    assert set(CACHES) == set(ARCHS)


@pytest.fixture(scope="module")
def fixtures(make_model) -> dict:
    return {arch: make_model(f"arch-{arch}", None, arch=arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def server(module_server, fixtures):
    return module_server({f"arch-{arch}": folder for arch, folder in fixtures.items()})


class Raw:
    def __init__(self, folder):
        import mlx_lm

        self.model, self.tokenizer = mlx_lm.load(str(folder))

    def prompt(self, messages: list[dict]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def answer(self, messages: list[dict]) -> str:
        from mlx_lm import stream_generate

        return "".join(r.text for r in stream_generate(self.model, self.tokenizer, self.prompt(messages),
                                                       max_tokens=ANSWER_TOKENS))


def chat(server, model: str, messages: list[dict], **body) -> dict:
    r = server.post("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": ANSWER_TOKENS,
                                             "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_answers_and_the_prompt_cache_match_raw_mlx_lm(server, fixtures, arch):
    raw = Raw(fixtures[arch])
    model = f"arch-{arch}"
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    assert len(raw.prompt(first)) > 512      # past gemma3's window: its sliding layers have wrapped

    cold = chat(server, model, first)
    assert cold["choices"][0]["message"]["content"] == raw.answer(first) and cached(cold) == 0
    repeat = chat(server, model, first)
    assert repeat["choices"][0]["message"]["content"] == raw.answer(first)
    assert cached(repeat) == len(raw.prompt(first)) - 1      # all but the token the model reads for its logits

    messages, reply = list(first), cold
    for k, question in enumerate(QUESTIONS[1:], start=1):
        before = raw.prompt(messages)
        messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                     {"role": "user", "content": question}]
        reply = chat(server, model, messages)
        assert reply["choices"][0]["message"]["content"] == raw.answer(messages), f"turn {k + 1}"
        # at least the whole earlier prompt but its last token: what mlx_lm.server reuses on such a turn
        assert cached(reply) >= len(before) - 1, f"turn {k + 1}"

    chats = [[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}] for q in TOGETHER]
    with concurrent.futures.ThreadPoolExecutor(len(chats)) as pool:
        answers = list(pool.map(lambda m: chat(server, model, m)["choices"][0]["message"]["content"], chats))
    assert answers == [raw.answer(m) for m in chats]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_kv_estimate_is_within_a_tenth_of_what_the_caches_hold(fixtures, arch):
    import mlx.core as mx
    import mlx_lm

    from pool.engines.kv_layout import held_bytes, measure_layout
    from pool.policy.kv import kv_estimate

    model, _ = mlx_lm.load(str(fixtures[arch]))
    layout = measure_layout(model)
    kind, takes_max_kv_size, takes_kv_bits = CACHES[arch]
    assert any(kind in k for k in layout.summary()["kv_layer_kinds"])
    assert (layout.takes_max_kv_size, layout.takes_kv_bits) == (takes_max_kv_size, takes_kv_bits)
    assert layout.trimmable == (kind == "every token")
    for tokens in (1024, 8192):
        prompt = mx.array([(7 * i) % 1000 + 10 for i in range(tokens)])
        assert kv_estimate(layout, tokens=tokens, prefill_chunk=2048) == pytest.approx(
            held_bytes(model, prompt, 2048), rel=0.10), tokens


@pytest.mark.parametrize("arch", list(ARCHS))
def test_kv_limits_structured_output_and_a_forced_tool_call(server, arch):
    model = f"arch-{arch}"
    ask = [{"role": "user", "content": "Pick a number."}]
    _, takes_max_kv_size, takes_kv_bits = CACHES[arch]
    for field, value, takes in (("max_kv_size", 256, takes_max_kv_size), ("kv_bits", 8, takes_kv_bits)):
        r = server.post("/v1/chat/completions", {"model": model, "messages": ask, "max_tokens": 3, field: value})
        if takes:
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
            assert "not supported by this model" in r.json()["error"]["message"]

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    reply = chat(server, model, ask, max_tokens=40,
                 response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}})
    assert 0 <= json.loads(reply["choices"][0]["message"]["content"])["n"] <= 9

    tool = {"type": "function", "function": {"name": "pick", "parameters": schema}}
    reply = chat(server, model, ask, max_tokens=40, tools=[tool],
                 tool_choice={"type": "function", "function": {"name": "pick"}})
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "pick" and 0 <= json.loads(call["function"]["arguments"])["n"] <= 9


def test_a_hybrid_models_cache_shows_in_every_dialect_and_survives_an_unload(server, fixtures):
    """qwen3_5 (linear-attention state beside full attention): its repeat's cached tokens as each API
    words them, the snapshot's and /api/ps's KV figures, and its checkpoints read back from the disk
    tier after an unload."""
    raw, model = Raw(fixtures["qwen3_5"]), "arch-qwen3_5"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = len(raw.prompt(messages))
    chat(server, model, messages)

    anthropic = server.post("/v1/messages", {"model": model, "max_tokens": 4, "system": "Be brief.",
                                             "messages": messages[1:]}).json()["usage"]
    assert (anthropic["cache_read_input_tokens"], anthropic["input_tokens"]) == (prompt - 1, 1)
    ollama = server.post("/api/chat", {"model": model, "messages": messages, "stream": False,
                                       "options": {"num_predict": 4}}).json()
    assert (ollama["prompt_eval_count"], ollama["prompt_eval_cached_count"]) == (prompt, prompt - 1)
    responses = server.post("/v1/responses", {"model": model, "instructions": "Be brief.", "max_output_tokens": 4,
                                              "input": "Name a colour."}).json()["usage"]
    assert responses["input_tokens_details"]["cached_tokens"] == prompt - 1

    row = server.model(model)
    layout = row["kv_layout"]
    assert layout["kv_layer_kinds"] == ["3 x state", "1 x every token"] and layout["kv_fixed_bytes"] > 0
    assert layout["kv_bytes_at_context"] >= layout["kv_fixed_bytes"] + layout["kv_bytes_per_token"] * 4096
    ps = next(m for m in server.get("/api/ps").json()["models"] if m["name"] == f"{model}:latest")
    assert ps["size"] == row["measured_bytes"] + layout["kv_bytes_at_context"]

    assert server.post(f"/api/models/{model}/unload", {}).status_code == 200
    server.wait_for(lambda: server.model(model)["state"] == "unloaded")
    again = chat(server, model, messages)
    assert cached(again) == prompt - 1 and again["choices"][0]["message"]["content"] == raw.answer(messages)
    assert server.model(model)["prompt_cache_disk_hits"] >= 1
