"""Draft models (issue 36 item 2): one stream's decode tok/s with a draft against the same model alone,
through omlx-site, mlx_lm.server and raw mlx-lm, on one model folder.

The target is a random-weight bf16 llama of about --target-mb; its drafts (_draft_models.py): a
shallow copy made to agree with it (the target's first layers, the deeper ones made quiet: a
stand-in for a small draft trained on the target's outputs), quantized copies (`--bits 4`, issue
36's example, made by `mlx_lm convert`; none by default, being the target's layers again) and a
tiny unrelated random llama (it does not agree).

Three groups, one after another (a GPU holds one group's processes at a time); within a group the
sides take turns run by run, each with a new prompt (no prefix cache serves it), greedy, --tokens
tokens; medians of --runs runs, and each side's ratio to its group's plain side. Decode tok/s = (tokens
- 1) / (last token time - first), prefill excluded.

- omlx-site: one server per side (the target alone; the target with each draft, set by
  POST /admin/model/{id}/settings {"draft_model": ...} before the first request loads it). Its
  policy (pool/policy/drafts.py) times both modes as it runs: requests draft until MIN_TOKENS were
  timed drafting, then decode plainly until as many were timed so, then the faster per token wins (a
  mode's first COLD_REQUESTS are not timed: they compile its kernels); so each omlx-site side is
  warmed with requests enough for both modes to have MIN_TOKENS timed before the timed runs. Acceptance
  (draft_accepted / draft_proposed) and which requests drafted come from its request traces.
- mlx_lm.server, with `--draft-model` (and `--num-draft-tokens`) and without.
- raw mlx_lm.stream_generate, with draft_model= and without, in this process.

Issue 36's targets, for the GPU: agreeing draft >= 1.5x the model alone; unrelated draft >= 0.97x
(never slower). On the CPU backend the figures are measured and stated, not judged.

    .venv/bin/python benchmarks/drafts.py [--target-mb 400] [--tokens 128] [--runs 3] [--bits 4]
        [--draft-tokens 3] [--groups omlx,mlx_lm,raw] [--tokenizer PATH]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from _bandwidth import Bound
from _draft_models import folders, megabytes
from _models import demo_model
from _servers import Running, numbered_prompt, start_mlx_lm, start_omlx

from omlx_site.process import setup_process
from pool.backend import cpu_backend
from pool.policy.drafts import COLD_REQUESTS, MIN_TOKENS, PROBE_EVERY

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a short story about a lighthouse keeper."
PROMPTS = itertools.count()    # every run's prompt differs from its first words


def say(text: str = "") -> None:
    print(text, flush=True)


# ---- sides -----------------------------------------------------------------------------------------

@dataclass
class Side:
    name: str
    run: Callable[[], dict]          # one request: {"rate", "tokens", and "id" (omlx-site) or "proposed"/"accepted"}
    plain: str                       # the name of its group's side without a draft
    warm: int = 1                    # untimed requests first (the first loads the model)
    server: Running | None = None
    after_load: Callable[[Side], None] | None = None
    warmups: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r["rate"] for r in self.runs) if self.runs else float("nan")


def server_run(server, tokens: int) -> dict:
    reply = server.stream_chat(numbered_prompt(next(PROMPTS), ASK), tokens)
    times, n = reply["times"], reply["usage"]["completion_tokens"]
    rate = (n - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")
    return {"rate": rate, "tokens": n, "id": reply["request_id"]}


def raw_run(model, tokenizer, tokens: int, draft=None, draft_tokens: int = 3) -> dict:
    """stream_generate; with a draft, what it proposed and what was accepted, counted as the engine
    counts them (drafting.py): a round ends with the model's own token."""
    from mlx_lm import stream_generate

    prompt = tokenizer.apply_chat_template(numbered_prompt(next(PROMPTS), ASK), add_generation_prompt=True)
    extra = {"draft_model": draft, "num_draft_tokens": draft_tokens} if draft is not None else {}
    times, proposed, accepted, round_start = [], 0, 0, 0
    for r in stream_generate(model, tokenizer, prompt, max_tokens=tokens, **extra):
        times.append(time.perf_counter())
        if draft is None:
            continue
        if r.from_draft:
            accepted += 1
        else:
            proposed += min(draft_tokens, tokens - round_start)
            round_start = len(times)
    if draft is not None and len(times) > round_start:
        proposed += min(draft_tokens, tokens - round_start)
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return {"rate": rate, "tokens": len(times), "proposed": proposed, "accepted": accepted}


