"""Builders for the policy tables: models of a size in GiB, loaded and idle unless told otherwise."""

from __future__ import annotations

from pool.policy.load_plan import ModelView
from pool.policy.units import GIB


def gib(x: float) -> int:
    return int(x * GIB)


def model(id: str, size: float = 1, state: str = "loaded", **fields) -> ModelView:
    """A model of `size` GiB, loaded and idle unless told otherwise."""
    return ModelView(id=id, state=state, size_bytes=gib(size), **fields)


def unloaded(id: str, size: float = 1, **fields) -> ModelView:
    return model(id, size, state="unloaded", **fields)


# --- LRU victims ---------------------------------------------------------------------------
