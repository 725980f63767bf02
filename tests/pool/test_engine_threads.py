"""Engines run on kept threads: MLX leaves a native thread (with its stack and allocator caches) behind
for every thread that evaluated something, so a new thread per load grew the soak's resident memory
by ~0.4 MB a load. Loads and unloads must not add threads to the process."""

import os
import threading

import mlx.core as mx

from pool.engines.encoder import EmbeddingEngine
from pool.engines.generator import TextEngine
from pool.engines.protocol import SamplingParams
from pool.engines.threads import EngineThreads


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def evaluate() -> None:
    mx.eval(mx.arange(1000).sum())


def test_one_job_at_a_time_runs_on_one_thread_and_adds_no_native_threads():
    threads = EngineThreads()
    threads.start(evaluate, "job").join(10)
    before = native_threads()
    for i in range(20):
        running = threads.start(evaluate, f"job {i}")
        running.join(10)
        assert not running.is_alive()
    assert threads.count == 1 and native_threads() == before
    threads.end_idle()
    assert threads.count == 0


def test_jobs_at_once_get_threads_of_their_own_and_give_them_back():
    threads = EngineThreads()
    gate = threading.Event()
    names = []

    def hold():
        names.append(threading.current_thread().name)
        gate.wait(10)
        evaluate()
    running = [threads.start(hold, f"engine:{i}") for i in range(3)]
    gate.set()
    for r in running:
        r.join(10)
        assert not r.is_alive()
    assert threads.count == 3 and sorted(names) == ["engine:0", "engine:1", "engine:2"]
    for _ in range(5):
        threads.start(evaluate, "again").join(10)
    assert threads.count == 3
    threads.end_idle()


def test_a_job_that_raises_gives_its_thread_back():
    threads = EngineThreads()

    def fail():
        raise RuntimeError("boom")
    failed = threads.start(fail, "fails")
    failed.join(10)
    after = threads.start(evaluate, "next")
    after.join(10)
    assert not failed.is_alive() and not after.is_alive() and threads.count == 1
    threads.end_idle()


async def test_loading_and_unloading_real_engines_adds_no_threads(make_model, minilm_dir):
    folder = make_model("pool-a", 30, seed=0)

    async def cycle():
        engine = TextEngine("tiny", folder)
        await engine.load()
        async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=2)):
            pass
        await engine.stop()
        embedder = EmbeddingEngine("minilm", minilm_dir)
        await embedder.load()
        await embedder.embed([[101, 102]])
        await embedder.stop()
    await cycle()
    before = native_threads()
    for _ in range(6):
        await cycle()
    assert native_threads() == before