def describe(side: Side, result: dict) -> str:
    text = f"{result['rate']:7.2f} decode tok/s, {result['tokens']} tokens"
    if result.get("proposed"):
        text += f", draft accepted {result['accepted']}/{result['proposed']}"
    return text


def play(sides: list[Side], runs: int) -> None:
    """Warm every side, then `runs` rounds, the sides taking turns."""
    for side in sides:
        for i in range(side.warm):
            side.warmups.append(side.run())
            say(f"  {side.name:40} warm-up {i + 1}{' (load)' if i == 0 else ''}: {describe(side, side.warmups[-1])}")
            if i == 0 and side.after_load is not None:
                side.after_load(side)
    for i in range(runs):
        for side in sides:
            side.runs.append(side.run())
            say(f"  {side.name:40} run {i + 1}: {describe(side, side.runs[-1])}")


# ---- the three groups ------------------------------------------------------------------------------

def omlx_group(args, target: Path, drafts: dict[str, Path]) -> list[Side]:
    """One omlx-site per side; each result gets its trace's draft counts before the servers stop."""
    # each mode: its cold requests (the first drafted one loads the model), then MIN_TOKENS timed
    warm = 2 * (COLD_REQUESTS + math.ceil(MIN_TOKENS / max(1, args.tokens - 1)))
    sides: list[Side] = []
    try:
        for label, draft in {"": None, **drafts}.items():
            server = start_omlx(target, *([draft] if draft else []), OMLX_DRAFT_TOKENS=str(args.draft_tokens))
            if draft is not None:       # before the first request loads the model
                server.post(f"/admin/model/{target.name}/settings", draft_model=draft.name)
            sides.append(Side(f"omlx-site + {label}" if label else "omlx-site",
                              lambda s=server: server_run(s, args.tokens), "omlx-site", warm, server, show_loaded))
        say(f"  {len(sides)} servers, each warmed with {warm} requests (the first loads the model) so that its "
            f"policy has timed >= {MIN_TOKENS} tokens drafted and plain before the timed runs")
        play(sides, args.runs)
        for side in sides:
            assert side.server is not None
            for result in side.warmups + side.runs:
                trace = side.server.client.get(f"{side.server.url}/api/requests/{result['id']}").json()
                result.update(proposed=trace["draft_proposed"], accepted=trace["draft_accepted"])
    finally:
        for side in sides:
            if side.server is not None:
                side.server.stop()
    return sides


def show_loaded(side: Side) -> None:
    """What omlx-site loaded (its snapshot's draft: the folder, bytes, tokens a round)."""
    assert side.server is not None
    side.server.wait_warm()
    pool = side.server.client.get(side.server.url + "/api/pool").json()
    model = next(m for m in pool["models"] if m["id"] == side.server.model)
    draft = model.get("draft")
    say(f"  {side.name:40} loaded: {(model.get('measured_bytes') or 0) / 1e6:.1f} MB with its draft; draft "
        f"{draft or 'none'}")
    if side.name != side.plain and not draft:
        say(f"  WARNING: {side.name}: the draft did not load (OMLX_BENCH_LOG=FILE keeps the server's log)")


def mlx_lm_group(args, target: Path, drafts: dict[str, Path]) -> list[Side]:
    sides: list[Side] = []
    try:
        server = start_mlx_lm(target)
        sides.append(Side("mlx_lm.server", lambda s=server: server_run(s, args.tokens), "mlx_lm.server", 1, server))
        for label, draft in drafts.items():
            if label == "unrelated draft":
                continue
            server = start_mlx_lm(target, "--draft-model", str(draft), "--num-draft-tokens", str(args.draft_tokens))
            sides.append(Side(f"mlx_lm.server --draft-model {label}", lambda s=server: server_run(s, args.tokens),
                              "mlx_lm.server", 1, server))
        play(sides, args.runs)
    finally:
        for side in sides:
            if side.server is not None:
                side.server.stop()
    return sides


def raw_group(args, target: Path, drafts: dict[str, Path]) -> list[Side]:
    """Raw mlx-lm in this process; the models are let go before it returns."""
    from mlx_lm import load

    model, tokenizer = load(str(target))
    loaded = {label: load(str(folder))[0] for label, folder in drafts.items()}
    short = min(16, args.tokens)
    say(f"  each model alone, one run of {short} tokens (a round: {args.draft_tokens} draft steps, one target step):")
    for label, each in (("the target", model), *loaded.items()):
        say(f"    {label}: {raw_run(each, tokenizer, short)['rate']:.2f} decode tok/s")
    plain = "raw stream_generate"
    sides = [Side(plain, lambda: raw_run(model, tokenizer, args.tokens), plain)]
    for label, draft in loaded.items():
        sides.append(Side(f"raw draft_model={label}",
                          lambda d=draft: raw_run(model, tokenizer, args.tokens, d, args.draft_tokens), plain))
    play(sides, args.runs)
    for side in sides:
        side.run = finished      # the closures hold the models
    return sides


