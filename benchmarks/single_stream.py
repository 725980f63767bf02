"""Decode speed of one stream: the demo model through the server vs raw mlx_lm.stream_generate.

Both run in this one script, one after the other, alternating, on the same model, prompt and
greedy settings. Decode tokens/s counts the tokens after the first over the time after the first
(prefill excluded), the same way on both sides.

    .venv/bin/python benchmarks/single_stream.py [--tokens 64] [--runs 3]
"""

import argparse
import json
import statistics
import time

import httpx

from _models import demo_model
from _servers import start_omlx

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def decode_rate(token_times: list[float]) -> float:
    return (len(token_times) - 1) / (token_times[-1] - token_times[0])


def server_run(url: str, model_id: str, tokens: int) -> float:
    times = []
    body = {"model": model_id, "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
    # SSE chunks carry text; a token that completes no character arrives with the next one
    return (completion - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def raw_run(model, tokenizer, tokens: int) -> float:
    from mlx_lm import stream_generate

    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    times = [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=tokens)]
    return decode_rate(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    model = demo_model()
    omlx = start_omlx(model)
    url = omlx.url
    try:
        server_run(url, model.name, 4)  # load and warm up
        from mlx_lm import load
        raw_model, tokenizer = load(str(model))
        raw_run(raw_model, tokenizer, 4)
        server, raw = [], []
        for _ in range(args.runs):
            server.append(server_run(url, model.name, args.tokens))
            raw.append(raw_run(raw_model, tokenizer, args.tokens))
    finally:
        omlx.stop()
    s, r = statistics.median(server), statistics.median(raw)
    print(f"model {model.name}, {args.tokens} greedy tokens, {args.runs} runs each, alternating")
    print(f"server (SSE, openai-style):     {s:6.2f} decode tok/s   runs {', '.join(f'{x:.2f}' for x in server)}")
    print(f"raw mlx_lm.stream_generate:     {r:6.2f} decode tok/s   runs {', '.join(f'{x:.2f}' for x in raw)}")
    print(f"ratio server/raw: {s / r:.2f}")


if __name__ == "__main__":
    main()
