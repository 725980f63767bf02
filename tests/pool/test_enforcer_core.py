"""The enforcer's ladder in-process: a fake probe whose usage follows the fake engines, fixed lines."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pool.api.errors import status_of
from pool.errors import Busy, InvalidRequest
from pool.policy.kv import llama_layout
from pool.policy.vocabulary import Change
from pool.serving.completion import CompletionSpec
from tests.fakes import Core, Spec, model_folders

MB = 10**6
CEILING = 1000 * MB          # soft 900 MB, hard 950 MB


@pytest.fixture
def models(tmp_path):
    return model_folders(tmp_path / "models", a=100 * MB, b=100 * MB, c=100 * MB)


async def loaded(core: Core, *names: str) -> None:
    for name in names:
        await core.pool.load(name)
        core.clock.advance(1)


async def streaming(core: Core, model: str):
    """A long completion, read in the background until it ends; returns the reading task."""
    completion = await core.router.generate(CompletionSpec(model=model, prompt="x", max_tokens=10_000))
    first = asyncio.Event()

    async def read():
        async with completion:
            async for _ in completion.chunks():
                first.set()
    task = asyncio.ensure_future(read())
    await first.wait()
    return task


async def test_hard_pressure_is_relieved_by_reclaiming_the_cache_without_unloading(models):
    core = Core(models, memory_ceiling=CEILING)
    await loaded(core, "a", "b")
    core.memory.base, core.memory.cache = 560 * MB, 200 * MB          # 960 MB: hard
    decision = await core.enforcer.tick()
    assert [a.kind for a in decision.actions] == ["reclaim"]     # and nothing after the re-measure
    assert decision.level == core.enforcer.level == "ok" and not core.gate.paused
    assert core.states() == {"a": "loaded", "b": "loaded", "c": "unloaded"}
    assert core.events() == [("reclaim", "cache_reclaim", "")]
    assert core.pool.events.recent[-1]["freed_bytes"] == 200 * MB


async def test_soft_pressure_evicts_lru_idle_models_but_keeps_the_last_unpinned_one(models):
    core = Core(models, memory_ceiling=CEILING)
    await loaded(core, "a", "b", "c")
    core.memory.base = 620 * MB                                          # 920 MB: soft, no cache
    decision = await core.enforcer.tick()
    assert decision.level == "soft"
    assert core.events() == [("unload", "pressure_soft", "a")]
    assert core.enforcer.level == "ok"
    core.memory.base = 720 * MB                                          # 920 with b and c: soft again
    await core.enforcer.tick()
    assert core.states() == {"a": "unloaded", "b": "unloaded", "c": "loaded"}


async def test_pressure_drops_a_draft_model_before_evicting_any_model(models):
    draft = {"model": "d", "bytes": 40 * MB, "tokens": 3}
    core = Core(models, memory_ceiling=CEILING, specs={"b": Spec(model_info={"draft": draft})})
    await loaded(core, "a", "b")
    core.memory.base = 720 * MB                                          # 920 MB: soft; the draft frees 40
    decision = await core.enforcer.tick()
    assert [a.kind for a in decision.actions] == ["drop_draft"]
    assert core.events() == [("drop_draft", "pressure_soft", "b")]
    assert core.states() == {"a": "loaded", "b": "loaded", "c": "unloaded"}
    assert core.pool.entries["b"].measured_bytes == 60 * MB and core.enforcer.level == "ok"
    assert core.pool.views()[1].loaded_draft_bytes == 0


async def test_hard_pressure_aborts_loads_and_the_lru_busy_models_requests(models):
    core = Core(models, memory_ceiling=CEILING,
                specs={"a": Spec(tokens=10_000, token_seconds=0.005), "c": Spec(load_seconds=5)})
    await loaded(core, "a")
    stream = await streaming(core, "a")
    load = asyncio.ensure_future(core.pool.load("c"))
    while core.pool.entries["c"].state != "loading":
        await asyncio.sleep(0)
    core.memory.base = 900 * MB                                          # 1000 MB with a: at the ceiling, hard
    decision = await core.enforcer.tick()
    assert decision.level == "hard"
    assert [(a.kind, a.model) for a in decision.actions] == [("abort_load", "c"), ("abort_requests", "a")]
    with pytest.raises(Busy) as aborted:
        await stream
    assert aborted.value.code == "memory_pressure"
    with pytest.raises(Exception, match="aborted"):
        await load
    assert core.states()["c"] == "unloaded" and core.states()["a"] == "loaded"


async def test_an_emergency_marks_the_busy_model_and_the_mark_fires_once_it_drains(models):
    core = Core(models, memory_ceiling=CEILING, specs={"a": Spec(tokens=10_000, token_seconds=0.005)})
    await loaded(core, "a")
    lease = await core.router.generate(CompletionSpec(model="a", prompt="x"))   # admitted, not started
    core.memory.base = 3200 * MB                                         # ceiling + > 2 GiB: emergency
    decision = await core.enforcer.tick()
    assert decision.level == "emergency"
    assert [(a.kind, a.model) for a in decision.actions] == [("abort_requests", "a"), ("mark_unload", "a")]
    assert core.pool.entries["a"].marked_for_unload == "emergency"
    core.memory.base = 0
    await core.enforcer.tick()                                           # ok, but a is still leased
    assert core.states()["a"] == "loaded"
    await lease.aclose()
    await core.enforcer.tick()                                           # ok and idle: the mark fires
    assert core.states()["a"] == "unloaded"
    assert core.events()[-1] == ("unload", "emergency", "a")


async def test_paused_admission_waits_then_answers_503_with_retry_after(models):
    core = Core(models, memory_ceiling=CEILING, admission_wait=0.05, admission_queue=1)
    await loaded(core, "a")
    core.memory.base = 820 * MB                                          # soft; a, the last unpinned, stays
    await core.enforcer.tick()
    assert core.gate.paused
    waiting = asyncio.ensure_future(core.complete("a"))
    await asyncio.sleep(0)
    with pytest.raises(Busy, match="queue is full") as full:   # the one place is taken
        await core.complete("a")
    assert full.value.retry_after == 1
    with pytest.raises(Busy, match="stayed paused"):
        await waiting


async def test_a_waiting_request_goes_on_when_pressure_clears(models):
    core = Core(models, memory_ceiling=CEILING, admission_wait=5)
    await loaded(core, "a")
    core.memory.base = 820 * MB
    await core.enforcer.tick()
    waiting = asyncio.ensure_future(core.complete("a"))
    await asyncio.sleep(0.01)
    assert not waiting.done() and core.gate.waiting == 1
    core.memory.base = 0
    await core.enforcer.tick()
    assert len(await waiting) == 3


async def test_the_prefill_guard_refuses_a_prompt_whose_kv_cannot_fit(models):
    # 10 MB of KV per token: 60 prompt tokens need 600 MB, and 550 MB are left under the hard line
    per_token = {"kv_layout": llama_layout(layers=1, kv_heads=1, head_dim=2_500_000, bytes_per_element=2)}
    core = Core(models, memory_ceiling=CEILING, specs={"a": Spec(model_info=per_token)})
    await loaded(core, "a")
    core.memory.base = 300 * MB
    prompt = " ".join(["w"] * 60)
    with pytest.raises(InvalidRequest) as refused:
        await core.router.generate(CompletionSpec(model="a", prompt=prompt))
    assert refused.value.code == "prefill_memory_exceeded" and refused.value.param == "prompt"
    assert refused.value.facts["estimated_bytes"] == 600 * MB
    assert core.pool.entries["a"].leases == 0
    assert len(await core.complete("a")) == 3                            # a short prompt still runs


@pytest.mark.parametrize("prompt_tokens, status, code", [
    (20, None, None),                            # 200 MB: fits now, once MLX's cache is reclaimed
    (40, 503, "prefill_memory_busy"),            # 400 MB: only once the running request's KV is freed
    (60, 400, "prefill_memory_exceeded"),        # 600 MB: not even then
])
async def test_a_prompt_that_fits_only_once_running_requests_end_is_a_503_not_a_400(
        models, prompt_tokens, status, code):
    # 10 MB of KV per token. Usage 800 MB of the 950 MB hard line: a and b 100 MB each, b's running
    # request 300 MB of live KV, MLX's cache 100 MB (free to reclaim), 200 MB else. So 250 MB fit
    # now and 550 MB once b's request ends.
    per_token = {"kv_layout": llama_layout(layers=1, kv_heads=1, head_dim=2_500_000, bytes_per_element=2)}
    core = Core(models, memory_ceiling=CEILING,
                specs={"a": Spec(model_info=per_token), "b": Spec(tokens=10_000, token_seconds=0.005)})
    await loaded(core, "a", "b")
    running = await streaming(core, "b")
    core.memory.base, core.memory.kv["b"], core.memory.cache = 200 * MB, 300 * MB, 100 * MB
    spec = CompletionSpec(model="a", prompt=" ".join(["w"] * prompt_tokens), max_tokens=1)
    if status is None:
        async with await core.router.generate(spec):
            pass
    else:
        with pytest.raises((InvalidRequest, Busy)) as refused:
            await core.router.generate(spec)
        assert (status_of(refused.value), refused.value.code) == (status, code)
        assert isinstance(refused.value, Busy) is (status == 503)
    assert core.pool.entries["a"].leases == 0 and core.pool.entries["b"].leases == 1   # b ran throughout
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running                                                    # its lease ends before the loop does


async def test_shrinking_prompt_caches_takes_hard_to_soft_without_unloading(models):
    core = Core(models, memory_ceiling=CEILING, prompt_cache_bytes=300 * MB)
    await loaded(core, "a")
    core.engines.engines["a"].fill_prompt_cache(50 * MB)
    core.memory.base = 830 * MB                                          # 980 MB with a's cache: hard
    decision = await core.enforcer.tick()
    assert [a.kind for a in decision.actions] == ["reclaim"]
    assert core.memory.prompt_caches["a"] == 0                           # all of it, and still not under soft
    assert core.enforcer.level == "soft" and core.gate.paused
    assert core.states()["a"] == "loaded"                                # the last unpinned model stays
    assert core.events() == [("reclaim", "cache_reclaim", "a"), ("reclaim", "cache_reclaim", "")]
    assert core.pool.events.recent[0]["freed_bytes"] == 50 * MB


async def test_the_cache_shrinks_only_as_far_as_needed_least_recently_used_model_first(models):
    core = Core(models, memory_ceiling=CEILING, prompt_cache_bytes=300 * MB)
    await loaded(core, "a", "b")                                         # a used less recently
    core.engines.engines["a"].fill_prompt_cache(100 * MB)
    core.engines.engines["b"].fill_prompt_cache(100 * MB)
    core.memory.base = 560 * MB                                          # 960 MB: hard; 60 MB must go
    await core.enforcer.tick()
    assert core.memory.prompt_caches == {"a": 40 * MB - 1, "b": 100 * MB}
    assert core.enforcer.level == "ok" and core.states()["a"] == core.states()["b"] == "loaded"


async def test_pressure_walks_the_prompt_cache_cap_down_and_back_up(models):
    core = Core(models, memory_ceiling=CEILING, prompt_cache_bytes=80 * MB)
    await loaded(core, "a", "b")
    engine = core.engines.engines["a"]
    caps = []
    for base in (720, 720, 720, 0, 0, 0):                                # soft x3, then ok
        core.memory.base = base * MB
        for name in "ab":                                                # busy: soft evicts neither
            core.pool.entries[name].leases = 1 if base else 0
        await core.enforcer.tick()
        caps.append(engine.prompt_cache_cap // MB)
    assert caps == [40, 20, 10, 20, 40, 80]
    assert core.states() == {"a": "loaded", "b": "loaded", "c": "unloaded"}


@pytest.mark.parametrize("base, step, alone", [(0, 512, 2048), (720, 256, 256), (800, 128, 128)])
async def test_the_prefill_steps_shrink_under_pressure(models, base, step, alone):
    core = Core(models, memory_ceiling=CEILING, prefill_step_alone=2048)     # a GPU's default
    await loaded(core, "a", "b")
    for name in "ab":
        core.pool.entries[name].leases = 1                               # busy: nothing is evicted
    core.memory.base = base * MB
    await core.enforcer.tick()
    assert core.engines.engines["a"].prefill_step == core.pool.prefill_step == step
    assert core.engines.engines["a"].prefill_step_alone == core.pool.prefill_step_alone == alone
    await core.pool.load("c")                                            # a model loaded now starts with them
    assert (core.engines.engines["c"].prefill_step, core.engines.engines["c"].prefill_step_alone) == (step, alone)


async def test_a_model_unloaded_while_the_caches_are_walked_is_skipped(models):
    """Each shrink is an await: another model can go meanwhile (seen in the soak: the tick failed
    on the unloaded model's missing engine, or would wait forever on its stopped thread)."""
    core = Core(models, memory_ceiling=CEILING, prompt_cache_bytes=300 * MB)
    await loaded(core, "a", "b", "c")                                    # a used least recently
    for name in "abc":
        core.engines.engines[name].fill_prompt_cache(100 * MB)
    a, b = core.engines.engines["a"], core.engines.engines["b"]
    shrink_a = a.shrink_prompt_cache

    async def shrink_then_unload_b(**kw):
        freed = await shrink_a(**kw)
        await core.pool.unload("b")                                      # b goes while a's shrink returns
        return freed

    async def gone(**kw):
        raise AssertionError("the unloaded model's engine was called")
    a.shrink_prompt_cache, b.shrink_prompt_cache = shrink_then_unload_b, gone
    core.memory.base = 660 * MB                                          # 960 MB: hard
    await core.enforcer.tick()
    assert core.states() == {"a": "loaded", "b": "unloaded", "c": "loaded"}
    assert ("reclaim", "cache_reclaim", "a") in core.events()
    assert not [e for e in core.events() if e[0] == "reclaim" and e[2] == "b"]


# ---- what wakes the enforcer ------------------------------------------------------------------------

class Rows(list):
    """Telemetry that keeps its rows in a list."""

    def append(self, row) -> None:
        super().append(row)

    def flush(self) -> None:
        pass


async def test_short_requests_do_not_wake_the_enforcer_but_loads_and_kv_growth_do(models):
    """100 short requests to a loaded model: no tick of their own (under the old rule each start and
    end woke it: ~100 ticks in the ~1 s they take). A load and a KV growth report each wake it once;
    an idle model's TTL is honoured although no request end ticks. At most one telemetry row per
    poll interval."""
    core = Core(models, memory_ceiling=CEILING, idle_ttl=60,
                specs={"a": Spec(tokens=3, token_seconds=0.003), "b": Spec(load_seconds=0.05)})
    core.enforcer.telemetry = rows = Rows()
    await core.pool.load("a")
    core.enforcer.start()
    await asyncio.sleep(0.05)
    start_ticks, started = core.enforcer.ticks, asyncio.get_running_loop().time()
    for _ in range(100):
        await core.complete("a")
    elapsed = asyncio.get_running_loop().time() - started
    polls = int(elapsed / 1.0) + 1            # the busy poll: once a second
    assert elapsed > 0.5                      # long enough that a tick per request would show
    assert core.enforcer.ticks - start_ticks <= polls
    assert len(rows) <= polls + 1

    before = core.enforcer.ticks
    await core.pool.load("b")                 # a load moves memory: it wakes the enforcer
    await asyncio.sleep(0.1)
    assert core.enforcer.ticks > before

    before = core.enforcer.ticks
    core.pool.events.changed(Change.KV_GROWTH, "a")   # what an engine reports from its thread
    await asyncio.sleep(0.1)
    assert core.enforcer.ticks == before + 1

    core.clock.advance(61)                    # a's TTL ran out; a reschedule (not a tick) sees it
    core.pool.events.changed(Change.REQUEST_END, "a")
    await asyncio.sleep(0.3)
    assert core.states()["a"] == "unloaded"
    await core.enforcer.stop()
    await core.pool.shutdown()


async def test_the_enforcers_own_actions_do_not_wake_it(models):
    core = Core(models, memory_ceiling=CEILING)
    await loaded(core, "a", "b", "c")
    core.memory.base = 700 * MB               # 1000 MB in all: over the hard line
    core.enforcer.start()
    await asyncio.sleep(0.3)                  # the first tick evicts; the unloads it causes wake nothing
    assert core.enforcer.ticks == 1 and "unloaded" in core.states().values()
    await core.enforcer.stop()
    await core.pool.shutdown()
