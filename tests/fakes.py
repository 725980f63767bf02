"""The one place for fakes: a memory probe and a clock the test controls, and a small engine the
pool's `engine_factory` makes instead of an MLX one, so that the pool, the serving door and the
enforcer can be tested in-process in milliseconds. The real-model end-to-end tests stay."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pool.catalog.kinds import GENERATE
from pool.engines.protocol import (
    CacheStats,
    Chunk,
    LoadAborted,
    LoadResult,
    ReleaseResult,
    RequestAborted,
    SamplingParams,
)
from pool.memory import MemoryReading
from pool.policy.kv import llama_layout

MODEL_INFO = {"kv_layout": llama_layout(layers=2, kv_heads=1, head_dim=4, bytes_per_element=2), "context_length": 256}


class Clock:
    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Memory:
    """What the fake probe reports: a base, plus what the fake engines hold (weights and prompt
    caches), plus MLX's cache."""
    base: int = 0
    cache: int = 0
    total: int = 64 * 2**30
    held: dict[str, int] = field(default_factory=dict)   # model id -> bytes its engine's weights hold
    prompt_caches: dict[str, int] = field(default_factory=dict)   # model id -> its prompt cache's bytes
    kv: dict[str, int] = field(default_factory=dict)      # model id -> its running requests' live KV

    def active(self) -> int:
        return self.base + sum(self.held.values()) + sum(self.prompt_caches.values()) + sum(self.kv.values())

    def usage(self) -> int:
        return self.active() + self.cache


class FakeProbe:
    def __init__(self, memory: Memory):
        self.memory = memory

    def read(self) -> MemoryReading:
        m = self.memory
        active = m.active()
        return MemoryReading(active=active, cache=m.cache, peak=active, rss=0, total=m.total,
                             available=m.total - m.usage(), prompt_cache=sum(m.prompt_caches.values()))


class FakeEngine:
    """A TextGenerator (pool/engines/protocol.py) that loads in `load_seconds` (abortable) and streams
    `tokens` chunks of "t " `token_seconds` apart."""

    tokenizer = None
    vocab_size = None

    def __init__(self, model_id: str, path: Path, factory: "FakeEngines", *, prompt_cache=None, **options):
        self.model_id, self.path, self.factory = model_id, path, factory
        self.abort_load = False
        self.model_info: dict = {}
        self.prompt_cache_cap = prompt_cache.max_bytes if prompt_cache is not None else 0
        self.options = options
        self.prefill_step = self.prefill_step_alone = 2048
        self._running: set[asyncio.Queue] = set()

    @property
    def cache_stats(self) -> CacheStats:
        held = self.factory.memory.prompt_caches.get(self.model_id, 0)
        return CacheStats(kv_bytes=self.factory.memory.kv.get(self.model_id, 0), prompt_cache_bytes=held,
                          prompt_cache_entries=int(held > 0), prompt_cache_cap_bytes=self.prompt_cache_cap)

    def fill_prompt_cache(self, nbytes: int) -> None:
        """What finished requests would have stored (a test sets it), within the cap."""
        self.factory.memory.prompt_caches[self.model_id] = min(nbytes, self.prompt_cache_cap)

    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int:
        self.prompt_cache_cap = cap_bytes
        held = self.factory.memory.prompt_caches.get(self.model_id, 0)
        keep = max(0, min(cap_bytes, held - free_bytes))
        self.factory.memory.prompt_caches[self.model_id] = keep
        return held - keep

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        spec = self.factory.spec(self.model_id)
        while memory_free is not None and not memory_free.is_set():     # its victims are unloading
            await asyncio.sleep(0.001)
        remaining = spec.load_seconds
        while remaining > 0:
            if self.abort_load:
                raise LoadAborted("load aborted: process memory pressure")
            step = min(0.005, remaining)
            await asyncio.sleep(step)
            remaining -= step
        if spec.fail:
            raise OSError(spec.fail)
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        size = self.factory.memory_bytes(self.model_id, self.path)
        self.factory.memory.held[self.model_id] = size
        self.factory.loads[self.model_id] += 1
        self.model_info = {**MODEL_INFO, **spec.model_info}
        return LoadResult(measured_bytes=size, seconds=spec.load_seconds, model_info=self.model_info)

    async def drop_draft(self) -> int:
        """A draft named in the spec's model_info ({"draft": {"bytes": N}}): its bytes go."""
        draft = self.model_info.pop("draft", None)
        if not draft:
            return 0
        self.factory.memory.held[self.model_id] -= draft["bytes"]
        return draft["bytes"]

    async def stop(self, message: str = "the model was unloaded") -> ReleaseResult:
        self.abort_all(message, "model_unloaded")
        held = self.factory.memory.held.pop(self.model_id, 0) + self.factory.memory.prompt_caches.pop(self.model_id, 0)
        return ReleaseResult(active_before=held, active_after=0, rss_before=held, rss_after=0)

    async def call(self, fn):
        # The pool calls this only to clear MLX's cache on an engine thread: clear the fake one.
        self.factory.memory.cache = 0
        self.factory.calls += 1

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        for queue in list(self._running):
            queue.put_nowait(RequestAborted(message, code))

    def trim_heap(self) -> None:
        pass

    def prepare_constraints(self) -> None:
        pass

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.encode_text(" ".join(m["content"] for m in messages))

    def chat_checkpoints(self, messages: list[dict], tools: list[dict] | None, prompt: list[int]) -> tuple[int, ...]:
        return ()

    def encode_text(self, prompt: str) -> list[int]:
        return list(range(len(prompt.split())))

    async def generate(self, tokens: list[int], params: SamplingParams):
        spec = self.factory.spec(self.model_id)
        queue: asyncio.Queue = asyncio.Queue()
        self._running.add(queue)
        try:
            count = min(params.max_tokens, spec.tokens)
            for i in range(count):
                try:
                    error = await asyncio.wait_for(queue.get(), timeout=spec.token_seconds)
                except TimeoutError:
                    error = None
                if error is not None:
                    raise error
                finish = None
                if i == count - 1:
                    finish = "length" if count == params.max_tokens else "stop"
                yield Chunk("t ", finish, len(tokens), i + 1)
        finally:
            self._running.discard(queue)


