"""Storage faults of the data folder, named once and reported once.

Three things write under $OMLX_HOME: the database (settings and the event history), the telemetry
file and the prompt cache's disk tier. A failed write is classified (`classify`: busy, full,
read-only, I/O) from SQLite's error name or the OS errno. `StorageHealth` keeps each component's
state: the `storage_*` gauges follow every write; a log line and an event (through its listeners)
mark an episode's start and, once writes have worked for OMLX_STORAGE_SETTLE seconds, its end:
once each, never per failed write or tick.

A client's own write that cannot be stored is an error for that client (`client_error`): 503
`database_busy` with Retry-After while another process holds the database's lock, 507 when the
data folder is full or read-only, 503 `storage_error` for other I/O errors. Nothing of it is applied.

No Django here: the engines' disk tier reports through this module too."""

from __future__ import annotations

import errno
import logging
import math
import re
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .errors import Busy, DatabaseBusy, PoolError, StorageUnavailable

log = logging.getLogger(__name__)


class Fault(StrEnum):
    BUSY = "busy"                # another process holds the database's write lock
    FULL = "full"                # no space left (or SQLite's own page limit)
    READ_ONLY = "read_only"      # a read-only file system, or no permission to write
    IO = "io_error"              # anything else the disk said no to


class Component(StrEnum):
    DATABASE = "database"        # omlx.sqlite3: settings, pins, the event history
    TELEMETRY = "telemetry"      # telemetry.sqlite3: the enforcer's time series
    PROMPT_CACHE = "prompt_cache"  # prompt-cache/<model>/: the prefix cache's disk tier


# SQLite's primary result codes (the extended ones, e.g. SQLITE_IOERR_WRITE, start with these)
SQLITE_FAULTS = {"SQLITE_BUSY": Fault.BUSY, "SQLITE_LOCKED": Fault.BUSY, "SQLITE_FULL": Fault.FULL,
                 "SQLITE_READONLY": Fault.READ_ONLY, "SQLITE_PERM": Fault.READ_ONLY,
                 "SQLITE_IOERR": Fault.IO, "SQLITE_CANTOPEN": Fault.IO}
# the same by message, for a wrapper that kept only the text
SQLITE_MESSAGES = (("database is locked", Fault.BUSY), ("database table is locked", Fault.BUSY),
                   ("disk is full", Fault.FULL), ("readonly database", Fault.READ_ONLY),
                   ("disk i/o error", Fault.IO), ("unable to open database file", Fault.IO))
ERRNO_FAULTS = {errno.ENOSPC: Fault.FULL, errno.EDQUOT: Fault.FULL, errno.EFBIG: Fault.FULL,
                errno.EROFS: Fault.READ_ONLY, errno.EACCES: Fault.READ_ONLY, errno.EPERM: Fault.READ_ONLY}

# A server database's (PostgreSQL through psycopg) faults by SQLSTATE, then by its class: serialization,
# deadlock, lock and statement timeouts are "busy" (try again); connection, resource, operator and
# system classes an I/O fault (the server is unreachable, restarting or short of something).
PG_FAULTS = {"40001": Fault.BUSY, "40P01": Fault.BUSY, "55P03": Fault.BUSY, "57014": Fault.BUSY,
             "53100": Fault.FULL, "25006": Fault.READ_ONLY}
PG_CLASSES = {"08": Fault.IO, "53": Fault.IO, "57": Fault.IO, "58": Fault.IO}

# folders in an error's text: the log keeps them, events and API notes show the file's name only
_FOLDERS = re.compile(r"(?:/[^/\s'\"]+)+/")

WHAT = {Fault.BUSY: "locked by another process", Fault.FULL: "the disk is full",
        Fault.READ_ONLY: "read-only", Fault.IO: "an I/O error"}


def _sqlite_fault(error: BaseException) -> Fault | None:
    name = getattr(error, "sqlite_errorname", None)
    if name:
        base = "_".join(name.split("_")[:2])
        if base in SQLITE_FAULTS:
            return SQLITE_FAULTS[base]
    text = str(error).lower()
    return next((fault for words, fault in SQLITE_MESSAGES if words in text), None)


def _server_fault(error: BaseException) -> Fault | None:
    """A psycopg error's fault: by its SQLSTATE, or, without one (no server answered: refused, lost,
    the connection closed), an I/O fault."""
    state = getattr(error, "sqlstate", None)
    if state:
        return PG_FAULTS.get(state) or PG_CLASSES.get(state[:2])
    return Fault.IO if type(error).__name__ in ("OperationalError", "InterfaceError") else None


