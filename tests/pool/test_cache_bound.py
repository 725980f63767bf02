"""MLX's buffer cache is held within OMLX_MLX_CACHE_MAX by MLX itself (set as the enforcer starts),
and what passes it is cleared at every enforcer tick, even at ok (issue 22: an unload's weights sat
in the cache and a tick at ok did nothing). The decision as a table; the tick through the enforcer,
over the fake probe and engines."""

from __future__ import annotations

import pytest

from pool.policy.pressure import Readings, decide, pressure_lines
from tests.fakes import Core, model_folders

MB = 10**6
LINES = pressure_lines(1000 * MB)      # soft 900 MB


@pytest.mark.parametrize(("usage", "cache", "bound", "reclaimed", "actions"), [
    (300 * MB, 200 * MB, 100 * MB, False, ["reclaim"]),     # ok, the cache past its bound: cleared
    (300 * MB, 100 * MB, 100 * MB, False, []),              # at the bound: kept (it is reused)
    (300 * MB, 200 * MB, None, False, []),                  # no bound (off): only pressure clears it
    (300 * MB, 200 * MB, 100 * MB, True, []),               # the re-measure after the clear: once a tick
    (920 * MB, 200 * MB, None, False, ["reclaim"]),         # soft: the whole cache, bound or not
])
def test_the_cache_past_its_bound_is_cleared_at_any_level(usage, cache, bound, reclaimed, actions):
    readings = Readings(usage=usage, reclaimable=cache, lines=LINES, mlx_cache=cache, mlx_cache_max=bound)
    decision = decide(readings, [], over_ceiling_polls=0, reclaimed=reclaimed)
    assert [str(a.kind) for a in decision.actions] == actions


@pytest.mark.parametrize("ceiling", [1000 * MB, "off"])
async def test_a_tick_at_ok_clears_the_cache_past_its_bound_and_records_it(tmp_path, ceiling):
    core = Core(model_folders(tmp_path / "models", a=100 * MB), memory_ceiling=ceiling, mlx_cache_max=50 * MB)
    await core.pool.load("a")
    core.memory.cache = 40 * MB                        # under the bound: left alone
    await core.enforcer.tick()
    assert core.memory.cache == 40 * MB and core.events() == []
    core.memory.cache = 300 * MB                       # what an unload used to leave behind
    await core.enforcer.tick()
    assert core.memory.cache == 0 and core.enforcer.level == "ok"
    assert core.events() == [("reclaim", "cache_reclaim", "")]
    assert core.pool.events.recent[-1]["freed_bytes"] == 300 * MB


async def test_trims_at_ok_leave_at_most_one_history_row_a_minute(tmp_path):
    """A busy model's transient buffers pass the bound at every tick: cleared each time, one row."""
    core = Core(model_folders(tmp_path / "models", a=100 * MB), memory_ceiling="off", mlx_cache_max=50 * MB)
    await core.pool.load("a")
    for _ in range(3):
        core.memory.cache = 60 * MB
        await core.enforcer.tick()
        assert core.memory.cache == 0
    assert core.events() == [("reclaim", "cache_reclaim", "")]


async def test_the_enforcer_gives_mlx_its_bound_as_it_starts(tmp_path):
    """MLX holds its cache within the bound as buffers are freed, so a busy model's next step finds
    its buffers there; a tick's clear is only the backstop."""
    import mlx.core as mx

    core = Core(model_folders(tmp_path / "models", a=100 * MB), memory_ceiling="off", mlx_cache_max=50 * MB)
    before = mx.set_cache_limit(0)
    try:
        core.enforcer.start()
        assert mx.set_cache_limit(before) == 50 * MB
    finally:
        mx.set_cache_limit(before)
        await core.enforcer.stop()
