"""Process-level MLX housekeeping shared by every engine thread."""

import gc
import threading
import weakref

import mlx.core as mx

from ..libc import malloc_trim

_MALLOC_TRIM = malloc_trim()


# MLX's active memory is one counter for the whole process. An unload measures what it freed as the
# counter's fall across its release, so a load filling its weights meanwhile must not move it: both
# take this lock (a load per group of weights, an unload for its measured release).
ACCOUNTING = threading.Lock()


def trim_native_heap() -> None:
    """Hand freed heap pages back to the OS. On Linux the CPU backend frees into glibc's heap,
    so resident memory only falls after malloc_trim (measured: 185 MB -> 142 MB)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def release_memory() -> None:
    """What every unload does, on the thread that owned the arrays, once nothing of it (no frame,
    lane or generator) holds them any more. An array freed after the cache is cleared stays in MLX's
    buffer cache (measured on an H200: a whole 20 GB model, until the process exited), so the order
    is: collect, wait for the thread's GPU work (CUDA's completion handlers hold the buffers a kernel
    read until it has run), clear the cache, then synchronize again, which hands the buffers that
    CUDA's memory pool freed asynchronously back to the driver."""
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    mx.synchronize()
    trim_native_heap()


def bound_cache(limit: int | None) -> None:
    """Keep MLX's buffer cache within `limit` bytes as buffers are freed (None: MLX's default, a
    share of the device's memory). MLX then frees only what passes the bound, where clearing the
    whole cache from outside would drop the buffers a busy model's next step reuses."""
    if limit is not None:
        mx.set_cache_limit(limit)


def reclaim_cache() -> None:
    """The cheap reclaim: MLX's buffer cache (process-wide) and glibc's free pages; no gc pass."""
    mx.clear_cache()
    trim_native_heap()


class Watched:
    """Weak references to a model and its weights, taken at load: after a release, what is still
    alive is held by something the release missed (a frame, a lane, a generator, a traceback)."""

    def __init__(self, model=None, arrays=()):
        self._model = weakref.ref(model) if model is not None else None
        self._arrays = [weakref.ref(a) for a in arrays]

    @classmethod
    def of(cls, model) -> "Watched":
        """A model (an mlx.nn.Module) and its parameters; nothing for None."""
        if model is None:
            return cls()
        from mlx.utils import tree_flatten
        return cls(model, [w for _, w in tree_flatten(model.parameters())])

    def held_bytes(self) -> int:
        return sum(a.nbytes for ref in self._arrays if (a := ref()) is not None)

    def holders(self) -> list[str]:
        """What refers to the model (or, with the model gone, to a weight still alive): for the warning."""
        target = self._model() if self._model is not None else None
        if target is None:
            target = next((a for ref in self._arrays if (a := ref()) is not None), None)
        if target is None:
            return []
        found = []
        for r in gc.get_referrers(target):
            if hasattr(r, "f_code"):
                found.append(f"frame {r.f_code.co_name}")
            elif isinstance(r, dict):     # an instance's attributes: name the instance
                owners = [type(o).__name__ for o in gc.get_referrers(r) if getattr(o, "__dict__", None) is r]
                found.append(owners[0] if owners else "dict")
            else:
                found.append(type(r).__name__)
        del target
        return sorted(set(found))