def classify(error: BaseException | None) -> Fault | None:
    """The storage fault behind an exception (SQLite's, PostgreSQL's, Django's wrapper of either, or
    an OSError), or None when it is not one (a bug, a constraint): those are not storage's to report."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(getattr(error, "storage_fault", None), Fault):    # named where it was raised
            return error.storage_fault
        if isinstance(error, sqlite3.Error) or type(error).__module__.startswith("django.db"):
            fault = _sqlite_fault(error)
            if fault is not None:
                return fault
        elif type(error).__module__.startswith("psycopg"):
            return _server_fault(error)
        elif isinstance(error, OSError):
            return ERRNO_FAULTS.get(error.errno, Fault.IO)
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def probe_folder(folder: Path) -> Fault | None:
    """What writing a page into `folder` runs into now, or None when it works: for writers whose
    own errors do not say (mlx's safetensors writer raises a bare RuntimeError)."""
    try:
        with tempfile.TemporaryFile(dir=folder) as f:
            f.write(b"\0" * 4096)
            f.flush()
    except OSError as e:
        return classify(e)
    return None


def fault_of(error: BaseException, folder: Path) -> Fault:
    """`classify`, and where that says no more than "I/O" (SQLite's "unable to open", mlx's bare
    RuntimeError), what the folder itself runs into now."""
    fault = classify(error)
    if fault in (None, Fault.IO):
        fault = probe_folder(folder) or fault
    return fault or Fault.IO


def client_error(fault: Fault, *, retry_after: float) -> PoolError:
    """The error a client gets for its own write that could not be stored (and was not applied)."""
    if fault == Fault.BUSY:
        return DatabaseBusy("The database is locked by another process; nothing was changed. Try again.",
                            retry_after=max(1, math.ceil(retry_after)))
    if fault == Fault.FULL:
        return StorageUnavailable("The data folder's disk is full; nothing was changed.", code="storage_full")
    if fault == Fault.READ_ONLY:
        return StorageUnavailable("The data folder is read-only; nothing was changed.", code="storage_read_only")
    return Busy("The data folder could not be written (an I/O error); nothing was changed.",
                              code="storage_error", retry_after=max(1, math.ceil(retry_after)))


# ---- health: one state per component, changes reported once ------------------------------------

@dataclass
class ComponentState:
    fault: Fault | None = None   # the last write's outcome: the gauge
    reported: bool = False       # a fault was reported and its recovery not yet
    detail: str = ""             # the episode's first error
    since: float | None = None   # when the episode began
    last_failure: float | None = None
    recovery_note: str = ""
    failures: int = 0            # failed writes, ever
    pending: int = 0             # rows kept in memory, to be written when the disk takes them
    dropped: int = 0             # rows lost for good (over the bound, or unwritten at shutdown)
    dropped_reported: bool = False   # this episode's first loss has been logged


@dataclass(frozen=True)
class StorageChange:
    component: Component
    fault: Fault | None          # None: recovered
    detail: str

    @property
    def text(self) -> str:
        if self.fault is None:
            return f"{self.component}: writes work again" + (f" ({self.detail})" if self.detail else "")
        return f"{self.component}: {WHAT[self.fault]} ({self.detail})"


SETTLE_SECONDS = 15.0


def to_report(*, reported: bool, fault: Fault | None, now: float, last_failure: float | None,
              settle: float = SETTLE_SECONDS) -> str | None:
    """What a write's outcome (or a quiet moment: fault None) means for the log and the events:
    "fault" at the first failure of an episode, "recovered" once writes have worked and nothing
    failed for `settle` seconds, else nothing. A disk at the edge of full succeeds and fails by
    turns, and a full disk gives SQLite's "full" and "disk I/O error" by turns: one episode each."""
    if fault is not None:
        return None if reported else "fault"
    if reported and (last_failure is None or now - last_failure >= settle):
        return "recovered"
    return None


@dataclass
class StorageHealth:
    """Thread-safe: the loop (telemetry, history), request threads (settings) and engine threads
    (spills) all report here. Listeners are called outside the lock, on the reporting thread."""
    clock: Callable[[], float] = time.time
    settle_seconds: float = SETTLE_SECONDS
    listeners: list[Callable[[StorageChange], None]] = field(default_factory=list)
    states: dict[Component, ComponentState] = field(default_factory=lambda: {c: ComponentState() for c in Component})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, component: Component, fault: Fault, detail: str) -> bool:
        """A write failed; True (and reported) when it begins an episode."""
        with self._lock:
            state, now = self.states[component], self.clock()
            state.failures += 1
            news = to_report(reported=state.reported, fault=fault, now=now, last_failure=state.last_failure)
            if news:
                state.reported, state.detail, state.since = True, _FOLDERS.sub("", detail)[:300], now
            state.fault, state.last_failure, shown = fault, now, state.detail
        if news:
            log.warning("storage fault, %s: %s (%s); reported once until it recovers",
                        component, WHAT[fault], detail)
            self._tell(StorageChange(component, fault, shown))
        return bool(news)

    def succeeded(self, component: Component, note: str = "") -> bool:
        """A write worked; True (and reported) when that ends an episode (see `to_report`)."""
        with self._lock:
            state = self.states[component]
            state.fault = None
            state.recovery_note = note or state.recovery_note
        return self._settle(component)

    def settle(self) -> None:
        """Report the recoveries that have become certain (writes worked, nothing failed since for
        settle_seconds): called on every telemetry tick."""
        for component in Component:
            self._settle(component)

    def _settle(self, component: Component) -> bool:
        with self._lock:
            state = self.states[component]
            news = to_report(reported=state.reported, fault=state.fault, now=self.clock(),
                             last_failure=state.last_failure, settle=self.settle_seconds)
            if news:
                note = state.recovery_note
                state.reported, state.detail, state.since, state.recovery_note = False, "", None, ""
                state.dropped_reported = False
        if news:
            log.warning("storage recovered, %s: writes work again%s", component, f" ({note})" if note else "")
            self._tell(StorageChange(component, None, note))
        return bool(news)

    def set_pending(self, component: Component, rows: int) -> None:
        self.states[component].pending = rows

    def dropped(self, component: Component, rows: int = 1, *, why: str) -> None:
        with self._lock:
            state = self.states[component]
            state.dropped += rows
            first, state.dropped_reported = not state.dropped_reported, True
        if first:
            log.error("storage, %s: %s; rows are being lost (counted in storage_dropped_rows)", component, why)

    def fault(self, component: Component) -> Fault | None:
        return self.states[component].fault

    def note(self, component: Component) -> str | None:
        """One line for a response that answers despite a fault, or None when all is well."""
        state = self.states[component]
        if state.fault is None:
            return None
        return (f"{component} is not being stored: {WHAT[state.fault]} ({state.detail}); "
                f"{state.pending} rows wait in memory")

    def subscribe(self, listener: Callable[[StorageChange], None]) -> None:
        if listener not in self.listeners:      # a start tried again subscribes again
            self.listeners.append(listener)

    def _tell(self, change: StorageChange) -> None:
        for listener in list(self.listeners):
            try:
                listener(change)
            except Exception:
                log.exception("could not report a storage change")

    def reset(self, *, settle_seconds: float = SETTLE_SECONDS) -> None:
        with self._lock:
            self.states = {c: ComponentState() for c in Component}
        self.listeners, self.settle_seconds = [], settle_seconds


