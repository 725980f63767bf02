"""Decision table for pool.policy.drafts: whether a lone request drafts, from what the model has
measured with its draft and without. Pure."""

from __future__ import annotations

import pytest

from pool.policy.drafts import (
    COLD_REQUESTS,
    MIN_TOKENS,
    PROBE_EVERY,
    DraftRecord,
    counts_rate,
    keeps_drafting,
    use_draft,
)

ENOUGH = MIN_TOKENS


def record(drafted=None, plain=None, *, proposed=0, accepted=0, requests=2) -> DraftRecord:
    return DraftRecord(drafted_seconds_per_token=drafted, plain_seconds_per_token=plain,
                       drafted_tokens=ENOUGH if drafted is not None else 0,
                       plain_tokens=ENOUGH if plain is not None else 0,
                       proposed=proposed, accepted=accepted, requests=requests)


@pytest.mark.parametrize("r, expected", [
    (DraftRecord(), True),                                                  # nothing known: try the draft
    (record(drafted=0.01), False),                                          # then plain decoding once
    (record(drafted=0.01, plain=0.02, proposed=30, accepted=27), True),     # drafting is faster
    (record(drafted=0.03, plain=0.02, proposed=30, accepted=27), False),    # it is slower
    (record(drafted=0.01, plain=0.02, proposed=30, accepted=3), False),     # faster, but below the acceptance floor
    (record(drafted=0.03, plain=0.02, proposed=30, accepted=27, requests=PROBE_EVERY - 1), True),   # a probe
    (record(drafted=0.01, plain=0.02, proposed=30, accepted=27, requests=PROBE_EVERY - 1), False),  # the other way
    (record(drafted=0.01, plain=0.02, proposed=30, accepted=3, requests=PROBE_EVERY - 1), True),    # probed anyway
    (record(proposed=18, accepted=0), False),       # its rate barely timed, but nothing it proposes is taken
    (record(proposed=MIN_TOKENS - 1, accepted=0), True),   # too few proposed to judge
], ids=["untried", "plain-untried", "faster", "slower", "low-acceptance", "probe-draft", "probe-plain",
        "probe-low-acceptance", "low-acceptance-untimed", "too-few-proposed"])
def test_use_draft(r, expected):
    assert use_draft(r, min_acceptance=0.3) is expected


@pytest.mark.parametrize("proposed, accepted, expected", [
    (MIN_TOKENS - 1, 0, True),          # too early to judge
    (MIN_TOKENS, 4, False),             # 25% < 30%
    (MIN_TOKENS, 5, True),              # 31%
    (60, 18, True),                     # exactly the floor
], ids=["early", "below", "above", "at-floor"])
def test_keeps_drafting(proposed, accepted, expected):
    assert keeps_drafting(proposed, accepted, min_acceptance=0.3) is expected


@pytest.mark.parametrize("r, drafted, expected", [
    (DraftRecord(), True, False),                                       # the first drafted request is cold
    (DraftRecord(drafted_requests=COLD_REQUESTS), True, True),
    (DraftRecord(drafted_requests=COLD_REQUESTS), False, False),        # plain decoding is still cold
    (DraftRecord(plain_requests=COLD_REQUESTS), False, True),
], ids=["drafted-cold", "drafted-warm", "plain-cold", "plain-warm"])
def test_counts_rate(r, drafted, expected):
    assert counts_rate(r, drafted=drafted) is expected
