"""What the pool persists: per-model settings (pins, TTL, defaults, alias) and the event history."""

from django.core.exceptions import ValidationError
from django.db import models


class ModelSettings(models.Model):
    model_id = models.CharField(max_length=255, unique=True)
    is_pinned = models.BooleanField(default=False, help_text="Never evicted; loaded at start-up.")
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="Unload after this many idle seconds; empty = global OMLX_IDLE_TTL.")
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    alias = models.CharField(max_length=255, unique=True, null=True, blank=True,
                             help_text="Another name clients may use for this model.")
    is_hidden = models.BooleanField(default=False, help_text="Left out of /v1/models.")
    display_name = models.CharField(max_length=255, blank=True, default="")
    notes = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "model settings"
        verbose_name_plural = "model settings"
        ordering = ["model_id"]

    def __str__(self):
        return self.model_id

    def clean(self):
        if self.alias == "":
            self.alias = None
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValidationError({"temperature": "must be between 0 and 2"})
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValidationError({"top_p": "must be in (0, 1]"})


class EvictionEvent(models.Model):
    class Reason(models.TextChoices):
        LRU = "lru"
        COUNT_CAP = "count_cap"
        TTL = "ttl"
        KEEP_ALIVE = "keep_alive"
        MANUAL = "manual"
        PRESSURE_SOFT = "pressure_soft"
        PRESSURE_HARD = "pressure_hard"
        EMERGENCY = "emergency"
        CACHE_RECLAIM = "cache_reclaim"
        LOAD_ABORTED = "load_aborted"
        REQUESTS_ABORTED = "requests_aborted"

    model_id = models.CharField(max_length=255, blank=True, db_index=True)
    reason = models.CharField(max_length=32, choices=Reason.choices, db_index=True)
    estimated_bytes = models.BigIntegerField(default=0)
    freed_bytes = models.BigIntegerField(null=True, blank=True, help_text="MLX active memory released, as measured.")
    rss_freed_bytes = models.BigIntegerField(null=True, blank=True)
    bytes_before = models.BigIntegerField(null=True, blank=True, help_text="Memory usage before the action.")
    bytes_after = models.BigIntegerField(null=True, blank=True, help_text="Memory usage after the action.")
    requested_by = models.CharField(max_length=255, blank=True, default="",
                                    help_text="The model a request asked for, when that caused this.")
    duration_ms = models.FloatField(default=0)
    detail = models.CharField(max_length=500, blank=True, default="")
    warning = models.BooleanField(default=False, help_text="Less than 90% of the measured size was released.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.model_id or '-'} {self.reason} {self.created_at:%Y-%m-%d %H:%M:%S}"

    def as_dict(self) -> dict:
        return {
            "id": self.id, "model": self.model_id, "reason": self.reason,
            "estimated_bytes": self.estimated_bytes, "freed_bytes": self.freed_bytes,
            "rss_freed_bytes": self.rss_freed_bytes, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "requested_by": self.requested_by or None,
            "duration_ms": round(self.duration_ms, 1), "detail": self.detail, "warning": self.warning,
            "time": self.created_at.timestamp(),
        }