class StorageCollector:
    """The storage_* families of /metrics, read from a StorageHealth at scrape time."""

    def __init__(self, health: StorageHealth):
        self.health = health

    def collect(self):
        failing = GaugeMetricFamily("storage_failing", "1 while writes to this part of the data folder fail.",
                                    labels=["component"])
        faults = GaugeMetricFamily("storage_fault", "1 for a failing component's fault (busy, full, read_only, "
                                   "io_error).", labels=["component", "fault"])
        pending = GaugeMetricFamily("storage_pending_rows", "Rows kept in memory until the disk takes them.",
                                    labels=["component"])
        failures = CounterMetricFamily("storage_write_failures", "Writes that failed, by component.",
                                       labels=["component"])
        dropped = CounterMetricFamily("storage_dropped_rows", "Rows lost: over the in-memory bound or "
                                      "unwritten at shutdown.", labels=["component"])
        for component, state in list(self.health.states.items()):
            failing.add_metric([component], int(state.fault is not None))
            if state.fault is not None:
                faults.add_metric([component, state.fault], 1)
            pending.add_metric([component], state.pending)
            failures.add_metric([component], state.failures)
            dropped.add_metric([component], state.dropped)
        yield from (failing, faults, pending, failures, dropped)


# The process's one health record: the runtime listens to it and /metrics reads it.
health = StorageHealth()
