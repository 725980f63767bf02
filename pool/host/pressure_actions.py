"""What the memory enforcer does to this host's models, each one verb and each an event: evict,
abort a load, abort requests, mark for unload, walk the prompt caches' cap, adapt the prefill step,
reclaim caches. A collaborator of the engine pool: the enforcer decides (pool.policy.pressure), these
verbs act on the pool's entries. A decision names models by id; one that was re-discovered away
meanwhile is left alone."""

from __future__ import annotations

import asyncio

from ..catalog.kinds import GENERATE
from ..engines.protocol import RequestAborted
from ..policy.pressure import next_cache_fraction, prefill_step
from ..policy.units import format_bytes
from ..policy.vocabulary import ActionKind, Level, ModelState, Reason
from .engine_pool import EnginePool
from .entries import Entry


class PressureActions:
    def __init__(self, pool: EnginePool):
        self.pool = pool

    async def evict(self, model_id: str, *, reason: Reason, detail: str = "") -> None:
        """Unload an idle model (the enforcer's decision already checked it may go)."""
        if (entry := self.pool.entries.get(model_id)) is not None:
            await self.pool.unload_entry(entry, reason=reason, detail=detail)

    async def abort_load(self, model_id: str, *, reason: Reason, detail: str) -> None:
        entry = self.pool.entries.get(model_id)
        if entry is not None and entry.state == ModelState.LOADING and entry.engine is not None:
            entry.engine.abort_load = True
            await self._event(ActionKind.ABORT_LOAD, reason, entry, detail)

    async def abort_requests(self, model_id: str, *, reason: Reason, message: str, code: str) -> None:
        """End the model's running requests with `message`; the model stays loaded."""
        entry = self.pool.entries.get(model_id)
        if entry is None or entry.engine is None:
            return
        entry.engine.abort_all(message, code)
        await self._event(ActionKind.ABORT_REQUESTS, reason, entry,
                          f"{entry.leases} request(s) of '{entry.id}' aborted: {message}")

    async def drop_draft(self, model_id: str, *, reason: Reason, detail: str) -> None:
        """Let go of the model's draft model (the model stays, decoding plainly, until its next load)."""
        entry = self.pool.entries.get(model_id)
        if entry is None or entry.state != ModelState.LOADED or not hasattr(entry.engine, "drop_draft"):
            return
        freed = await entry.engine.drop_draft()
        if freed and entry.measured_bytes is not None:
            entry.measured_bytes -= freed
        await self._event(ActionKind.DROP_DRAFT, reason, entry,
                          f"the draft of '{entry.id}' ({format_bytes(freed)}) dropped: {detail}")

    async def mark_for_unload(self, model_id: str, *, reason: Reason) -> None:
        if (entry := self.pool.entries.get(model_id)) is None:
            return
        entry.marked_for_unload = reason
        await self._event(ActionKind.MARK_UNLOAD, reason, entry,
                          f"'{entry.id}' will be unloaded when its requests drain")

    def adapt_prefill(self, level: Level) -> None:
        """The prefill steps every generator reads from its next step on (policy.pressure.prefill_step)."""
        pool = self.pool
        pool.prefill_step = prefill_step(level, pool.conf.prefill_step)
        pool.prefill_step_alone = prefill_step(level, pool.conf.prefill_step_alone)
        for entry in pool.loaded(protocol=GENERATE):
            entry.engine.prefill_step, entry.engine.prefill_step_alone = pool.prefill_step, pool.prefill_step_alone

    async def walk_cache_cap(self, level: Level) -> None:
        """One step of the prompt caches' cap per enforcer tick (policy.pressure.next_cache_fraction)."""
        fraction = next_cache_fraction(self.pool.cache_fraction, level)
        if fraction != self.pool.cache_fraction:
            self.pool.cache_fraction = fraction
            await self._shrink_prompt_caches(free_bytes=0)

    async def reclaim_caches(self, *, target_usage: int | None = None) -> int:
        """Free what costs nothing, cheapest to lose first: prompt cache entries of the least recently
        used models (down to the walked cap, and further until usage is at most `target_usage`),
        then the kept tokenizers, MLX's buffer cache and glibc's free pages. Each shrink is an event;
        returns bytes freed."""
        from ..engines.loading import forget_tokenizers

        probe = self.pool.probe
        need = max(0, probe.read().usage - target_usage) if target_usage is not None else 0
        freed_caches = await self._shrink_prompt_caches(free_bytes=need)
        forget_tokenizers()
        return freed_caches + await self.trim_mlx_cache()

    def bound_mlx_cache(self, limit: int | None) -> None:
        """MLX's own bound on its buffer cache (OMLX_MLX_CACHE_MAX), set once as the enforcer starts."""
        from ..engines.memory_release import bound_cache

        bound_cache(limit)

    async def trim_mlx_cache(self, *, record: bool = True) -> int:
        """Clear MLX's buffer cache and glibc's free pages (at ok, when the cache outgrew
        OMLX_MLX_CACHE_MAX): with `record`, an event with what the device got back; returns the bytes freed."""
        from ..engines.memory_release import reclaim_cache

        probe = self.pool.probe
        before = probe.read()
        loaded = self.pool.loaded()
        try:
            await (loaded[0].engine.call(reclaim_cache) if loaded else asyncio.to_thread(reclaim_cache))
        except RequestAborted:        # that model unloaded meanwhile, which cleared the cache itself
            pass
        after = probe.read()
        freed = max(0, before.usage - after.usage)
        if record:
            await self.pool.events.record(
                action=ActionKind.RECLAIM, reason=Reason.CACHE_RECLAIM, bytes_before=before.usage,
                bytes_after=after.usage, freed_bytes=freed,
                detail=f"MLX cache {format_bytes(before.cache)} -> {format_bytes(after.cache)}")
        return freed

    async def _shrink_prompt_caches(self, *, free_bytes: int) -> int:
        cap = int(self.pool.prompt_cache_cap() * self.pool.cache_fraction)
        freed_total = 0
        for entry in sorted(self.pool.loaded(protocol=GENERATE), key=lambda e: (e.last_access, e.id)):
            engine = entry.engine     # each await below lets other models load and unload meanwhile
            if entry.state != ModelState.LOADED or engine is None:
                continue
            before = self.pool.probe.read().usage
            try:
                freed = await engine.shrink_prompt_cache(cap_bytes=cap, free_bytes=max(0, free_bytes - freed_total))
            except RequestAborted:    # unloaded while the call waited: nothing of it left to shrink
                continue
            if freed:
                freed_total += freed
                await self.pool.events.record(
                    action=ActionKind.RECLAIM, reason=Reason.CACHE_RECLAIM, model_id=entry.id, freed_bytes=freed,
                    bytes_before=before, bytes_after=self.pool.probe.read().usage,
                    detail=f"prompt cache of '{entry.id}' shrunk by {format_bytes(freed)} (cap {format_bytes(cap)})")
        return freed_total

    async def _event(self, action: ActionKind, reason: Reason, entry: Entry, detail: str) -> None:
        usage = self.pool.probe.read().usage
        await self.pool.events.record(action=action, reason=reason, model_id=entry.id,
                                      estimated_bytes=entry.size_bytes, bytes_before=usage, bytes_after=usage,
                                      detail=detail)
