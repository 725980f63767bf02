"""The prefix cache: the store over mlx-lm's LRUPromptCache with real KV arrays, then through a real
server with the demo model (warm output equals cold, the next turn hits, the counters agree)."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from prometheus_client.parser import text_string_to_metric_families

from pool.engines.disk_cache import DiskCache
from pool.engines.prompt_cache import PromptCache
from tests.pool.conftest import stored_bytes

DEMO = "smollm2-135m-instruct"


def kv(tokens: int, layers: int = 2) -> list[KVCache]:
    caches = [KVCache() for _ in range(layers)]
    for c in caches:
        c.update_and_fetch(mx.ones((1, 1, tokens, 8)), mx.ones((1, 1, tokens, 8)))
    return caches


def test_fetch_takes_the_longest_prefix_as_a_private_copy():
    store = PromptCache(max_bytes=10**9, max_entries=10)
    store.store(list(range(10)), kv(10))
    cache, cached = store.fetch(list(range(12)))                 # a shorter entry
    assert cached == 10 and cache[0].offset == 10
    cache[0].update_and_fetch(mx.ones((1, 1, 2, 8)), mx.ones((1, 1, 2, 8)))
    again, cached = store.fetch(list(range(12)))
    assert cached == 10 and again[0].offset == 10                # the stored entry was not touched
    trimmed, cached = store.fetch(list(range(5)))                # a longer entry, trimmed
    assert cached == 4 and trimmed[0].offset == 4               # one token is always left to compute
    exact, cached = store.fetch(list(range(10)))
    assert cached == 9
    assert store.fetch([7, 7, 7]) == (None, 0)
    assert (store.stats.hits, store.stats.misses, store.stats.tokens_saved) == (4, 1, 33)


def state(tokens_seen: int) -> list:
    """A recurrent state (an ArraysCache): its size does not depend on the tokens it has read."""
    from mlx_lm.models.cache import ArraysCache

    c = ArraysCache(1)
    c.cache = [mx.full((1, 4, 8), float(tokens_seen))]
    return [c]


def test_an_entry_that_cannot_be_trimmed_serves_only_prompts_that_extend_it():
    store = PromptCache(max_bytes=10**9, max_entries=10, trimmable=False)
    store.store(list(range(20)), state(20))                      # a finished request: prompt and answer
    assert store.fetch(list(range(10))) == (None, 0)             # a longer entry is no use: a state cannot trim
    store.store(list(range(9)), state(9))                        # the checkpoint one token short of the prompt
    cache, cached = store.fetch(list(range(10)))
    assert cached == 9 and cache[0].cache[0][0, 0, 0].item() == 9
    # an exact match cannot give its last token back: the checkpoint one short serves instead
    store.store(list(range(10)), state(10))
    cache, cached = store.fetch(list(range(10)))
    assert cached == 9 and cache[0].cache[0][0, 0, 0].item() == 9
    cache, cached = store.fetch(list(range(25)))
    assert cached == 20 and cache[0].cache[0][0, 0, 0].item() == 20


def test_a_state_sliced_from_a_batch_holds_only_its_own_rows():
    import gc

    from mlx_lm.models.cache import ArraysCache

    gc.collect()
    before = mx.get_active_memory()
    batch = mx.ones((8, 1000, 1000))       # a batch of 8 sequences' states, 32 MB
    mx.eval(batch)
    entry = ArraysCache(1)
    entry.cache = [batch[2:3]]              # what BatchGenerator's extract hands over: a view of it
    store = PromptCache(max_bytes=10**9, max_entries=10, trimmable=False)
    store.store([1, 2, 3], [entry])
    del batch, entry
    mx.eval(store._lru.fetch_nearest_cache("model", [1, 2, 3])[0][0].cache)
    gc.collect()
    assert mx.get_active_memory() - before <= 4_000_000 + 65536    # its own 4 MB, not the batch's 32
    assert store.nbytes == 4_000_000


def test_the_cache_never_holds_more_than_its_cap_or_its_entry_count():
    one = stored_bytes(kv(300))
    evicted = []
    store = PromptCache(max_bytes=int(3.5 * one), max_entries=5,
                        on_evict=lambda tokens, cache: evicted.append(tokens[0]))
    for i in range(12):
        store.store([1000 + i] + list(range(299)), kv(300))
        assert store.nbytes <= store.cap_bytes and store.entries <= 5
    assert store.entries == 3 and evicted == list(range(1000, 1009))   # least recently used first
    freed = store.set_cap(one)
    assert freed == 2 * one and store.entries == 1 and store.cap_bytes == one
    assert store.fetch([1011] + list(range(299)))[1] == 299            # the newest one is kept


def _chat(server, messages, **body):
    r = server.post("/v1/chat/completions", {"model": DEMO, "messages": messages, "max_tokens": 12,
                                             "temperature": 0, **body})
    assert r.status_code == 200, r.text
    reply = r.json()
    return reply["choices"][0]["message"]["content"], reply["usage"]


TURN = [{"role": "user", "content": "The knight and the dragon met at the old stone bridge at dawn. "
                                    "Tell me what happened next."}]


def test_a_warm_prefix_gives_the_cold_answer_and_the_next_turn_hits(start_server):
    server = start_server()
    cold, usage = _chat(server, TURN, cache_prompt=False)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert server.model(DEMO)["prompt_cache_entries"] == 0      # opted out: nothing stored
    first, usage = _chat(server, TURN)
    assert first == cold and usage["prompt_tokens_details"]["cached_tokens"] == 0
    warm, first_turn = _chat(server, TURN)
    assert warm == cold, (warm, cold)                            # greedy, token for token
    assert first_turn["prompt_tokens_details"]["cached_tokens"] == first_turn["prompt_tokens"] - 1

    second = TURN + [{"role": "assistant", "content": warm}, {"role": "user", "content": "And then?"}]
    _, usage = _chat(server, second)
    # the first turn's prompt and its answer came from the cache; only the new message was read
    assert usage["prompt_tokens_details"]["cached_tokens"] >= first_turn["prompt_tokens"], usage

    row = server.model(DEMO)
    assert row["prompt_cache_hits"] == 2 and row["prompt_cache_misses"] == 1
    assert row["prompt_cache_entries"] >= 1 and 0 < row["prompt_cache_bytes"] <= row["prompt_cache_cap_bytes"]
    assert row["kv_bytes"] == 0                                  # nothing running
    memory = server.pool()["memory"]
    assert memory["prompt_cache_bytes"] == row["prompt_cache_bytes"]
    assert memory["reclaimable_bytes"] >= memory["prompt_cache_bytes"]
    samples = {(s.name, s.labels.get("model")): s.value
               for f in text_string_to_metric_families(server.get("/metrics").text) for s in f.samples}
    assert samples[("prompt_cache_hits_total", DEMO)] == 2
    assert samples[("prompt_cache_bytes", DEMO)] == row["prompt_cache_bytes"]


def test_concurrent_requests_sharing_a_prefix_do_not_change_each_others_output(start_server):
    server = start_server()
    questions = ["What happened next?", "Who won?"]
    alone = {q: _chat(server, TURN + [{"role": "user", "content": q}], cache_prompt=False)[0] for q in questions}
    _chat(server, TURN)                                          # stores the shared prefix
    together = {}

    def ask(q):
        together[q] = _chat(server, TURN + [{"role": "user", "content": q}])
    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert {q: text for q, (text, _) in together.items()} == alone
    assert all(usage["prompt_tokens_details"]["cached_tokens"] > 0 for _, usage in together.values())


# ---- the disk tier ----------------------------------------------------------------------------

def test_spilled_entries_come_back_from_disk(tmp_path):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f1")
    one = stored_bytes(kv(100))
    store = PromptCache(max_bytes=int(1.5 * one), max_entries=10, disk=disk)
    store.store(list(range(100)), kv(100))
    store.store([5] + list(range(99)), kv(100))                  # pushes the first out: written to disk
    assert store.wait_for_spills(60)
    assert store.entries == 1 and disk.entries == 1
    cache, cached = store.fetch(list(range(100)) + [7, 8])
    assert cached == 100 and cache[0].offset == 100 and disk.stats.hits == 1
    cache, cached = store.fetch(list(range(40)))                  # a longer file, trimmed
    assert cached == 39 and cache[0].offset == 39

    again = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f1")   # a restart
    assert again.entries == 1 and again.longest_prefix(list(range(100)))[1] == 100
    changed = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f2")  # other weights
    assert changed.entries == 0 and not list((tmp_path / "m").glob("*.safetensors"))


def test_only_entries_that_leave_memory_are_written_and_an_unload_writes_what_is_left(tmp_path):
    """A finished turn's entry stays in memory unwritten (the next turn reuses it from there); one
    pushed out by newer entries is written, and clearing (an unload) writes the rest."""
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    one = stored_bytes(kv(30))
    store = PromptCache(max_bytes=int(2.5 * one), max_entries=10, disk=disk)
    store.store([0] * 30, kv(30))
    store.store([1] * 30, kv(30))
    assert store.wait_for_spills(60) and disk.entries == 0        # both in memory: nothing written
    store.store([2] * 30, kv(30))                                 # the third pushes the first out
    assert store.wait_for_spills(60)
    assert (store.entries, sorted(disk._index.values()), store.stats.spills_dropped) == (2, [[0] * 30], 0)
    store.clear()
    assert sorted(disk._index.values()) == [[0] * 30, [1] * 30, [2] * 30] and store.spilling == 0


def test_the_disk_tier_is_bounded_least_recently_used_first(tmp_path):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    for i in range(3):
        disk.put([i] * 50, kv(50))
    size = disk.nbytes // 3
    disk.load(disk.longest_prefix([0] * 50)[0])                   # 0 is now the most recently used
    disk.max_bytes = 2 * size
    disk.put([9] * 50, kv(50))
    assert sorted(disk._index.values()) == [[0] * 50, [9] * 50]
    assert disk.nbytes <= 2 * size


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_a_damaged_file_is_deleted_and_counted_as_a_miss(tmp_path, damage):
    disk = DiskCache(tmp_path / "m", max_bytes=10**9, fingerprint="f")
    disk.put(list(range(60)), kv(60))
    (name, _), = [disk.longest_prefix(list(range(60)))]
    path = tmp_path / "m" / name
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(b"\x00garbage" * 100)
    else:
        path.unlink()
    store = PromptCache(max_bytes=10**9, max_entries=10, disk=disk)
    assert store.fetch(list(range(60)) + [1]) == (None, 0)
    assert store.stats.misses == 1 and disk.entries == 0 and not path.exists()
    assert disk.stats.errors == 1


def test_a_spill_cut_short_is_never_served(tmp_path):
    folder = tmp_path / "m"
    disk = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    disk.put(list(range(30)), kv(30))
    (folder / "deadbeef.partial.safetensors").write_bytes(b"half a file")
    again = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    assert again.entries == 1 and not list(folder.glob("*.partial.safetensors"))


def test_a_chat_resumes_from_disk_after_an_unload_and_a_restart(start_server):
    server = start_server()
    _, first = _chat(server, TURN)
    assert server.post(f"/api/models/{DEMO}/unload", {}).status_code == 200     # its cache goes to disk
    _, again = _chat(server, TURN)
    assert again["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 1
    assert server.model(DEMO)["prompt_cache_disk_hits"] == 1
    server.stop()
    server.start()
    _, restarted = _chat(server, TURN)
    assert restarted["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 1
