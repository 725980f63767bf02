"""Every architecture of the fixtures (pool/catalog/fixture_archs.py) through omlx-site and
mlx_lm.server on the same random-weight folder, against raw mlx-lm greedy decoding:

- answers: cold, a plain repeat, two follow-up turns and four chats at once, each equal to raw
  mlx-lm's `stream_generate` on the same prompt tokens;
- prompt tokens served from the cache (`cached_tokens`) on the repeat and on each follow-up turn,
  ours beside mlx_lm.server's;
- the KV estimate (what the prefill guard, the traces and /api/ps use) against the bytes mlx-lm's
  caches hold after a prompt of 1K and 8K tokens is read and one token decoded.

    .venv/bin/python benchmarks/architectures.py [--archs qwen3_5,gemma3] [--size-mb N] [--no-server]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from pathlib import Path

from _models import CACHE, demo_model
from _servers import start_mlx_lm, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

SYSTEM = ("You are the harbour master's assistant. You answer questions about ships, tides and the old "
          "lighthouse, briefly and in plain words. Never invent a ship's name; say so when you do not know. "
          "Give times in the 24-hour clock and distances in nautical miles. ")
QUESTIONS = ["When does the evening tide turn?", "Which ship came in last night?", "How far is the lighthouse?"]
TOGETHER = ["Who keeps the ledger?", "What colour is the lighthouse?", "Is the harbour open at night?",
            "How deep is the channel?"]
ANSWER_TOKENS = 16
STEP = 2048           # prompt tokens read per step: mlx-lm's generate and omlx-site's request alone


def fixture_for(arch: str, size_mb: float | None) -> Path:
    from pool.catalog.fixture_models import make_fixture_model

    out = CACHE / "fixtures" / f"arch-{arch}-{'tiny' if size_mb is None else f'{size_mb:g}mb'}"
    if not (out / "config.json").exists():
        make_fixture_model(out, size_mb, tokenizer_from=demo_model(), arch=arch)
    return out


class Raw:
    """mlx-lm's own greedy decoding of a chat, from the prompt tokens the chat template gives."""

    def __init__(self, folder: Path):
        from mlx_lm import load

        self.model, self.tokenizer = load(str(folder))

    def answer(self, messages: list[dict]) -> str:
        from mlx_lm import stream_generate

        tokens = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return "".join(r.text for r in stream_generate(self.model, self.tokenizer, tokens, max_tokens=ANSWER_TOKENS))

    def held_bytes(self, tokens: int) -> int:
        """What mlx-lm's caches hold once a prompt of `tokens` is read, STEP tokens at a time."""
        import mlx.core as mx

        from pool.engines.kv_layout import held_bytes

        return held_bytes(self.model, mx.array([(7 * i) % 1000 + 10 for i in range(tokens)]), STEP)


