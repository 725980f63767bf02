"""The request gate: what memory pressure closes, its bounded wait queue, and the prefill guard that
refuses a prompt whose KV cache cannot fit. The enforcer opens and closes the gate; the serving door
passes every request through it."""

from __future__ import annotations

import asyncio
import math
from typing import Callable

from ..errors import Busy, InvalidRequest
from ..memory import memory_lines
from ..policy.kv import KVConfig, kv_estimate
from ..policy.load_plan import ModelView, lru_victims
from ..policy.pressure import prefill_verdict
from ..policy.units import format_bytes
from ..policy.vocabulary import PrefillVerdict, Rejection


class RequestGate:
    def __init__(self, conf, probe, *, on_reject: Callable[[str], None] | None = None):
        self.conf = conf
        self.probe = probe
        self.on_reject = on_reject or (lambda reason: None)
        self.paused = False
        self.waiting = 0
        self.retry_after = 1
        self._open = asyncio.Event()
        self._open.set()

    def set_paused(self, paused: bool, *, retry_after: float = 1.0) -> None:
        self.paused = paused
        self.retry_after = max(1, math.ceil(retry_after))
        (self._open.clear if paused else self._open.set)()

    async def admit(self) -> None:
        """Let a new request in; while admission is paused, wait in a bounded queue, then 503."""
        if not self.paused:
            return
        if self.waiting >= self.conf.admission_queue:
            self.on_reject(Rejection.QUEUE_FULL)
            raise Busy("Memory pressure: admission is paused and the wait queue is full; "
                                     "retry shortly.", retry_after=self.retry_after)
        self.waiting += 1
        try:
            async with asyncio.timeout(self.conf.admission_wait):   # not wait_for: see enforcer._run
                await self._open.wait()
        except TimeoutError:
            self.on_reject(Rejection.TIMEOUT)
            raise Busy(f"Memory pressure: admission stayed paused for "
                                     f"{self.conf.admission_wait:g} s; retry shortly.",
                                     retry_after=self.retry_after) from None
        finally:
            self.waiting -= 1

    def check_prefill(self, model_id: str, model_info: dict, prompt_tokens: int, views: list[ModelView], *,
                      param: str, live_kv_bytes: int = 0, kv: KVConfig = KVConfig(), choices: int = 1,
                      prefill_chunk: int = 0) -> None:
        """Refuse up front a prompt whose KV cache (as its kv_bits / max_kv_size make it) cannot fit
        under the hard line once the caches are reclaimed and every idle model is evicted: a 400 when
        it would not fit even without the running requests' KV (`live_kv_bytes`), else a 503 to
        retry. A cached prefix does not lower it: the prompt cache hands each request a private copy
        of the prefix's KV. Each of `choices` holds its own; a prompt read `prefill_chunk` tokens at a
        time holds a chunk beyond a rotating layer's window meanwhile."""
        layout = model_info.get("kv_layout")
        if layout is None:
            return
        reading = self.probe.read()
        lines = memory_lines(self.conf, reading)
        if lines is None:
            return
        estimate = choices * kv_estimate(layout, tokens=prompt_tokens, config=kv, prefill_chunk=prefill_chunk)
        evictable = sum(v.footprint for v in lru_victims(views) if v.id != model_id)
        verdict = prefill_verdict(kv_estimate=estimate, usage=reading.usage, evictable_bytes=evictable,
                                  reclaimable_bytes=reading.reclaimable, live_kv_bytes=live_kv_bytes,
                                  hard_line=lines.hard)
        needs = f"The prompt ({prompt_tokens} tokens) needs about {format_bytes(estimate)} of KV cache"
        if verdict == PrefillVerdict.BUSY:
            self.on_reject(Rejection.PREFILL_BUSY)
            raise Busy(f"{needs}, which fits under the hard memory line "
                                     f"({format_bytes(lines.hard)}) only once running requests end; "
                                     "retry shortly.", code="prefill_memory_busy", retry_after=self.retry_after)
        if verdict == PrefillVerdict.TOO_LARGE:
            self.on_reject(Rejection.PREFILL)
            raise InvalidRequest(f"{needs}, which cannot fit under the hard memory line "
                             f"({format_bytes(lines.hard)}) even after evicting every idle model.",
                             param=param, code="prefill_memory_exceeded", estimated_bytes=estimate,
                             limit_bytes=max(0, lines.hard - reading.usage + evictable + reading.reclaimable
                                             + live_kv_bytes))
