"""Whether a request decoding alone uses its model's draft (speculative decoding), from what this
model has measured so far: seconds per generated token with the draft and without, and the share of
proposed tokens its target accepted. Pure: the engine keeps the numbers (engines/drafting.py)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKENS = 16        # a mode's rate counts once this many tokens were timed in it
PROBE_EVERY = 8        # then one request in this many runs the other mode, to keep its rate fresh
COLD_REQUESTS = 1      # a mode's first requests compile its kernels: their rates are not counted


@dataclass(frozen=True)
class DraftRecord:
    drafted_seconds_per_token: float | None = None   # moving averages, per generated token
    plain_seconds_per_token: float | None = None
    drafted_tokens: int = 0                          # generated tokens timed in each mode
    plain_tokens: int = 0
    drafted_requests: int = 0                        # requests that ended in each mode, the cold ones too
    plain_requests: int = 0
    proposed: int = 0                                # draft tokens proposed and accepted, all requests
    accepted: int = 0
    requests: int = 0                                # decisions made so far


def acceptance(record: DraftRecord) -> float | None:
    return record.accepted / record.proposed if record.proposed else None


def counts_rate(record: DraftRecord, *, drafted: bool) -> bool:
    """Whether the rate of a request that just ended in this mode counts: not while the mode is cold
    (on a GPU the first drafted request ran 7x slower than the next ones, compiling the draft's and
    the verify pass's kernels, and with it counted the draft never won again)."""
    done = record.drafted_requests if drafted else record.plain_requests
    return done >= COLD_REQUESTS


def use_draft(record: DraftRecord, *, min_acceptance: float) -> bool:
    """Draft for the next request? First the draft is tried, then plain decoding, each until
    MIN_TOKENS were timed in it (counts_rate), then the faster per token; one request in PROBE_EVERY
    runs the slower mode. Below `min_acceptance` the draft is used only for those probes."""
    probe = record.requests % PROBE_EVERY == PROBE_EVERY - 1
    rate = acceptance(record)
    if record.proposed >= MIN_TOKENS and rate is not None and rate < min_acceptance:
        return probe            # whatever its speed so far: it proposes what the model does not take
    if record.drafted_tokens < MIN_TOKENS:
        return True
    if record.plain_tokens < MIN_TOKENS:
        return False
    faster = (record.drafted_seconds_per_token or 0) < (record.plain_seconds_per_token or 0)
    return faster != probe


def keeps_drafting(proposed: int, accepted: int, *, min_acceptance: float) -> bool:
    """Within one request: go on with the draft while the target accepts enough of it (judged once
    MIN_TOKENS were proposed)."""
    return proposed < MIN_TOKENS or accepted >= min_acceptance * proposed
