"""Stop strings over streamed text: where one ends the text, and how much to hold back meanwhile."""

from __future__ import annotations


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def stop_found(text: str, stops: tuple[str, ...], at: int) -> str | None:
    """The stop string that find_stop found at `at` (the first listed, when several start there)."""
    return next((s for s in stops if s and text.startswith(s, at)), None)


def holdback(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still start a stop string (kept until we know)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                best = max(best, n)
                break
    return best
