"""Per-request KV limits on the demo model: the lanes build the caches asked for, and through a real
server the fields are checked, batch or decode apart, and run side by side."""

from __future__ import annotations

import threading

import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache
from mlx_lm.sample_utils import make_sampler

from pool.engines.lanes import BatchLane, SoloLane
from pool.engines.loading import load_weights
from pool.policy.kv import KVConfig
from tests.conftest import as_the_pool_loads

DEMO = "smollm2-135m-instruct"
STAND_IN_DEMO = True     # the servers serve the demo's two-layer stand-in: their answers compare with their own


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    model, tokenizer, _ = load_weights(demo_model_dir, dequantize=as_the_pool_loads(demo_model_dir).dequantize)
    return model, tokenizer, [[t] for t in sorted(tokenizer.eos_token_ids)]


def run(lane, tokens, max_tokens=8):
    lane.insert(tokens, cache=None, all_tokens=[], max_tokens=max_tokens, sampler=make_sampler(temp=0))
    out, caches = [], []
    while not lane.empty:
        for step in lane.step():
            out.append(step.token)
            if step.finish_reason is not None:
                caches = step.prompt_cache
        caches = caches or getattr(lane, "_cache", [])
    return out, caches


def test_each_lane_builds_the_cache_it_was_asked_for(demo):
    model, tokenizer, stop = demo
    prompt = tokenizer.encode("The capital of France is a city called") * 20   # ~180 tokens
    plain, plain_cache = run(BatchLane(model, KVConfig(), stop), prompt)
    assert {type(c) for c in plain_cache} == {KVCache}

    rotating, cache = run(BatchLane(model, KVConfig(max_kv_size=64), stop), prompt)
    assert {type(c) for c in cache} == {RotatingKVCache}
    assert all(c.max_size == 64 for c in cache)
    assert sum(c.nbytes for c in cache) < sum(c.nbytes for c in plain_cache) / 2

    wide, _ = run(BatchLane(model, KVConfig(max_kv_size=4096), stop), prompt)
    assert wide == plain                                        # a window the chat fits in changes nothing

    lane = SoloLane(model, KVConfig(kv_bits=8), stop)
    quantized, cache = run(lane, prompt)
    assert len(quantized) == len(plain) and {type(c) for c in cache} == {QuantizedKVCache}
    assert all(c.bits == 8 for c in cache)


def chat(server, **fields):
    return server.post("/v1/chat/completions", {"model": DEMO, "messages": [{"role": "user", "content": "Hello"}],
                                                "max_tokens": 6, **fields})


BAD_FIELDS = [
    ({"kv_bits": 3}, "kv_bits"),
    ({"kv_bits": "8"}, "kv_bits"),
    ({"kv_group_size": 48, "kv_bits": 4}, "kv_group_size"),
    ({"max_kv_size": 8}, "max_kv_size"),
    ({"quantized_kv_start": -5}, "quantized_kv_start"),
    ({"max_kv_size": 1024, "kv_bits": 8}, "kv_bits"),
    ({"cache_prompt": "no"}, "cache_prompt"),
]


def test_bad_kv_fields_are_400s_naming_the_field(start_server):
    server = start_server()
    for fields, param in BAD_FIELDS:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                           ("/v1/completions", {"prompt": "x"})):
            r = server.post(path, {"model": DEMO, **body, **fields})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (fields, r.text)


def test_different_kv_configs_run_side_by_side_and_model_defaults_apply(start_server):
    server = start_server()
    results = {}

    def ask(name, **fields):
        results[name] = chat(server, max_tokens=24, **fields)
    configs = {"plain": {}, "rotating": {"max_kv_size": 256}, "q8": {"kv_bits": 8},
               "q4": {"kv_bits": 4, "kv_group_size": 32}}
    threads = [threading.Thread(target=ask, args=(name,), kwargs=fields) for name, fields in configs.items()]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert {name: r.status_code for name, r in results.items()} == {name: 200 for name in configs}
    text = {name: r.json()["choices"][0]["message"]["content"] for name, r in results.items()}
    assert text["rotating"] == text["plain"]                     # the window holds the whole chat
    assert all(text.values())

    r = server.post(f"/admin/model/{DEMO}/settings", {"kv_bits": 8, "max_kv_size": 512})
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_bits"
    r = server.post(f"/admin/model/{DEMO}/settings", {"kv_bits": 8, "quantized_kv_start": 0})
    assert r.status_code == 200 and r.json()["kv_bits"] == 8
    assert chat(server).status_code == 200                       # decodes with the model's 8-bit default
    r = chat(server, max_kv_size=256)                            # the request's own, with the model's kv_bits
    assert r.status_code == 400 and "model's default" in r.json()["error"]["message"]
