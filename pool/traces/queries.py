"""The API's reads of finished traces (docs/api.md#requests): filtered pages, one trace, and the
per-model summaries over recent windows (count, errors, TTFT and decode-rate percentiles)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from asgiref.sync import sync_to_async

from .models import RequestTrace

MAX_PAGE = 500
WINDOWS = (("5m", 300), ("1h", 3600), ("24h", 86400))
PERCENTILES = (50, 90, 99)


def page(*, model: str | None = None, key: str | None = None, status: str | None = None,
         since: float | None = None, before: str | None = None, limit: int = 100,
         body: bool = False) -> dict:
    rows = RequestTrace.objects.all()
    if model:
        rows = rows.filter(model=model)
    if key:
        rows = rows.filter(key=key)
    if status == "ok":
        rows = rows.filter(status__lt=400, error__isnull=True)
    elif status == "error":
        rows = rows.exclude(status__lt=400, error__isnull=True)
    elif status:
        rows = rows.filter(status=int(status))
    if since is not None:
        rows = rows.filter(created_at__gte=datetime.fromtimestamp(since, timezone.utc))
    if before:
        edge = RequestTrace.objects.filter(id=before).values_list("seq", flat=True).first()
        if edge is not None:
            rows = rows.filter(seq__lt=edge)
    found = list(rows.order_by("-seq")[:limit + 1])
    more = len(found) > limit
    found = found[:limit]
    return {"data": [r.as_dict(body=body) for r in found], "next": found[-1].id if more and found else None}


def one(trace_id: str, *, body: bool = False) -> dict | None:
    row = RequestTrace.objects.filter(id=trace_id).first()
    return row.as_dict(body=body) if row is not None else None


def percentiles(values: list[float]) -> dict:
    """Nearest-rank percentiles; None for each when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": round(ordered[min(len(ordered) - 1, max(0, -(-p * len(ordered) // 100) - 1))], 2)
            for p in PERCENTILES}


def summary(now: datetime | None = None) -> dict:
    now = now or datetime.now(timezone.utc)
    windows = {}
    for name, seconds in WINDOWS:
        rows = RequestTrace.objects.filter(created_at__gte=now - timedelta(seconds=seconds)).values_list(
            "model", "status", "error", "ttft_ms", "decode_tps")
        by_model: dict[str, dict] = {}
        for model, status, error, ttft, tps in rows.iterator():
            m = by_model.setdefault(model, {"count": 0, "errors": 0, "ttft": [], "tps": []})
            m["count"] += 1
            m["errors"] += int(error is not None or (status or 0) >= 400)
            if ttft is not None:
                m["ttft"].append(ttft)
            if tps is not None:
                m["tps"].append(tps)
        windows[name] = [{"model": model, "count": m["count"], "errors": m["errors"],
                          "ttft_ms": percentiles(m["ttft"]), "decode_tps": percentiles(m["tps"])}
                         for model, m in sorted(by_model.items())]
    return {"windows": windows}


apage = sync_to_async(page)
aone = sync_to_async(one)
asummary = sync_to_async(summary)
