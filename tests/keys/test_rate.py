"""The per-key request rate (pool/policy/rate.py): one row per case of the token bucket."""

from __future__ import annotations

import pytest

from pool.policy.rate import Bucket, take

# (the bucket before, per minute, now) -> (tokens after, wait)
ROWS = [
    ("a first request takes one of a minute's worth", None, 60, 0.0, 59.0, 0.0),
    ("the last token goes", Bucket(1.0, 0.0), 60, 0.0, 0.0, 0.0),
    ("empty: wait for one token (60/min = 1 s)", Bucket(0.0, 0.0), 60, 0.0, 0.0, 1.0),
    ("half refilled: wait for the other half", Bucket(0.0, 0.0), 60, 0.5, 0.5, 0.5),
    ("refilled in time: it goes", Bucket(0.0, 0.0), 60, 1.0, 0.0, 0.0),
    ("1/min: a minute between requests", Bucket(0.0, 0.0), 1, 0.0, 0.0, 60.0),
    ("never beyond a burst of a minute's worth", Bucket(3.0, 0.0), 5, 3600.0, 4.0, 0.0),
    ("a clock that steps back refills nothing", Bucket(0.0, 10.0), 60, 5.0, 0.0, 1.0),
]


@pytest.mark.parametrize("why, bucket, per_minute, now, tokens, wait", ROWS, ids=[r[0] for r in ROWS])
def test_take(why, bucket, per_minute, now, tokens, wait):
    after, waited = take(bucket, per_minute=per_minute, now=now)
    assert after.tokens == pytest.approx(tokens) and waited == pytest.approx(wait) and after.at == now


def test_a_refused_request_takes_nothing_so_a_retry_after_the_wait_goes():
    bucket, wait = take(Bucket(0.25, 0.0), per_minute=60, now=0.0)
    assert wait == pytest.approx(0.75)
    bucket, again = take(bucket, per_minute=60, now=wait)
    assert again == 0.0 and bucket.tokens == pytest.approx(0.0)
