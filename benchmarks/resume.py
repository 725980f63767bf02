"""A long prompt after its model was evicted and loaded again: time to first token with the prompt
cache's disk tier vs cold (the same reload, no cache), same server, same prompt, in one run. Both
figures include loading the model again.

    .venv/bin/python benchmarks/resume.py [--model PATH] [--tokens 1000] [--runs 2]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import httpx
from _models import demo_model
from _servers import start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

STORY = "The old lighthouse keeper counted the steps and wrote the ships' names in a blue ledger. "


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="default: the demo model")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    model = args.model or demo_model()
    from mlx_lm.utils import load_tokenizer

    tokenizer, text = load_tokenizer(model), STORY
    while len(tokenizer.encode(text)) < args.tokens:
        text += STORY
    server = start_omlx(model)
    cold, resumed = [], []
    try:
        server.stream_chat([{"role": "user", "content": "hi"}], 2)
        def unload():
            r = httpx.post(f"{server.url}/api/models/{server.model}/unload", json={}, timeout=300)
            r.raise_for_status()                                             # caches spilled, weights freed

        for run in range(args.runs):
            messages = [{"role": "user", "content": f"({run}) " + text + " What did he write down?"}]
            unload()
            cold.append(server.stream_chat(messages, 8, cache_prompt=False)["ttft"])   # reload + full prefill
            server.stream_chat(messages, 8)                                  # stored in memory
            unload()
            reply = server.stream_chat(messages, 8)                          # reload + the prefix from disk
            resumed.append(reply["ttft"])
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, reply["usage"]
    finally:
        server.stop()
    c, r = statistics.median(cold), statistics.median(resumed)
    print(f"model {model.name}; a {args.tokens}+ token prompt; {args.runs} runs; TTFT in seconds")
    print(f"cold (no prompt cache):                 {c:8.2f}   runs {', '.join(f'{x:.2f}' for x in cold)}")
    print(f"after unload + reload (disk tier):      {r:8.2f}   runs {', '.join(f'{x:.2f}' for x in resumed)}")
    print(f"ratio resumed/cold: {r / c:.2f} (target <= 0.3)")


if __name__ == "__main__":
    main()
