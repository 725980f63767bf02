"""Decode speed and time to first token of one stream: omlx-site vs mlx_lm.server vs raw
mlx_lm.stream_generate, on the same model folder, prompt and greedy settings.

All three run in this one script, taking turns run by run. Decode tokens/s counts the tokens after
the first over the time after the first (prefill excluded), the same way on every side, and every
run's prompt is new (no prefix cache serves it); a server's tokens are its usage's
completion_tokens (an SSE chunk carries text, and a token that completes no character arrives with
the next one). The bound share is decode tok/s against the bandwidth bound
(_bandwidth.py: the device's copy rate / the model's weight bytes). TTFT runs from sending the
request (raw: from applying the chat template) to the first token; issue 22's target is omlx-site
at most raw + 10 ms.

Each omlx-site's TTFT is split by its own request traces: outside the route (HTTP, SSE framing), the
route up to the engine (the door, the chat template, tokenizing) and the engine (the prompt's
hand-over to its first chunk). `--prompt-tokens N` asks about a story of N tokens (a cold long first
turn); `--variant NAME:OMLX_X=V,...` adds an omlx-site with other settings, up beside the others.

    .venv/bin/python benchmarks/single_stream.py [--model PATH] [--tokens 64] [--runs 3]
        [--prompt-tokens N] [--variant alone512:OMLX_PREFILL_STEP_ALONE=512 ...]
"""

import argparse
import itertools
import statistics
import time
from pathlib import Path

from _bandwidth import Bound
from _models import demo_model
from _servers import long_text, numbered_prompt, start_mlx_lm, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a short story about a lighthouse keeper."
RUNS = itertools.count()    # every run's prompt differs from the first words: no prefix cache serves it


def server_run(server, prompt: str, tokens: int) -> tuple[float, float, str | None]:
    """(decode tok/s, TTFT s, omlx-site's request id)"""
    reply = server.stream_chat(numbered_prompt(next(RUNS), prompt), tokens)
    times, completion = reply["times"], reply["usage"]["completion_tokens"]
    rate = (completion - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return rate, reply["ttft"], reply["request_id"]


def raw_run(model, tokenizer, prompt: str, tokens: int) -> tuple[float, float, float]:
    """(decode tok/s, TTFT s, of which the chat template and tokenizing)"""
    from mlx_lm import stream_generate

    started = time.perf_counter()
    encoded = tokenizer.apply_chat_template(numbered_prompt(next(RUNS), prompt), add_generation_prompt=True)
    template = time.perf_counter() - started
    times = [time.perf_counter() for _ in stream_generate(model, tokenizer, encoded, max_tokens=tokens)]
    return (len(times) - 1) / (times[-1] - times[0]), times[0] - started, template


def variant(text: str) -> tuple[str, dict[str, str]]:
    """`name:OMLX_A=1,OMLX_B=2` -> ("omlx-site name", {"OMLX_A": "1", "OMLX_B": "2"})"""
    name, _, pairs = text.partition(":")
    return f"omlx-site {name}", dict(pair.split("=", 1) for pair in pairs.split(",") if pair)


def breakdown(server, ids: list[str], ttfts: list[float]) -> str:
    """Where omlx-site's TTFT went, from its own traces (medians, ms): HTTP and SSE framing outside
    the route; the route up to the engine (parsing, the door, the chat template, tokenizing); the
    engine from the prompt's hand-over to its first chunk on the event loop."""
    traces = [server.client.get(f"{server.url}/api/requests/{i}").json() for i in ids]
    inside = [t["ttft_ms"] for t in traces]
    engine = [t["prefill_ms"] for t in traces]
    outside = [c * 1000 - i for c, i in zip(ttfts, inside)]
    route = [i - e for i, e in zip(inside, engine)]
    return (f"outside the route {statistics.median(outside):6.1f}   route to engine {statistics.median(route):6.1f}"
            f"   engine to first chunk {statistics.median(engine):6.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model folder (default: the demo model)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="a question on a story this long (default: a one-line question)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:OMLX_X=V,...",
                   help="one more omlx-site, with these settings (repeatable)")
    args = p.parse_args()
    model = args.model or demo_model()
    bound = Bound(model)
    prompt = long_text(model, args.prompt_tokens) if args.prompt_tokens else ASK
    from mlx_lm import load

    raw_model, tokenizer = load(str(model))
    servers = []
    try:
        servers.append(start_omlx(model))
        for name, env in map(variant, args.variant):
            servers.append(start_omlx(model, **env))
            servers[-1].name = name
        servers.append(start_mlx_lm(model))
        sides = {server.name: (lambda s=server: server_run(s, prompt, args.tokens)) for server in servers}
        raw = "raw mlx_lm.stream_generate"
        sides[raw] = lambda: raw_run(raw_model, tokenizer, prompt, args.tokens)
        for name, run in sides.items():      # load and warm up
            cold = run()
            print(f"  {name:28} first run (cold): TTFT {cold[1] * 1000:.1f} ms, {cold[0]:.2f} decode tok/s", flush=True)
        for server in servers:
            server.wait_warm()
        runs: dict[str, list[tuple]] = {name: [] for name in sides}
        for i in range(args.runs):
            for name, run in sides.items():
                runs[name].append(run())
                print(f"  {name:28} run {i + 1}: TTFT {runs[name][-1][1] * 1000:.1f} ms, "
                      f"{runs[name][-1][0]:.2f} decode tok/s", flush=True)
        ours = {s.name: breakdown(s, [r[2] for r in runs[s.name]], [r[1] for r in runs[s.name]])
                for s in servers if s.name.startswith("omlx-site")}
    finally:
        for server in servers:
            server.stop()
    rates = {name: [r[0] for r in each] for name, each in runs.items()}
    ttfts = {name: [r[1] for r in each] for name, each in runs.items()}
    median = {name: statistics.median(r) for name, r in rates.items()}
    first = {name: statistics.median(t) for name, t in ttfts.items()}
    print(f"model {model.name}, prompt {len(tokenizer.apply_chat_template(numbered_prompt(0, prompt)))} tokens, "
          f"{args.tokens} greedy tokens, {args.runs} runs each, alternating; {bound.describe()}")
    for name, each in rates.items():
        print(f"{name:28} {median[name]:7.2f} decode tok/s  ({bound.share(median[name]):4.0%} of the bound)   "
              f"runs {', '.join(f'{x:.2f}' for x in each)}")
    for name, each in ttfts.items():
        each_ms = ", ".join(f"{x * 1000:.1f}" for x in each)
        print(f"{name:28} {first[name] * 1000:7.1f} ms TTFT (median)   runs {each_ms}")
    template_ms = statistics.median(r[2] for r in runs[raw]) * 1000
    print(f"{raw:28} of which the chat template and tokenizing {template_ms:.1f} ms")
    for name, text in ours.items():
        print(f"{name:28} {text} ms")
    for name in ours:
        print(f"{name}: ratio to raw {median[name] / median[raw]:.2f}, to mlx_lm.server "
              f"{median[name] / median['mlx_lm.server']:.2f}; TTFT - raw {(first[name] - first[raw]) * 1000:+.1f} ms "
              f"(target <= +10), TTFT / mlx_lm.server {first[name] / first['mlx_lm.server']:.2f}")


if __name__ == "__main__":
    main()
