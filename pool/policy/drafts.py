"""Whether a request decoding alone uses its model's draft (speculative decoding), from what this
model has measured so far: seconds per generated token with the draft and without, and the share of
proposed tokens its target accepted. Pure: the engine keeps the numbers (engines/drafting.py)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKENS = 16        # a mode's rate counts once this many tokens were timed in it
PROBE_EVERY = 8        # then one request in this many runs the other mode, to keep its rate fresh


@dataclass(frozen=True)
class DraftRecord:
    drafted_seconds_per_token: float | None = None   # moving averages, per generated token
    plain_seconds_per_token: float | None = None
    drafted_tokens: int = 0                          # generated tokens timed in each mode
    plain_tokens: int = 0
    proposed: int = 0                                # draft tokens proposed and accepted, all requests
    accepted: int = 0
    requests: int = 0                                # decisions made so far


def acceptance(record: DraftRecord) -> float | None:
    return record.accepted / record.proposed if record.proposed else None


def use_draft(record: DraftRecord, *, min_acceptance: float) -> bool:
    """Draft for the next request? First the draft is tried, then plain decoding once, then the
    faster per token; one request in PROBE_EVERY runs the slower mode. Below `min_acceptance` the
    draft is used only for those probes."""
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
