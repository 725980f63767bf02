"""Decode speed with and without a JSON schema on the same model, in one run: constrained decoding's
cost (target: constrained at least 0.8x unconstrained).

Both sides run mlx-lm's `generate_step` on the same loaded model (as the server loads it), same
prompt, greedy, taking turns run by run; the constrained side adds pool.engines.grammar's
processor for SCHEMA, whose minItems keeps the output going past --tokens, so both sides decode the
same number of tokens. Decode tokens/s counts the tokens after the first over the time after the
first (prefill excluded). The mask line is the processor's own time per token, replayed over
the constrained output with the logits already computed. Then the same through a real omlx-site
server (`response_format` json_schema vs none, streamed, taking turns): decode tokens/s from the
first streamed chunk to the last, by the usage's completion tokens.

    .venv/bin/python benchmarks/constrained.py [--model PATH] [--tokens 64] [--runs 3]
"""

import argparse
import statistics
import time
from pathlib import Path

from _models import as_the_pool_loads, demo_model
from _servers import start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

PROMPT = [{"role": "user", "content": "List the largest cities of Europe as JSON, with their country and population."}]
SCHEMA = {
    "type": "array", "minItems": 1000,
    "items": {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
              "properties": {"city": {"type": "string", "maxLength": 40},
                             "country": {"type": "string", "maxLength": 40},
                             "population": {"type": "integer", "minimum": 0}}},
}


def decode_run(model, prompt: list[int], tokens: int, processors: list) -> tuple[float, list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    times, out = [], []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens, logits_processors=processors):
        times.append(time.perf_counter())
        out.append(token)
    return (len(times) - 1) / (times[-1] - times[0]), out


def mask_seconds(constraint, tokenizer, prompt: list[int], output: list[int], vocab: int) -> list[float]:
    """The processor's own time per token, replaying an output with the logits already computed."""
    import mlx.core as mx

    from pool.engines.grammar import make_processor

    processor, logits, seconds = make_processor(constraint.grammar, tokenizer), mx.zeros((1, vocab)), []
    for n in range(len(output) + 1):
        tokens = mx.array(prompt + output[:n])
        mx.eval(tokens, logits)
        started = time.perf_counter()
        mx.eval(processor(tokens, logits))
        seconds.append(time.perf_counter() - started)
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an MLX model folder (default: the demo model)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()

    import mlx.core as mx

    from pool.engines.grammar import make_processor
    from pool.engines.loading import load_weights
    from pool.serving.constraints import json_schema

    folder = args.model or demo_model()
    model, tokenizer, _ = load_weights(folder, dequantize=as_the_pool_loads(folder))
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    constraint = json_schema(SCHEMA)
    started = time.perf_counter()
    make_processor(constraint.grammar, tokenizer)      # the tokenizer's tables, once per tokenizer
    print(f"tokenizer tables: {time.perf_counter() - started:.2f} s (once per model)")
    decode_run(model, prompt, 8, [])          # warm-up

    free, bound = [], []
    for _ in range(args.runs):
        free.append(decode_run(model, prompt, args.tokens, [])[0])
        speed, output = decode_run(model, prompt, args.tokens, [make_processor(constraint.grammar, tokenizer)])
        bound.append(speed)
    vocab = model(mx.array([prompt[:1]])).shape[-1]
    masks = mask_seconds(constraint, tokenizer, prompt, output, vocab)
    f, b = statistics.median(free), statistics.median(bound)
    print(f"decode tok/s, {args.tokens} tokens, median of {args.runs}:")
    print(f"  unconstrained  {f:8.1f}   runs {' '.join(f'{x:.1f}' for x in free)}")
    print(f"  JSON schema    {b:8.1f}   runs {' '.join(f'{x:.1f}' for x in bound)}")
    print(f"  ratio          {b / f:8.2f}x  (target >= 0.8x)")
    print(f"  mask           {1e3 * statistics.median(masks):8.2f} ms per token, median (max {1e3 * max(masks):.2f})"
          f" against {1e3 / f:.1f} ms per unconstrained token")
    print(f"  output         {tokenizer.decode(output)[:100]!r}")
    del model
    server_ratio(args.model or demo_model(), args.tokens, args.runs)


def server_speed(server, tokens: int, **extra) -> float:
    reply = server.stream_chat(PROMPT, tokens, **extra)
    times, n = reply["times"], reply["usage"]["completion_tokens"]
    return (n - 1) / (times[-1] - times[0])


def server_ratio(model: Path, tokens: int, runs: int) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "cities", "schema": SCHEMA}}
    server = start_omlx(model)
    try:
        server_speed(server, 8), server_speed(server, 8, response_format=schema)      # warm-up
        free, bound = [], []
        for _ in range(runs):
            free.append(server_speed(server, tokens))
            bound.append(server_speed(server, tokens, response_format=schema))
    finally:
        server.stop()
    f, b = statistics.median(free), statistics.median(bound)
    print(f"through omlx-site (streamed chat), decode tok/s, median of {runs}:")
    print(f"  unconstrained  {f:8.1f}   runs {' '.join(f'{x:.1f}' for x in free)}")
    print(f"  JSON schema    {b:8.1f}   runs {' '.join(f'{x:.1f}' for x in bound)}")
    print(f"  ratio          {b / f:8.2f}x  (target >= 0.8x)")


if __name__ == "__main__":
    main()