def chat(server, messages: list[dict]) -> tuple[str, int]:
    r = server.client.post(server.url + "/v1/chat/completions", json={
        "model": server.model, "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0})
    r.raise_for_status()
    body = r.json()
    details = body["usage"].get("prompt_tokens_details") or {}
    return body["choices"][0]["message"]["content"] or "", details.get("cached_tokens", 0) or 0


def turns(server) -> dict:
    """Cold, repeat, two follow-ups: the answers and the cached tokens of each; then four chats at once."""
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    out, cached = {}, {}
    out["cold"], cached["cold"] = chat(server, base)
    out["repeat"], cached["repeat"] = chat(server, base)
    messages = list(base)
    for k, question in enumerate(QUESTIONS[1:], start=1):
        messages += [{"role": "assistant", "content": out["cold" if k == 1 else f"turn {k}"]},
                     {"role": "user", "content": question}]
        out[f"turn {k + 1}"], cached[f"turn {k + 1}"] = chat(server, messages)
        out[f"messages {k + 1}"] = list(messages)
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in TOGETHER]
    with concurrent.futures.ThreadPoolExecutor(len(chats)) as pool:
        out["together"] = [text for text, _ in pool.map(lambda m: chat(server, m), chats)]
    out["together messages"] = chats
    return {"answers": out, "cached": cached}


def llama_formula(folder: Path, tokens: int) -> int:
    """The estimate before issue 32: layers x kv_heads x head_dim x 2 x the config's dtype's bytes per
    token, from config.json's top level (a nested text_config gave it nothing to read)."""
    import json

    c = json.loads((folder / "config.json").read_text())
    layers, heads = c.get("num_hidden_layers") or 0, c.get("num_attention_heads") or 1
    head_dim = c.get("head_dim") or (c.get("hidden_size") or 0) // heads
    itemsize = 4 if "32" in str(c.get("torch_dtype") or "float32") else 2
    return layers * (c.get("num_key_value_heads") or heads) * head_dim * 2 * itemsize * tokens


def estimate_ratios(folder: Path, raw: Raw) -> list[float]:
    """The estimate over what the caches hold at 1K and 8K tokens; then the old formula's, likewise."""
    from pool.engines.kv_layout import measure_layout
    from pool.policy.kv import kv_estimate

    layout = measure_layout(raw.model)
    held = {n: raw.held_bytes(n) for n in (1024, 8192)}
    return [kv_estimate(layout, tokens=n, prefill_chunk=STEP) / held[n] for n in held] + [
        llama_formula(folder, n) / held[n] for n in held]


def main() -> None:
    from pool.catalog.fixture_archs import ARCHS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", default=",".join(ARCHS), help="comma-separated (default: every one)")
    p.add_argument("--size-mb", type=float, default=None, help="fixture size (default: the tests' tiny one)")
    p.add_argument("--no-server", action="store_true", help="only the KV estimate")
    args = p.parse_args()
    print(f"{'architecture':<12} {'answers=raw':>11}  {'cached: repeat / turn 2 / turn 3':>34}  "
          f"{'mlx_lm.server':>16}  {'estimate/held at 1K, 8K':>24}  {'before (llama formula)':>22}", flush=True)
    for arch in args.archs.split(","):
        folder = fixture_for(arch, args.size_mb)
        raw = Raw(folder)
        ratios = estimate_ratios(folder, raw)
        row = f"{arch:<12} "
        if args.no_server:
            print(row + f"{'':>11}  {'':>34}  {'':>16}  {ratios[0]:>16.3f}x, {ratios[1]:.3f}x  "
                  f"{ratios[2]:>14.2f}x, {ratios[3]:.2f}x", flush=True)
            continue
        ours, theirs = start_omlx(folder), start_mlx_lm(folder)
        try:
            mine, other = turns(ours), turns(theirs)
        finally:
            ours.stop()
            theirs.stop()
        a = mine["answers"]
        expected = {"cold": raw.answer(a["messages 2"][:2]), "turn 2": raw.answer(a["messages 2"]),
                    "turn 3": raw.answer(a["messages 3"])}
        same = [a["cold"] == expected["cold"], a["repeat"] == expected["cold"], a["turn 2"] == expected["turn 2"],
                a["turn 3"] == expected["turn 3"],
                *(text == raw.answer(m) for text, m in zip(a["together"], a["together messages"]))]
        c, o = mine["cached"], other["cached"]
        print(row + f"{sum(same):>6} of {len(same)}  {c['repeat']:>20} / {c['turn 2']} / {c['turn 3']:<6}  "
              f"{o['repeat']:>6} / {o['turn 2']} / {o['turn 3']:<4}  {ratios[0]:>10.3f}x, {ratios[1]:.3f}x  "
              f"{ratios[2]:>14.2f}x, {ratios[3]:.2f}x",
              flush=True)
        if not all(same):
            names = ["cold", "repeat", "turn 2", "turn 3", "together 1", "together 2", "together 3", "together 4"]
            print(f"    differs: {[k for k, s in zip(names, same) if not s]}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
