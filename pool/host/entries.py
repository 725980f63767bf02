"""One model as this host's engine pool holds it (`Entry`), and the plain view of it the policy
functions decide over (`ModelView`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog.kinds import CHAT, Kind
from ..policy import load_progress
from ..policy.load_plan import ModelView
from ..policy.redact import without_paths
from ..policy.vocabulary import ModelState, Reason


@dataclass
class Entry:
    id: str
    path: Path
    size_bytes: int                          # what a load will take (dense when it is to be dequantized)
    kind: Kind = CHAT
    dequantize: bool = False                 # serve it as float32 (decided once, at discovery)
    base: str | None = None                  # an adapter's base model (catalog/adapters.py)
    base_path: Path | None = None
    state: ModelState = ModelState.UNLOADED
    measured_bytes: int | None = None
    engine: Any = None                       # an engines.protocol.Engine of its kind's protocol
    leases: int = 0
    last_access: float = 0.0
    idle_since: float = 0.0
    pinned: bool = False
    ttl_seconds: float | None = None
    keep_alive: float | None = None          # decided by the busy period that ended last
    busy_keep_alive: float | None = None     # merged over the current busy period
    marked_for_unload: Reason | None = None
    failure: str | None = None
    load_started_at: float | None = None
    load_seconds: float | None = None
    load_note: str = ""
    load_rate: float = load_progress.DEFAULT_BYTES_PER_SECOND   # the host's, as this load began
    model_settings: dict[str, Any] = field(default_factory=dict)   # its ModelSettings row's values
    load_future: asyncio.Future | None = None
    unload_future: asyncio.Future | None = None

    @property
    def alias(self) -> str | None:
        return self.model_settings.get("alias") or None

    @property
    def card_folder(self) -> Path:
        """The folder whose config describes it (catalog.kinds.model_card): an adapter's base's."""
        return self.base_path or self.path

    @property
    def hidden(self) -> bool:
        return bool(self.model_settings.get("is_hidden"))

    @property
    def load_progress(self) -> dict | None:
        """While loading: the weight bytes made resident of the total, and the seconds left at the
        host's measured rate (the folder's size until the weights begin to fill)."""
        if self.state != ModelState.LOADING:
            return None
        read = getattr(self.engine, "load_progress", None)
        total = read.bytes_total if read is not None and read.bytes_total else self.size_bytes
        return load_progress.progress(read.bytes_done if read is not None else 0, total, self.load_rate)

    def fill_seconds(self) -> float | None:
        """How long the engine's weight fill took (its LoadProgress), once loaded."""
        return getattr(getattr(self.engine, "load_progress", None), "seconds", None)

    def view(self, default_ttl: float | None, *, draft_bytes: int = 0) -> ModelView:
        """Its plain view; a model with a draft loads it too (`draft_bytes` more)."""
        ttl = self.ttl_seconds if self.ttl_seconds is not None else default_ttl
        return ModelView(id=self.id, state=self.state, size_bytes=self.size_bytes + draft_bytes,
                         measured_bytes=self.measured_bytes,
                         pinned=self.pinned, leases=self.leases, last_access=self.last_access,
                         idle_since=self.idle_since, ttl_seconds=ttl, keep_alive=self.keep_alive,
                         marked_for_unload=self.marked_for_unload, base=self.base,
                         loaded_draft_bytes=self._loaded_draft_bytes())

    def _loaded_draft_bytes(self) -> int:
        if self.state != ModelState.LOADED or self.engine is None:
            return 0
        draft = (getattr(self.engine, "model_info", None) or {}).get("draft")
        return int(draft["bytes"]) if isinstance(draft, dict) else 0

    def shown_failure(self, error: BaseException) -> str:
        """A load error as clients see it: files named inside the model's folder, never by absolute
        path (the log keeps the whole message)."""
        folders = {str(self.path): self.id, str(self.path.resolve()): self.id}
        return without_paths(f"{type(error).__name__}: {error}", folders)