def finished() -> dict:
    raise RuntimeError("this side's models were let go")


# ---- the report ------------------------------------------------------------------------------------

def acceptance(results: list[dict]) -> str:
    proposed = sum(r.get("proposed", 0) for r in results)
    accepted = sum(r.get("accepted", 0) for r in results)
    share = f"{accepted / proposed:.2f}" if proposed else "-"
    return f"{accepted}/{proposed} = {share}"


def drafted(side: Side) -> str:
    """Which requests drafted: w1.. the warm-ups, r1.. the timed runs; d = drafted (accepted/proposed)."""
    marks = [f"{prefix}{i + 1} " + (f"d {r['accepted']}/{r['proposed']}" if r.get("proposed") else "plain")
             for prefix, results in (("w", side.warmups), ("r", side.runs)) for i, r in enumerate(results)]
    return ", ".join(marks)


def report(args, target: Path, sizes: dict[str, float], bound: Bound, groups: list[list[Side]]) -> None:
    say()
    say(f"target {target.name}: {megabytes(target):.1f} MB bf16; drafts "
        + ", ".join(f"{label} {mb:.1f} MB" for label, mb in sizes.items())
        + f"; {args.tokens} greedy tokens, {args.runs} runs a side, sides alternating within each group; "
          f"{args.draft_tokens} draft tokens a round; {'CPU backend' if cpu_backend() else 'GPU backend'}")
    say(bound.describe())
    say(f"{'':48} {'decode tok/s':>12} {'x plain':>8} {'bound':>6}   runs")
    for sides in groups:
        by_name = {s.name: s for s in sides}
        for side in sides:
            ratio = side.median / by_name[side.plain].median
            target_note = ""
            if side.name != side.plain and side.name.startswith("omlx-site"):
                target_note = "  [GPU target >= 0.97x]" if "unrelated" in side.name else "  [GPU target >= 1.5x]"
            say(f"{side.name:48} {side.median:12.2f} {ratio:8.2f} {bound.share(side.median):6.0%}   "
                + ", ".join(f"{r['rate']:.2f}" for r in side.runs) + target_note)
    say()
    say("acceptance (accepted / proposed draft tokens, omlx-site's from its traces): timed runs; with the warm-ups")
    for sides in groups:
        for side in sides:
            if side.name != side.plain and not side.name.startswith("mlx_lm.server"):
                say(f"  {side.name:46} {acceptance(side.runs):>16}; {acceptance(side.warmups + side.runs):>16}")
                if side.name.startswith("omlx-site"):
                    say(f"    {drafted(side)}")
    say(f"  (omlx-site's policy: a mode counts once {MIN_TOKENS} tokens were timed in it; then one request in "
        f"{PROBE_EVERY} runs the slower mode; mlx_lm.server drafts every request and shows no counts)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-mb", type=float, default=None,
                   help="the target's size in MB (default 400 on the CPU backend, 8000 on a GPU, where a draft "
                        "pays only when the target's step is bandwidth-bound)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--bits", default="", help="quantized copies of the target as drafts too, e.g. 4,8")
    p.add_argument("--draft-tokens", type=int, default=3, help="tokens a draft proposes a round, on every side")
    p.add_argument("--groups", default="omlx,mlx_lm,raw", help="which groups run, in this order's subset")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a folder with tokenizer.json (default: the demo model)")
    args = p.parse_args()
    mb = args.target_mb or (400 if cpu_backend() else 8000)
    bits = sorted({int(b) for b in args.bits.split(",") if b})
    target, drafts = folders(mb, args.tokenizer or demo_model(), bits)
    bound = Bound(target)
    groups = []     # ours first: what a deadline cuts short is the others
    for name, title, run in (("omlx", "omlx-site", omlx_group), ("mlx_lm", "mlx_lm.server", mlx_lm_group),
                             ("raw", "raw mlx-lm, in this process", raw_group)):
        if name in args.groups.split(","):
            say(f"{title}:")
            groups.append(run(args, target, drafts))
    report(args, target, {label: megabytes(folder) for label, folder in drafts.items()}, bound, groups)


if __name__ == "__main__":
    main()
