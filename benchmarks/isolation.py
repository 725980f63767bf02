"""Whether one request's work stalls another's: one omlx-site server, two scenarios, each measured
beside the disturbance and alone, taking turns in this one run.

(a) Model A streams while model B (a >= 1 GB random-weight fixture, or --model-b) loads: A's
    inter-token gaps while B loads vs the same stream with nothing loading. Target: p99 <= 2x.
(b) Model A decodes a stream S when a long prompt L (--long-tokens) arrives and, 10 ms later, a
    short one Q (max_tokens 1): Q's time to first token beside L's prefill vs Q alone, and S's gaps
    during L's prefill vs S alone. Target: Q beside <= 2 x Q alone + one prefill chunk, the chunk
    being the server's prefill step (/api/pool memory.prefill_step) timed from L's prefill alone.

    .venv/bin/python benchmarks/isolation.py [--model PATH] [--model-b PATH] [--stream-tokens 128]
                                             [--long-tokens 400] [--rounds 3]

Gaps are the seconds between streamed SSE chunks as the client receives them; p50/p99 pool every
gap of a scenario's rounds. Every prompt starts with a unique number, so no prefix cache serves it.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import httpx
from _models import demo_model, fixture
from _servers import StreamReply, gaps, long_text, numbered_prompt, percentile, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a long, detailed story about a lighthouse keeper and every ship he watched, chapter by chapter."
SHORT = "Say hello."
SHORT_AFTER = 0.01  # seconds between sending the long prompt and the short one


class Background:
    """server.stream_chat on a thread: started now, its reply read after join()."""

    def __init__(self, server, messages: list[dict], max_tokens: int):
        self.reply, self._progress = None, StreamReply()
        self.sent = self._progress.started
        self._thread = threading.Thread(target=self._run, args=(server, messages, max_tokens))
        self._thread.start()

    def _run(self, server, messages, max_tokens):
        self.reply = server.stream_chat(messages, max_tokens, reply=self._progress)

    def wait_for_tokens(self, chunks: int = 3) -> None:
        """Until the stream has sent `chunks` chunks (it is decoding), or has ended."""
        while len(self._progress.times) < chunks and self._thread.is_alive():
            time.sleep(0.005)

    def join(self) -> dict:
        self._thread.join()
        if self.reply is None:
            raise RuntimeError("the background stream failed (see above)")
        return self.reply


def covered(times: list[float], start: float, end: float) -> float:
    """The share of [start, end] that a stream's first-to-last token span covers."""
    return max(0.0, min(times[-1], end) - max(times[0], start)) / (end - start)


def load_beside_stream(server, b_name: str, ids, stream_tokens: int) -> tuple[list, list, dict]:
    """(a) one round: A's gaps alone, A's gaps while B loads, and how the two overlapped."""
    server.post(f"/api/models/{b_name}/unload")
    alone = server.stream_chat(numbered_prompt(next(ids), ASK), stream_tokens)
    a = Background(server, numbered_prompt(next(ids), ASK), stream_tokens)
    a.wait_for_tokens()
    started = time.perf_counter()
    server.post(f"/api/models/{b_name}/load")
    ended = time.perf_counter()
    reply = a.join()
    return (gaps(alone["times"]), gaps(reply["times"], started, ended),
            {"load": ended - started, "covered": covered(reply["times"], started, ended)})


def short_beside_long(server, ids, stream_tokens: int, text: str) -> dict:
    """(b) one round, alone then beside: Q's TTFT, L's TTFT, S's gaps."""
    q_alone = server.stream_chat(numbered_prompt(next(ids), SHORT), 1)["ttft"]
    l_alone = server.stream_chat(numbered_prompt(next(ids), text), 1)["ttft"]
    s_alone = server.stream_chat(numbered_prompt(next(ids), ASK), stream_tokens)
    s = Background(server, numbered_prompt(next(ids), ASK), stream_tokens)
    s.wait_for_tokens()
    long = Background(server, numbered_prompt(next(ids), text), 1)
    time.sleep(SHORT_AFTER)
    q_beside = server.stream_chat(numbered_prompt(next(ids), SHORT), 1)["ttft"]
    l_reply, s_reply = long.join(), s.join()
    prefill_end = l_reply["started"] + l_reply["ttft"]
    return {"q_alone": q_alone, "q_beside": q_beside, "l_alone": l_alone, "s_alone": gaps(s_alone["times"]),
            "s_beside": gaps(s_reply["times"], long.sent, prefill_end),
            "covered": covered(s_reply["times"], long.sent, prefill_end)}


