"""A request rate per key, as a token bucket: `per_minute` requests a minute, a burst of as many,
refilled continuously. Pure: the caller keeps each key's bucket and passes the clock."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    tokens: float       # requests that may go now (fractions refill)
    at: float           # when `tokens` was counted (the caller's clock, seconds)


def take(bucket: Bucket | None, *, per_minute: int, now: float) -> tuple[Bucket, float]:
    """(the bucket after this request, 0.0 when it may go, else the seconds until one may). A refused
    request takes nothing: a client that retries after the wait is let through."""
    capacity = float(per_minute)
    tokens = capacity if bucket is None else min(capacity, bucket.tokens + max(0.0, now - bucket.at) * per_minute / 60)
    if tokens >= 1:
        return Bucket(tokens - 1, now), 0.0
    return Bucket(tokens, now), (1 - tokens) * 60 / per_minute
