"""The one thread that writes finished traces to the database, off the event loop.

The loop hands a finished trace over with `submit` (a put on a bounded queue, never a wait): when
the queue is full the trace is dropped and counted. The thread takes what has piled up and writes
it in one batched insert; in the same transaction it deletes the oldest rows past OMLX_TRACE_ROWS
(it counts the rows once, then keeps the count), so a reader never sees more; rows older than
OMLX_TRACE_DAYS go every PRUNE_SECONDS. A write that fails (the database locked past its busy
timeout, the disk full) loses that batch, counted and logged once per kind of failure: the
requests were answered long before."""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import datetime, timedelta, timezone

log = logging.getLogger(__name__)

QUEUE_SIZE = 10_000
BATCH = 500
PRUNE_SECONDS = 60.0
_STOP = object()


class TraceWriter:
    def __init__(self, *, max_rows: int, max_days: float, queue_size: int = QUEUE_SIZE):
        self.max_rows, self.max_days = max_rows, max_days
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.written = 0
        self.dropped = 0        # the queue was full
        self.failed = 0         # a write failed: lost
        self._failing: str | None = None
        self._pruned_at = 0.0
        self._rows: int | None = None    # rows in the table, once counted
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, row: dict) -> bool:
        """Hand one finished trace (trace.py's as_dict, with its body) to the thread; False when it
        was dropped."""
        self._start()
        try:
            self._queue.put_nowait(row)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    @property
    def pending(self) -> int:
        """Traces handed over and not yet written (or lost)."""
        return self._queue.unfinished_tasks

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="omlx-trace-writer", daemon=True)
                    self._thread.start()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait (off the loop) until what was submitted has been written or lost."""
        deadline = time.monotonic() + timeout
        while (self._queue.unfinished_tasks) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:
                return
            self._thread.join(timeout)

    # ---- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        from django.db import close_old_connections, connection

        try:
            while True:
                try:
                    got = [self._queue.get(timeout=PRUNE_SECONDS)]
                except queue.Empty:
                    got = []
                while got and len(got) < BATCH:
                    try:
                        got.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(r is _STOP for r in got)
                rows = [r for r in got if r is not _STOP]
                try:
                    if rows:
                        self._write(rows)
                    if time.monotonic() - self._pruned_at >= PRUNE_SECONDS:
                        self._pruned_at = time.monotonic()
                        self._rows = None
                        self.prune()
                except Exception as e:  # noqa: BLE001 - a trace is never worth a request, nor the thread
                    self.failed += len(rows)
                    self._rows = None
                    self._report(e)
                    close_old_connections()
                finally:
                    for _ in got:
                        self._queue.task_done()
                if stop:
                    return
        finally:
            connection.close()

    def _write(self, rows: list[dict]) -> None:
        from django.db import transaction

        from .models import COLUMNS, RequestTrace

        with transaction.atomic():
            if self._rows is None:
                self._rows = RequestTrace.objects.count()
            RequestTrace.objects.bulk_create([RequestTrace(
                id=r["id"], created_at=_when(r["time"]), ended_at=_when(r["ended"]) if r.get("ended") else None,
                body=r.get("body"), **{name: r.get(name) for name in COLUMNS if r.get(name) is not None},
            ) for r in rows], ignore_conflicts=True)
            self._rows += len(rows)
            if self.max_rows and self._rows > self.max_rows:
                self._rows -= self._prune_rows()
        self.written += len(rows)
        if self._failing is not None:
            log.info("request traces are written again")
            self._failing = None

    def prune(self) -> int:
        """Delete traces older than max_days and beyond the newest max_rows; how many went."""
        from .models import RequestTrace

        gone = 0
        if self.max_days > 0:
            cutoff = datetime.now(timezone.utc) - timedelta(days=self.max_days)
            gone += RequestTrace.objects.filter(created_at__lt=cutoff).delete()[0]
        return gone + self._prune_rows()

    def _prune_rows(self) -> int:
        from .models import RequestTrace

        if self.max_rows <= 0:
            return 0
        edge = RequestTrace.objects.order_by("-seq").values_list("seq", flat=True)[self.max_rows:self.max_rows + 1]
        edge_seq = next(iter(edge), None)
        return 0 if edge_seq is None else RequestTrace.objects.filter(seq__lte=edge_seq).delete()[0]

    def _report(self, error: Exception) -> None:
        kind = type(error).__name__
        if kind != self._failing:
            log.warning("request traces could not be written (they are lost): %s", error)
            self._failing = kind


def _when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)
