"""The prompt cache isolated per API key (issue 23): an entry made in one scope is never reused in
another, in memory, while it is written, or on disk, and a restart (a new DiskCache on the folder)
keeps the scopes apart. Real KV arrays, mlx-lm's LRUPromptCache."""

from __future__ import annotations

import json

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from pool.engines.disk_cache import DiskCache
from pool.engines.prompt_cache import PromptCache

PROMPT = list(range(40))


def kv(tokens: int) -> list[KVCache]:
    caches = [KVCache() for _ in range(2)]
    for c in caches:
        c.update_and_fetch(mx.ones((1, 1, tokens, 8)), mx.ones((1, 1, tokens, 8)))
    mx.eval([c.keys for c in caches])
    return caches


def test_in_memory_a_scope_reuses_only_its_own_prefixes():
    store = PromptCache(max_bytes=10**9, max_entries=10)
    store.store(PROMPT, kv(40), scope="alice")
    assert store.fetch(PROMPT + [1], scope="bob") == (None, 0)
    assert store.fetch(PROMPT + [1]) == (None, 0)                        # nor the shared scope
    assert store.fetch(PROMPT + [1], scope="alice")[1] == 40
    store.store(PROMPT, kv(40))                                          # a sharing key's entry
    assert store.fetch(PROMPT + [1])[1] == 40 and store.fetch(PROMPT + [1], scope="bob") == (None, 0)
    assert store.entries == 2


def test_on_disk_the_scope_is_in_the_name_the_file_and_the_index_across_a_restart(tmp_path):
    folder = tmp_path / "model"
    disk = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    assert disk.put(PROMPT, kv(40), "alice") and disk.put(PROMPT, kv(40))
    assert disk.entries == 2                                           # the same tokens, two files
    assert disk.longest_prefix(PROMPT, "bob") is None
    again = DiskCache(folder, max_bytes=10**9, fingerprint="f")         # a restart
    name, shared = again.longest_prefix(PROMPT, "alice")
    assert shared == 40 and again.load(name, "alice") is not None
    assert again.load(name, "bob") is None                             # a file asked for by another scope
    assert again.entries == 1 and again.longest_prefix(PROMPT, "alice") is None   # is dropped, never served
    index = json.loads((folder / "index.json").read_text())
    assert index["scopes"] == {}                                       # the shared entry is what is left
    assert again.longest_prefix(PROMPT)[1] == 40


def test_an_entry_pushed_to_disk_keeps_its_scope_while_written_and_after(tmp_path):
    disk = DiskCache(tmp_path / "model", max_bytes=10**9, fingerprint="f")
    store = PromptCache(max_bytes=10**9, max_entries=1, disk=disk)
    store.store(PROMPT, kv(40), scope="alice")
    store.store([9] * 10, kv(10), scope="bob")                         # pushes alice's entry out
    assert store.fetch(PROMPT + [1], scope="bob") == (None, 0)         # pending or written: not bob's
    store.wait_for_spills()
    assert disk.entries == 1 and disk.longest_prefix(PROMPT, "alice")[1] == 40
    assert store.fetch(PROMPT + [1], scope="bob") == (None, 0) and store.fetch(PROMPT + [1]) == (None, 0)
    assert store.fetch(PROMPT + [1], scope="alice")[1] == 40
