"""Summarise a py-spy raw profile (`py-spy record -f raw --threads`): per thread, the share of samples
and the functions with the most samples, by self time and by total time (standard library only, so it
runs where the profile was taken).
    python3 benchmarks/profile_summary.py PROFILE.txt [--top 20]"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

THREAD = re.compile(r"^(thread|process) ")


def parse(path: str):
    """-> {thread: Counter(stack tuple -> samples)}"""
    threads: dict[str, Counter] = defaultdict(Counter)
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            head = [fr for fr in frames if THREAD.match(fr)]
            thread = head[-1] if head else "?"
            frames = tuple(_short(fr) for fr in frames if not THREAD.match(fr))
            threads[thread][frames] += int(count)
    return threads


def _short(frame: str) -> str:
    """`fn (path/to/module.py:123)` -> `fn (module.py)`: lines split one function into many rows."""
    m = re.match(r"^(.*?) \((.*?)(:\d+)?\)$", frame)
    if not m:
        return frame
    return f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    threads = parse(a.profile)
    total = sum(sum(c.values()) for c in threads.values()) or 1
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(stacks.values())
        if n < total * 0.02:
            continue
        own, incl = Counter(), Counter()
        for frames, count in stacks.items():
            if frames:
                own[frames[-1]] += count
            for fr in set(frames):
                incl[fr] += count
        print(f"\n== {thread}: {n} samples ({100 * n / total:.0f}% of all)")
        print(f"  {'self':>6}  function")
        for fr, c in own.most_common(a.top):
            print(f"  {100 * c / n:5.1f}%  {fr}")
        print(f"  {'total':>6}  function")
        for fr, c in incl.most_common(a.top):
            print(f"  {100 * c / n:5.1f}%  {fr}")


if __name__ == "__main__":
    main()
