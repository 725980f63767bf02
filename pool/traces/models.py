"""A finished request's trace as a row (trace.py says what each field is; docs/api.md#requests).
Bounded by OMLX_TRACE_ROWS and OMLX_TRACE_DAYS (writer.py prunes); `seq` orders and pages them."""

from django.db import models

# a trace's as_dict() keys kept as columns of the same name (the rest have their own names below)
COLUMNS = ("host", "model", "dialect", "route", "key", "stream", "status", "error", "finish_reason", "disconnected",
           "cancelled", "prefill_total", "prompt_tokens", "cached_tokens", "image_tokens", "draft_proposed",
           "draft_accepted", "completion_tokens",
           "admission_ms", "slot_ms", "load_ms", "load_model", "load_started", "prefill_ms", "ttft_ms", "decode_tps",
           "peak_kv_bytes", "prompt_cache_stored_tokens", "evictions", "duration_ms")


class RequestTrace(models.Model):
    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=32, unique=True)
    created_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True)
    duration_ms = models.FloatField(null=True)
    host = models.CharField(max_length=255, blank=True, default="")
    model = models.CharField(max_length=255, blank=True, default="", db_index=True)
    dialect = models.CharField(max_length=32, blank=True, default="")
    route = models.CharField(max_length=255, blank=True, default="")
    key = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    stream = models.BooleanField(default=False)
    status = models.PositiveSmallIntegerField(null=True, db_index=True)
    error = models.CharField(max_length=64, null=True, blank=True)
    finish_reason = models.CharField(max_length=32, null=True, blank=True)
    disconnected = models.BooleanField(default=False)
    cancelled = models.BooleanField(default=False)
    prefill_total = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    image_tokens = models.PositiveIntegerField(default=0)
    draft_proposed = models.PositiveIntegerField(default=0)
    draft_accepted = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    admission_ms = models.FloatField(null=True)
    slot_ms = models.FloatField(null=True)
    load_ms = models.FloatField(null=True)
    load_model = models.CharField(max_length=255, null=True, blank=True)
    load_started = models.BooleanField(default=False)
    prefill_ms = models.FloatField(null=True)
    ttft_ms = models.FloatField(null=True)
    decode_tps = models.FloatField(null=True)
    peak_kv_bytes = models.BigIntegerField(null=True)
    prompt_cache_stored_tokens = models.PositiveIntegerField(null=True)
    evictions = models.JSONField(default=list)      # ids of the unloads' history rows (pool.EvictionEvent)
    body = models.JSONField(null=True, blank=True)  # captured text (trace_body_bytes): staff only

    class Meta:
        ordering = ["-seq"]
        indexes = [models.Index(fields=["model", "created_at"])]

    def __str__(self):
        return f"{self.id} {self.model} {self.status}"

    def as_dict(self, *, body: bool = False) -> dict:
        shown = {"id": self.id, "time": self.created_at.timestamp(),
                 "ended": self.ended_at.timestamp() if self.ended_at else None,
                 **{name: getattr(self, name) for name in COLUMNS}, "phase": "done",
                 "prefill_done": self.prefill_total, "prompt_cache_hit_tokens": self.cached_tokens or None}
        if body and self.body is not None:
            shown["body"] = self.body
        return shown
