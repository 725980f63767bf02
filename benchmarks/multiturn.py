"""Time to first token, turn by turn, of one chat on a long history: omlx-site (with its disk tier,
and without: OMLX_PROMPT_CACHE_DISK_BYTES=off) vs mlx_lm.server on the same model folder, and raw
mlx-lm reusing its prompt cache by hand (the floor).

Each turn sends the whole history, as chat clients do; a server with a prefix cache reads only the
new message. The three servers run at once, each first warmed by a whole chat of the same length on
another text (so every turn meets compiled kernels, not a cache: MLX's CUDA backend compiles each
new shape for seconds); then, --rounds times, every side in turn chats on that round's own text.
Every round's row is printed as soon as its side is done.

    .venv/bin/python benchmarks/multiturn.py [--model PATH] [--history-tokens 1500] [--turns 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _models import demo_model
from _servers import start_mlx_lm, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

STORY = ("The old lighthouse keeper climbed the spiral stairs each evening, counting the steps, "
         "watching the ships pass the rocks below and writing their names in a worn blue ledger. ")
QUESTIONS = ["What did the keeper write down?", "Why did he count the steps?", "Name one ship he saw.",
             "What colour was the ledger?", "How does the story end?", "Who climbed the stairs?"]
ANSWER_TOKENS = 16


WARM_STORY = ("A small boat crossed the grey harbour at dawn, its engine coughing, gulls following the "
              "nets that the two brothers hauled in while the town behind them slowly woke up. ")


def history(tokenizer, target_tokens: int, story: str = STORY, round_: int = 0) -> list[dict]:
    text = f"Version {round_ + 1}. " + story
    while len(tokenizer.encode(text)) < target_tokens:
        text += story
    return [{"role": "user", "content": "Read this story.\n\n" + text},
            {"role": "assistant", "content": "I have read it."}]


def chat_turns(server, base: list[dict], turns: int) -> list[float]:
    messages, ttfts = list(base), []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        reply = server.stream_chat(messages, ANSWER_TOKENS)
        ttfts.append(reply["ttft"])
        messages.append({"role": "assistant", "content": reply["text"]})
    return ttfts


def raw_turns(model, tokenizer, base: list[dict], turns: int) -> list[float]:
    """mlx-lm's own stream_generate with one prompt cache kept across turns: what the cache saves."""
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    cache, seen, messages, ttfts = make_prompt_cache(model), [], list(base), []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        common = next((i for i, (a, b) in enumerate(zip(tokens, seen)) if a != b), min(len(tokens), len(seen)))
        if common < len(seen):          # the template re-rendered something: start over
            cache, common = make_prompt_cache(model), 0
        started, first, text, out = time.perf_counter(), None, [], []
        for response in stream_generate(model, tokenizer, tokens[common:], max_tokens=ANSWER_TOKENS,
                                        prompt_cache=cache):
            first = first or time.perf_counter()
            text.append(response.text)
            out.append(response.token)
        ttfts.append(first - started)
        seen = tokens + out[:-1]
        messages.append({"role": "assistant", "content": "".join(text)})
    return ttfts


def last_turns(server, turns: int) -> list[dict]:
    """Where each of an omlx-site's last `turns` TTFTs went, from its own traces: the route up to the
    engine (the door, the chat template, tokenizing, the checkpoints' renders) and the engine from
    the prompt's hand-over to its first chunk; and the prompt tokens the prompt cache served."""
    rows = server.recent_traces(turns)[::-1]
    return [{"route": (r["ttft_ms"] or 0) - (r["prefill_ms"] or 0), "engine": r["prefill_ms"] or 0,
             "cached": r["cached_tokens"] or 0} for r in rows]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model folder (default: the demo model)")
    p.add_argument("--history-tokens", type=int, default=1500)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-tier-off", action="store_true",
                   help="leave out the omlx-site without its disk tier (one server less to warm on the GPU)")
    args = p.parse_args()
    model = args.model or demo_model()
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(model)
    bases = [history(tokenizer, args.history_tokens, STORY, r) for r in range(args.rounds)]
    warm = history(tokenizer, args.history_tokens, WARM_STORY)
    starts = {"omlx-site": lambda: start_omlx(model),
              "omlx-site, tier off": lambda: start_omlx(model, OMLX_PROMPT_CACHE_DISK_BYTES="off"),
              "mlx_lm.server": lambda: start_mlx_lm(model)}
    if args.no_tier_off:
        del starts["omlx-site, tier off"]
    raw_name = "raw mlx-lm (cache by hand)"
    print(f"model {model.name}; history of {args.history_tokens}+ tokens; {args.turns} turns; {args.rounds} "
          f"round(s), sides in turn; TTFT in seconds", flush=True)
    print(f"{'':34}" + "".join(f"{f'turn {i + 1}':>10}" for i in range(args.turns)), flush=True)
    servers = {}
    try:
        for name, start in starts.items():
            servers[name] = start()
        sides = {name: (lambda base, s=server: chat_turns(s, base, args.turns)) for name, server in servers.items()}
        from mlx_lm import load

        raw_model, raw_tokenizer = load(str(model))
        sides[raw_name] = lambda base: raw_turns(raw_model, raw_tokenizer, base, args.turns)
        began = time.perf_counter()
        for name, run in sides.items():
            run(warm)
            print(f"  warmed {name} at {time.perf_counter() - began:.1f} s", flush=True)
        for server in servers.values():
            server.wait_warm()
        print(f"  every side warm at {time.perf_counter() - began:.1f} s", flush=True)
        results: dict[str, list[list[float]]] = {name: [] for name in sides}
        for r, base in enumerate(bases):
            for name, run in sides.items():
                results[name].append(run(base))
                print(f"{f'{name}, round {r + 1}':34}" + "".join(f"{t:10.3f}" for t in results[name][-1]),
                      flush=True)
        inside = {name: last_turns(server, args.turns) for name, server in servers.items()
                  if name.startswith("omlx-site")}
    finally:
        for server in servers.values():
            server.stop()

    print()
    for name, rows in inside.items():
        print(f"{name}, last round, from its traces (ms):")
        for label, key in (("route to engine", "route"), ("engine to first chunk", "engine"),
                           ("prompt tokens cached", "cached")):
            print(f"{'  ' + label:34}" + "".join(f"{row[key]:10.0f}" for row in rows))
    for r in range(args.rounds):
        ours, peer = results["omlx-site"][r], results["mlx_lm.server"][r]
        raw = results[raw_name][r]
        print(f"round {r + 1}")
        print(f"{'  omlx-site / its turn 1':34}" + "".join(f"{t / ours[0]:10.2f}" for t in ours))
        print(f"{'  omlx-site / mlx_lm.server':34}" + "".join(f"{a / b:10.2f}" for a, b in zip(ours, peer)))
        if "omlx-site, tier off" in results:
            off = results["omlx-site, tier off"][r]
            print(f"{'  omlx-site / tier off':34}" + "".join(f"{a / b:10.2f}" for a, b in zip(ours, off)))
        print(f"{'  omlx-site - raw (ms)':34}" + "".join(f"{(a - b) * 1000:10.1f}" for a, b in zip(ours, raw)))
    later = max(t / run[0] for run in results["omlx-site"] for t in run[1:])
    vs_peer = max(a / b for run, peer in zip(results["omlx-site"], results["mlx_lm.server"])
                  for a, b in zip(run[1:], peer[1:]))
    print(f"turns 2+ over every round: at most {later:.2f}x turn 1, at most {vs_peer:.2f}x mlx_lm.server "
          f"(target <= 1.0)")


if __name__ == "__main__":
    main()
