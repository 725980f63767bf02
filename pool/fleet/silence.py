"""What the hop does when the serving host goes silent: no byte for OMLX_HOP_READ_TIMEOUT, before its
answer began or between two chunks. Silence alone proves nothing (a long prompt, a long answer sent
whole); the host is asked at /health, and only one that does not answer either is frozen (stopped,
swapped out, cut off). Pure: the proxy asks, this decides."""

from __future__ import annotations

from enum import StrEnum

HEALTH_SECONDS = 2.0        # how long a silent host has to answer /health


class Verdict(StrEnum):
    WAIT = "wait"           # it answers /health: busy, not frozen; wait another deadline
    RETRY = "retry"         # frozen, and the client has nothing yet: another host may serve it
    END = "end"             # frozen, and the client has part of a stream: end it with the dialect's error


def after_silence(*, host_answers: bool, client_has_bytes: bool) -> Verdict:
    if host_answers:
        return Verdict.WAIT
    return Verdict.END if client_has_bytes else Verdict.RETRY


def health_seconds(deadline: float) -> float:
    """The /health wait after a silence of `deadline`: a client waits at most their sum for a frozen host."""
    return min(HEALTH_SECONDS, deadline)