@dataclass
class Spec:
    load_seconds: float = 0.0
    tokens: int = 3
    token_seconds: float = 0.0
    fail: str = ""
    model_info: dict = field(default_factory=dict)   # overrides MODEL_INFO (the KV shape)


class FakeEngines:
    """The pool's engine_maker: `FakeEngines(memory, b=Spec(load_seconds=0.2))`. Counts loads. Chat
    models get a FakeEngine; an embedding model (a real folder, MiniLM) its real engine."""

    def __init__(self, memory: Memory, **specs: Spec):
        self.memory = memory
        self.specs = specs
        self.loads: Counter[str] = Counter()
        self.engines: dict[str, FakeEngine] = {}
        self.calls = 0

    def spec(self, model_id: str) -> Spec:
        return self.specs.get(model_id, Spec())

    def memory_bytes(self, model_id: str, path: Path) -> int:
        if (path / "adapters.safetensors").is_file():       # adapter_folder's
            return (path / "adapters.safetensors").stat().st_size
        return json.loads((path / "config.json").read_text()).get("fake_bytes", 0)

    def __call__(self, kind, model_id: str, path: Path, **options):
        if kind.protocol != GENERATE:
            return kind.make_engine(model_id, path, **options)
        engine = FakeEngine(model_id, path, self, **options)
        self.engines[model_id] = engine
        return engine


def model_folders(root: Path, **sizes: int) -> Path:
    """Folders the pool discovers: config.json and a sparse weights file of `size` bytes each."""
    for name, size in sizes.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "fake_bytes": size}))
        with open(folder / "model.safetensors", "wb") as f:
            f.truncate(size)
    return root


def adapter_folder(root: Path, name: str, base: str, size: int) -> Path:
    """An adapter folder over the model folder `root/base` (mlx-lm's files; a sparse weights file)."""
    folder = root / name
    folder.mkdir(parents=True)
    config = {"model": str((root / base).resolve()), "fine_tune_type": "lora", "num_layers": 4,
              "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0}}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with open(folder / "adapters.safetensors", "wb") as f:
        f.truncate(size)
    return folder


class Core:
    """This process as a host (pool/host/local.py) over fake engines and a fake probe, behind the
    router, in this event loop: what Runtime wires, minus Django, the database and the broadcaster."""

    def __init__(self, models_dir: Path, *, specs: dict[str, Spec] | None = None, **settings):
        from pool.conf import get_settings
        from pool.host.local import LocalHost
        from pool.router import Router

        values = {"model_dirs": (models_dir,), "max_model_memory": "off", "max_loaded_models": 0, "idle_ttl": None,
                  "memory_ceiling": "off", "admission_wait": 0.2, "admission_queue": 4, **settings}
        self.conf = get_settings().with_values(**values)
        self.memory = Memory()
        self.probe = FakeProbe(self.memory)
        self.clock = Clock()
        self.engines = FakeEngines(self.memory, **(specs or {}))
        self.host = LocalHost(self.conf, self.probe, clock=self.clock, engine_maker=self.engines)
        self.pool, self.gate, self.enforcer = self.host.pool, self.host.gate, self.host.enforcer
        self.router = Router([self.host])
        self.router.rediscover()

    def states(self) -> dict[str, str]:
        return {e.id: str(e.state) for e in self.pool.entries.values()}

    def events(self) -> list[tuple[str, str, str]]:
        """(action, reason, model) of every event, oldest first."""
        return [(str(e["action"]), str(e["reason"]), e["model"] or "") for e in self.pool.events.recent]

    def settings(self, model_id: str, **values) -> None:
        """A ModelSettings row's values, as the admin or the API would set them."""
        self.router.apply_model_settings(model_id, values)

    async def complete(self, model: str, **spec) -> list[Chunk]:
        from pool.serving.completion import CompletionSpec

        async with await self.router.generate(CompletionSpec(model=model, prompt="a b c", **spec)) as c:
            return [chunk async for chunk in c.chunks()]
