"""The prompt cache's disk tier with real KV arrays: an entry that cannot fit never empties the tier
(N1), one total across models, files without the KV buffer's padding (N3), and spills written off
the engine thread while the entry stays servable from memory (issue 22)."""

from __future__ import annotations

import os
import shutil
import threading

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, load_prompt_cache

from pool.engines import spill as spill_module
from pool.engines.disk_cache import DiskCache
from pool.engines.disk_tier import DiskTier
from pool.engines.prompt_cache import PromptCache
from tests.pool.conftest import stored_bytes


def kv(tokens: int, layers: int = 2, heads: int = 2, dim: int = 16) -> list[KVCache]:
    caches = [KVCache() for _ in range(layers)]
    for i, c in enumerate(caches):
        keys = mx.random.normal((1, heads, tokens, dim), key=mx.random.key(tokens * 10 + i)).astype(mx.bfloat16)
        c.update_and_fetch(keys, keys + 1)
    mx.eval([c.keys for c in caches] + [c.values for c in caches])
    return caches


def served(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors") if not p.name.endswith(".partial.safetensors"))


# ---- N1: one request flushes the tier ---------------------------------------------------------

def test_an_entry_larger_than_the_cap_is_not_written_and_evicts_nothing(tmp_path):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    for i in range(3):
        assert disk.put([i] * 40, kv(40))
    size = disk.nbytes // 3
    disk.max_bytes = 4 * size
    assert not disk.put([9] * 400, kv(400))                       # ten times an entry: over the cap
    assert sorted(disk._index.values()) == [[i] * 40 for i in range(3)] and disk.stats.skipped == 1
    assert len(served(tmp_path / "m")) == 3
    assert disk.put([7] * 40, kv(40)) and disk.entries == 4       # room for one more: nothing evicted
    assert disk.put([8] * 40, kv(40))                             # full: only the oldest goes
    assert sorted(disk._index.values()) == [[1] * 40, [2] * 40, [7] * 40, [8] * 40]


def test_the_total_spans_every_models_folder_loaded_or_not(tmp_path):
    root = tmp_path / "prompt-cache"
    one = DiskCache(root / "old-model", max_bytes=10**9, fingerprint="f")
    one.put([1] * 40, kv(40))
    size = one.nbytes
    one.close()                                                   # that model is unloaded
    tier = DiskTier(root, total_bytes=3 * size + size // 2)       # a restart measures what is there
    assert tier.nbytes == size
    a = DiskCache(root / "a", max_bytes=10**9, fingerprint="f", tier=tier)
    b = DiskCache(root / "b", max_bytes=10**9, fingerprint="f", tier=tier)
    a.put([2] * 40, kv(40))
    b.put([3] * 40, kv(40))
    assert tier.nbytes == 3 * size and served(root / "old-model")
    b.put([4] * 40, kv(40))                                       # the least recently used file goes: old-model's
    assert not served(root / "old-model") and tier.nbytes == 3 * size
    a.load(a.longest_prefix([2] * 40)[0])                         # a's entry is used again
    os.utime(root / "a" / served(root / "a")[0], (2e9, 2e9))
    tier.used(root / "a" / served(root / "a")[0])
    b.put([5] * 40, kv(40))                                       # now b's oldest goes, and a is told
    assert sorted(b._index.values()) == [[4] * 40, [5] * 40] and a.entries == 1
    assert tier.nbytes == 3 * size <= tier.total_bytes
    assert not b.put([6] * 200, kv(200)) and tier.nbytes == 3 * size   # over the total: nothing goes


def test_auto_total_is_a_share_of_the_free_disk(tmp_path):
    tier = DiskTier(tmp_path / "prompt-cache", total_bytes=None)
    free = shutil.disk_usage(tmp_path).free
    assert 0 < tier.total_bytes <= free // 5


# ---- N3: the padding ---------------------------------------------------------------------------

def test_a_file_holds_only_the_used_part_of_the_kv_buffer(tmp_path):
    cache = kv(32, layers=4)
    assert cache[0].keys.shape[2] == 256                          # mlx-lm's buffer grows in 256-token steps
    used = sum(2 * c.offset * c.keys.shape[1] * c.keys.shape[3] * c.keys.itemsize for c in cache)
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    disk.put(list(range(32)), cache)
    (name,) = served(tmp_path / "m")
    assert disk.nbytes == (tmp_path / "m" / name).stat().st_size < used + 8192   # the header, no padding
    tokens, back = disk.load(name)
    assert tokens == list(range(32)) and [c.offset for c in back] == [32] * 4
    for got, want in zip(back, cache):
        assert mx.array_equal(got.keys, want.keys[..., :32, :]) and mx.array_equal(got.values, want.values[..., :32, :])
    back[0].update_and_fetch(mx.ones((1, 2, 3, 16), mx.bfloat16), mx.ones((1, 2, 3, 16), mx.bfloat16))
    assert back[0].offset == 35                                   # a loaded entry extends as any other


# ---- issue 22: spills off the engine thread ----------------------------------------------------

def test_a_short_entry_keeps_only_its_used_rows_in_memory_and_grows_again(tmp_path):
    """A KVCache's buffer grows 256 rows at a time: a 30-token entry kept whole would count 8.5x
    its KV. A request extending the entry grows it again, with the same rows first."""
    entry = kv(30)
    assert entry[0].keys.shape[2] == 256
    store = PromptCache(max_bytes=10**9, max_entries=4)
    store.store(list(range(30)), entry)
    assert store.nbytes == 2 * 2 * (2 * 30 * 16 * 2)              # layers x (keys, values) x used rows, bf16
    cache, cached = store.fetch(list(range(30)) + [5, 6])
    assert cached == 30
    more = mx.ones((1, 2, 2, 16), mx.bfloat16)
    keys, _ = cache[0].update_and_fetch(more, more)
    assert keys.shape[2] == 32 and cache[0].offset == 32
    assert mx.array_equal(keys[..., :30, :], kv(30)[0].keys[..., :30, :]) and mx.array_equal(keys[..., 30:, :], more)


@pytest.fixture
def slowed_writer(monkeypatch):
    """The writer thread stops after the first slice of its first file until `release` is set."""
    release, blocked = threading.Event(), threading.Event()
    real = spill_module.write_part

    def write_part(f, part):
        real(f, part)
        if not release.is_set():
            blocked.set()
            release.wait(120)
    monkeypatch.setattr(spill_module, "write_part", write_part)
    yield release, blocked
    release.set()


def test_an_entry_being_written_is_served_from_memory_and_no_half_file_is_served(tmp_path, slowed_writer):
    release, blocked = slowed_writer
    folder = tmp_path / "m"
    disk = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    one = stored_bytes(kv(60))
    store = PromptCache(max_bytes=int(1.5 * one), max_entries=10, disk=disk)
    first = list(range(60))
    store.store(first, kv(60))
    store.store([7] * 60, kv(60))                                 # pushes the first out: the writer takes it
    assert blocked.wait(60) and store.spilling == 1
    assert store.entries == 1 and disk.entries == 0
    assert not served(folder) and list(folder.glob("*.partial.safetensors"))   # only a half file, unserved
    cache, cached = store.fetch(first + [1, 2])                  # the next turn of that chat, mid-write
    assert cached == 60 and cache[0].offset == 60 and disk.stats.hits == 0
    assert mx.array_equal(cache[0].keys[..., :60, :], kv(60)[0].keys[..., :60, :])
    assert DiskCache(tmp_path / "restarted", max_bytes=10**9, fingerprint="f").entries == 0
    release.set()
    assert store.wait_for_spills(60) and store.spilling == 0 and store.nbytes == store._lru.nbytes
    assert len(served(folder)) == 1 and not list(folder.glob("*.partial.safetensors"))
    again = DiskCache(folder, max_bytes=10**9, fingerprint="f")    # a restart finds it whole
    (name,) = served(folder)
    assert again.load(name)[0] == first
    assert load_prompt_cache(str(folder / name))[0].offset == 60


def test_a_spill_waiting_for_the_writer_holds_no_engine_thread(tmp_path, slowed_writer):
    """The engine thread hands the entry over and goes on: storing, fetching and more evictions all
    return while the writer is stuck in its first file."""
    release, blocked = slowed_writer
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    one = stored_bytes(kv(30))
    store = PromptCache(max_bytes=int(3.5 * one), max_entries=2, disk=disk)
    for i in range(5):
        store.store([i] * 30, kv(30))                             # three leave memory, one by one
    assert blocked.wait(60) and store.spilling == 3 and disk.entries == 0
    for i in range(5):
        assert store.fetch([i] * 30 + [9])[1] == 30               # every entry: in memory or being written
    release.set()
    assert store.wait_for_spills(60)
    assert sorted(disk._index.values()) == [[i] * 30 for i in range(3)]


def test_a_file_is_read_only_when_it_adds_enough_to_what_memory_gives(tmp_path):
    """32 chats sharing a system prompt: memory serves that prefix; a file that shares one token more
    is not read (a whole file for a token), one that shares a real part of the prompt is."""
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    system = list(range(100, 140))
    disk.put(system + [1, 2, 3] + [7] * 200, kv(243))            # another chat's entry, on disk
    disk.put(system + [5] * 120, kv(160))                         # this chat's earlier turn, on disk
    store = PromptCache(max_bytes=10**9, max_entries=10, disk=disk)
    store.store(system + [9] * 60, kv(100))                       # in memory: the system prompt's 40
    assert store.fetch(system + [1, 2, 8, 8, 8])[1] == 40 and disk.stats.hits == 0   # 2 more: not read
    assert store.fetch(system + [5] * 120 + [6])[1] == 160 and disk.stats.hits == 1  # 120 more: read
    empty = PromptCache(max_bytes=10**9, max_entries=10, disk=disk)
    assert empty.fetch(system + [1, 2, 3, 4])[1] == 43           # nothing in memory: the file serves


# ---- a discrete GPU: byte views copy off the device, so they wait for an idle engine ------------

def test_a_deferred_spill_waits_for_its_views_until_asked_and_stays_servable(tmp_path):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    one = stored_bytes(kv(30))
    store = PromptCache(max_bytes=int(3.5 * one), max_entries=2, disk=disk, defer_spills=True)
    for i in range(4):
        store.store([i] * 30, kv(30))                             # two leave memory, neither prepared
    assert store.waiting_for_idle and store.spilling == 2
    assert store.wait_for_spills(0.1)                             # nothing was handed to the writer
    assert disk.entries == 0 and not list((tmp_path / "m").glob("*.safetensors"))
    assert store.nbytes == store._lru.nbytes + 2 * one            # still counted while they wait
    assert store.fetch([0] * 30 + [9])[1] == 30                   # and served from memory
    assert store.prepare_next_spill() and store.wait_for_spills(60)
    assert sorted(disk._index.values()) == [[0] * 30]             # the oldest first, one per call
    assert store.prepare_next_spill() and not store.prepare_next_spill() and not store.waiting_for_idle
    assert store.wait_for_spills(60) and sorted(disk._index.values()) == [[0] * 30, [1] * 30]


def test_a_shrink_prepares_the_deferred_spills_at_once(tmp_path):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    one = stored_bytes(kv(30))
    store = PromptCache(max_bytes=int(3.5 * one), max_entries=2, disk=disk, defer_spills=True)
    for i in range(3):
        store.store([i] * 30, kv(30))
    assert store.waiting_for_idle
    store.set_cap(0)                                              # pressure: memory is wanted now
    assert not store.waiting_for_idle and store.wait_for_spills(60)
    assert sorted(disk._index.values()) == [[i] * 30 for i in range(3)] and store.nbytes == 0


async def test_an_engine_takes_a_spills_views_only_while_no_request_runs(demo_model_dir, tmp_path, monkeypatch):
    """As on a discrete GPU: a finished request's entry pushes an older one out while another
    request decodes; its views are taken once that one has finished, and then it is written."""
    import asyncio

    from pool.engines import prompt_cache as prompt_cache_module
    from pool.engines.generator import TextEngine
    from pool.engines.protocol import PromptCacheOptions, SamplingParams
    from tests.conftest import as_the_pool_loads

    monkeypatch.setattr(prompt_cache_module, "discrete_gpu", lambda: True)
    running_at_prepare: list[int] = []
    real_prepare = DiskCache.prepare

    def prepare(self, tokens, cache, scope=None):
        running_at_prepare.append(len(engine._requests))
        return real_prepare(self, tokens, cache, scope)
    monkeypatch.setattr(DiskCache, "prepare", prepare)
    options = PromptCacheOptions(max_bytes=10**9, max_entries=1, folder=tmp_path / "prompt-cache" / "demo",
                                 disk_bytes=10**9, disk_total_bytes=10**9)
    engine = TextEngine("demo", demo_model_dir, load=as_the_pool_loads(demo_model_dir), prompt_cache=options)
    await engine.load()
    try:
        async def ask(text: str, params: SamplingParams) -> None:
            async for _ in engine.generate(engine.encode_text(text), params):
                pass
        no_end = tuple((t, -100.0) for t in engine._tokenizer.eos_token_ids)
        long = asyncio.ensure_future(ask("Tell me a long story.", SamplingParams(max_tokens=2000, logit_bias=no_end)))
        await ask("The knight met the dragon at the bridge.", SamplingParams(max_tokens=2))
        await ask("Another story, please.", SamplingParams(max_tokens=2))    # its entry pushes the first out
        assert not long.done() and running_at_prepare == []        # deferred while the long one decodes
        long.cancel()                                              # the engine is idle once it has left
        for _ in range(600):
            if served(tmp_path / "prompt-cache" / "demo"):
                break
            await asyncio.sleep(0.05)
        assert running_at_prepare and set(running_at_prepare) == {0}
        assert served(tmp_path / "prompt-cache" / "demo")
    finally:
        await engine.stop()


# ---- through a real server: a turn never waits for a spill ------------------------------------

DEMO = "smollm2-135m-instruct"


def _chat(server, messages):
    r = server.post("/v1/chat/completions", {"model": DEMO, "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    reply = r.json()
    return messages + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]}], reply["usage"]


def test_a_turn_after_a_finished_one_never_waits_for_a_spill(start_asgi_server, monkeypatch):
    """One entry in memory: each chat pushes the other's out, and the writer is stuck in that file.
    The next turn of either chat is answered (from memory) before the writer goes on."""
    from pool.catalog.model_ids import safe_name

    order: list[str] = []
    stuck, release = threading.Event(), threading.Event()
    real = spill_module.write_part

    def write_part(f, part):
        real(f, part)
        if not release.is_set():
            stuck.set()
            release.wait(60)
            order.append("the write went on")
            release.set()
    monkeypatch.setattr(spill_module, "write_part", write_part)
    server = start_asgi_server(OMLX_PROMPT_CACHE_ENTRIES="1", OMLX_PROMPT_CACHE_DISK_TOTAL="1GB")
    a, a1 = _chat(server, [{"role": "user", "content": "Tell me about the knight at the old stone bridge."}])
    b, b1 = _chat(server, [{"role": "user", "content": "Tell me about the dragon in the mountain cave."}])
    assert stuck.wait(60)                                         # a's entry left memory: being written
    _, b2 = _chat(server, b + [{"role": "user", "content": "And then?"}])
    order.append("b's next turn answered")
    _, a2 = _chat(server, a + [{"role": "user", "content": "And then?"}])
    order.append("a's next turn answered")
    release.set()
    assert b2["prompt_tokens_details"]["cached_tokens"] >= b1["prompt_tokens"]   # from memory
    assert a2["prompt_tokens_details"]["cached_tokens"] >= a1["prompt_tokens"]   # from the entry being written
    server.wait_for(lambda: server.model(DEMO)["prompt_cache_disk_entries"] >= 2)
    assert order[:2] == ["b's next turn answered", "a's next turn answered"], order

    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200
    folder = server.home / "prompt-cache" / safe_name(DEMO)
    files = [p for p in folder.glob("*.safetensors")]
    assert files and not [p for p in files if p.name.endswith(".partial.safetensors")]
    for path in files:                                            # the used rows only (N3)
        cache = load_prompt_cache(str(path))
        assert all(c.keys.shape[2] == c.offset for c in cache)
    memory = server.pool()["memory"]
    assert memory["prompt_cache_disk_bytes"] == sum(p.stat().st_size for p in files)
    assert memory["prompt_cache_disk_cap_bytes"] == 10**9


async def test_a_pressure_shrink_waits_for_its_spills_while_the_engine_serves(demo_model_dir, tmp_path, slowed_writer):
    """Memory pressure drops the cache: the shrink returns once the entries are written (their memory
    free), but it waits off the engine thread: a request is answered meanwhile."""
    import asyncio

    from pool.engines.generator import TextEngine
    from pool.engines.protocol import PromptCacheOptions, SamplingParams
    from tests.conftest import as_the_pool_loads

    release, blocked = slowed_writer
    options = PromptCacheOptions(max_bytes=10**9, max_entries=10, folder=tmp_path / "prompt-cache" / "demo",
                                 disk_bytes=10**9, disk_total_bytes=10**9)
    engine = TextEngine("demo", demo_model_dir, load=as_the_pool_loads(demo_model_dir), prompt_cache=options)
    await engine.load()
    try:
        async for _ in engine.generate(engine.encode_text("The knight met the dragon at the bridge."),
                                       SamplingParams(max_tokens=4)):
            pass
        shrink = asyncio.ensure_future(engine.shrink_prompt_cache(cap_bytes=0))
        assert await asyncio.to_thread(blocked.wait, 60)          # the entry left memory: being written
        chunks = [c async for c in engine.generate(engine.encode_text("Another story, please."),
                                                   SamplingParams(max_tokens=4))]
        assert chunks[-1].finish_reason is not None and not shrink.done()
        release.set()
        assert await asyncio.wait_for(shrink, 60) > 0
        assert served(tmp_path / "prompt-cache" / "demo")
    finally:
        release.set()
        await engine.stop()
