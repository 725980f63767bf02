"""Writing a prompt cache entry to disk without holding up its engine: the file mlx-lm's
save_prompt_cache would write (load_prompt_cache reads it back), without the KV buffers' padding.

`prepare` runs on the engine thread: it evaluates the entry's arrays (already evaluated for a
finished request: nothing to compute) and takes byte views of their memory, only the used rows of
a KVCache (its buffer grows in steps of 256 tokens: a 32-token entry would otherwise be saved at 256).
`Spill.write_to` then runs on the writer thread and calls no MLX: it writes those bytes with plain
file writes, which release the GIL, so the engine's steps go on meanwhile. mx.save_safetensors
would hold the GIL for the whole file (hundreds of MB for a long chat) and evaluate on the calling
thread, which MLX does not allow beside the engine thread's own evaluation.

The arrays stay referenced by the views until the spill is written, and nothing mutates them: an
entry in (or leaving) the prompt cache is never extended in place, requests extend private copies."""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

log = logging.getLogger(__name__)

DTYPES = {mx.bool_: "BOOL", mx.uint8: "U8", mx.int8: "I8", mx.uint16: "U16", mx.int16: "I16",
          mx.uint32: "U32", mx.int32: "I32", mx.uint64: "U64", mx.int64: "I64", mx.float16: "F16",
          mx.bfloat16: "BF16", mx.float32: "F32", mx.float64: "F64"}


def entry_stem(tokens: list[int], scope: str | None = None) -> str:
    """The file name (without suffix) of the entry for `tokens` in `scope` (an API key's, or shared)."""
    named = tokens if scope is None else [scope, tokens]
    return hashlib.sha256(json.dumps(named).encode()).hexdigest()[:24]


class _UsedRows:
    """A KVCache buffer of which only the first `rows` tokens (axis 2) are used."""

    def __init__(self, array: mx.array, rows: int):
        self.array, self.rows = array, rows


def _states(cache: list[Any]) -> list[Any]:
    states = []
    for c in cache:
        state = c.state
        if type(c) is KVCache and c.keys is not None and c.keys.ndim == 4 and c.keys.shape[2] > c.offset:
            state = (_UsedRows(c.keys, c.offset), _UsedRows(c.values, c.offset), c.offset)
        states.append(state)
    return states


def _views(array: mx.array, rows: int | None) -> tuple[list[memoryview], list[int]]:
    """Byte views of `array` in C order (only its first `rows` along axis 2), and their shape."""
    shape = list(array.shape)
    view = memoryview(array)
    if not view.c_contiguous:
        array = mx.contiguous(array)
        mx.eval(array)
        view = memoryview(array)
    data = view.cast("B")
    if rows is None or rows >= shape[2]:
        return [data], shape
    b, h, t, d = shape
    row_block, used = t * d * array.itemsize, rows * d * array.itemsize
    return [data[i * row_block:i * row_block + used] for i in range(b * h)], [b, h, rows, d]


@dataclass
class Spill:
    """One entry, ready to be written by any thread: its tokens, the safetensors header and the
    byte views that follow it."""
    tokens: list[int]
    header: bytes
    parts: list[memoryview]
    nbytes: int      # the whole file's size
    scope: str | None = None

    @property
    def stem(self) -> str:
        return entry_stem(self.tokens, self.scope)

    def write_to(self, path: Path) -> None:
        with open(path, "wb") as f:
            f.write(self.header)
            for part in self.parts:
                write_part(f, part)


def write_part(f, part: memoryview) -> None:
    """One slice of a file (tests slow the writer here)."""
    f.write(part)


def prepare(tokens: list[int], cache: list[Any], metadata: dict[str, str], scope: str | None = None) -> Spill:
    """On the engine thread: `cache` as save_prompt_cache would save it, without padding."""
    scalars: list[Any] = [""]     # save_prompt_cache's layout: non-empty, or tree_flatten drops it
    arrays: list[tuple[str, mx.array, int | None]] = []
    for key, value in tree_flatten(_states(cache)):
        if isinstance(value, _UsedRows):
            arrays.append((key, value.array, value.rows))
            continue
        if isinstance(value, bool | int | float):
            scalars.append((key, "scalar"))
            value = mx.array(value)
        elif isinstance(value, str):
            scalars.append((key, "string"))
            value = mx.array([ord(ch) for ch in value])
        elif value is None:
            scalars.append((key, "none"))
            value = mx.array([])
        elif not isinstance(value, mx.array):
            raise ValueError(f"a prompt cache state that cannot be saved: {type(value).__name__}")
        arrays.append((key, value, None))
    mx.eval([a for _, a, _ in arrays])
    classes = [type(c).__name__ for c in cache]
    header: dict[str, Any] = {"__metadata__": dict(tree_flatten([metadata, classes, scalars]))}
    parts: list[memoryview] = []
    offset = 0
    for key, array, rows in arrays:
        views, shape = _views(array, rows)
        size = sum(v.nbytes for v in views)
        header[key] = {"dtype": DTYPES[array.dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        parts.extend(views)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)       # the data starts 8-byte aligned
    head = len(text).to_bytes(8, "little") + text
    return Spill(list(tokens), head, parts, len(head) + offset, scope)


class Writer:
    """The process's one spill-writing thread: jobs run in order, off every engine thread. It calls
    no MLX, so it leaves no MLX thread state behind."""

    def __init__(self):
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="prompt-cache-writer", daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:    # a failed spill loses its disk copy, never the thread
                log.exception("a prompt cache spill failed")
            del job      # the spill's arrays are freed now, not when the next one arrives


WRITER = Writer()