def line(name: str, alone: list[float], beside: list[float]) -> str:
    p50a, p99a, p50b, p99b = (percentile(g, q) for g in (alone, beside) for q in (50, 99))
    return (f"{name:34} {p50a * 1e3:8.1f} {p99a * 1e3:8.1f} | {p50b * 1e3:8.1f} {p99b * 1e3:8.1f} | "
            f"{p50b / p50a:5.2f} {p99b / p99a:5.2f}   ({len(alone)} / {len(beside)} gaps)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="model A (default: the demo model)")
    p.add_argument("--model-b", type=Path, default=None, help="model B, loaded beside A's stream "
                   "(default: a 1 GB float32 random-weight fixture, built once in the benchmark cache)")
    p.add_argument("--stream-tokens", type=int, default=128, help="max_tokens of the decoding streams")
    p.add_argument("--long-tokens", type=int, default=400, help="tokens of the long prompt")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    model_a = args.model or demo_model()
    model_b = args.model_b or fixture("isolation-b-1000mb", 1000, seed=3)
    text = long_text(model_a, args.long_tokens)
    ids = iter(range(10**6))
    server = start_omlx(model_a, model_b)
    try:
        server.stream_chat(numbered_prompt(next(ids), ASK), 8)                           # A loaded and warm
        server.stream_chat(numbered_prompt(next(ids), text), 1)                          # the long shape too
        server.post(f"/api/models/{model_b.name}/load")                                  # B's files cached
        step = httpx.get(server.url + "/api/pool", timeout=30).json()["memory"]["prefill_step"]
        # one untimed round of each: MLX's CUDA backend compiles every new batch and chunk shape
        # (seen: the first short request beside a long prompt took 27 s on the H200)
        load_beside_stream(server, model_b.name, ids, args.stream_tokens)
        short_beside_long(server, ids, args.stream_tokens, text)
        a_alone, a_beside, loads, b = [], [], [], []
        for _ in range(args.rounds):
            alone, beside, overlap = load_beside_stream(server, model_b.name, ids, args.stream_tokens)
            a_alone += alone
            a_beside += beside
            loads.append(overlap)
            b.append(short_beside_long(server, ids, args.stream_tokens, text))
    finally:
        server.stop()

    print(f"model A {model_a.name}, model B {model_b.name}; {args.rounds} round(s); streams of {args.stream_tokens} "
          f"tokens; inter-token gaps in ms")
    print(f"{'':34} {'alone p50':>8} {'p99':>8} | {'beside':>8} {'p99':>8} | ratio p50 p99")
    print(line("(a) A's stream while B loads", a_alone, a_beside))
    print("    B's loads: " + ", ".join(f"{x['load']:.2f} s ({x['covered']:.0%} inside A's stream)" for x in loads)
          + "   target: p99 ratio <= 2")
    print(line("(b) S's stream during L's prefill", [g for r in b for g in r["s_alone"]],
               [g for r in b for g in r["s_beside"]]))
    print("    L's prefills: " + ", ".join(f"{r['covered']:.0%} inside S's stream" for r in b))
    q_alone, q_beside, l_alone = (percentile([r[k] for r in b], 50) for k in ("q_alone", "q_beside", "l_alone"))
    chunk = l_alone * min(1.0, step / args.long_tokens)
    print(f"(b) short TTFT (s): alone {q_alone:.3f}, beside a {args.long_tokens}-token prompt {q_beside:.3f} "
          f"= {q_beside / q_alone:.2f}x (medians)")
    print(f"    prefill step {step} tokens; the long prompt's TTFT alone {l_alone:.3f} s, so one chunk ~{chunk:.3f} s; "
          f"target: beside <= 2 x alone + one chunk = {2 * q_alone + chunk:.3f} s -> "
          f"{'met' if q_beside <= 2 * q_alone + chunk else 'NOT met'}")


if __name__ == "__main__":
    main()
