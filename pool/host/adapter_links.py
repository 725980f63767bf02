"""What the engine pool does for adapters (pool/catalog/adapters.py): an adapter's request or load
holds its base (loaded first, never evicted meanwhile), its engine is made over the base's engine,
and a base is unloaded only after its adapters. Which models go first is decided in
policy/load_plan.py (with_adapters); this applies it."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

from ..policy.vocabulary import ModelState, Reason

if TYPE_CHECKING:
    from .engine_pool import EnginePool
    from .entries import Entry


@asynccontextmanager
async def base_held(pool: EnginePool, entry: Entry) -> AsyncIterator[None]:
    """For an adapter: its base loaded and leased while the block runs (nothing for a model)."""
    if entry.base is None:
        yield
        return
    base = pool.entry(entry.base)
    base.leases += 1
    base.last_access = pool.clock()
    try:
        await pool.ensure_loaded(base, requested_by=entry.id)
        yield
    finally:
        pool.end_lease(base, request=False)


def adapters_of(pool: EnginePool, base: Entry) -> list[Entry]:
    return [e for e in pool.entries.values() if e.base == base.id and e.state != ModelState.UNLOADED]


async def unload_adapters(pool: EnginePool, base: Entry, reason: Reason, requested_by: str | None) -> None:
    """Before a base goes: its adapters (they hold its weights), each recorded as unloaded."""
    await asyncio.gather(*(pool.unload_entry(a, reason=reason, requested_by=requested_by or base.id,
                                             detail=f"; its base '{base.id}' is unloaded")
                           for a in adapters_of(pool, base) if a.state != ModelState.FAILED), return_exceptions=True)
