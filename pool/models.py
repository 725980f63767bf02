"""What the pool persists: per-model settings (pins, TTL, defaults, alias) and the event history.

The range rules of a setting live on its field, and `ModelSettings.clean()` checks what needs
other rows or the model folders; pool.services.write_model_settings runs both for every writer."""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from .policy import kv
from .policy.vocabulary import ActionKind, Reason

# SQLite stores 64-bit integers; a bound well inside keeps every writer's value storable.
MAX_SECONDS = 10 * 365 * 86400
MAX_TOKENS = 2**31 - 1


def _choices(vocabulary) -> list[tuple[str, str]]:
    return [(member.value, member.value) for member in vocabulary]


def _positive_top_p(value: float) -> None:
    if not value > 0:
        raise ValidationError("must be in (0, 1]")


def _kv_rule(name: str, value) -> None:
    problem = kv.field_problem(name, value)
    if problem:
        raise ValidationError(problem)


def validate_max_kv_size(value) -> None:      # module functions: migrations name them
    _kv_rule("max_kv_size", value)


def validate_quantized_kv_start(value) -> None:
    _kv_rule("quantized_kv_start", value)


def _between(low, high, message: str) -> list:
    return [MinValueValidator(low, message=message), MaxValueValidator(high, message=message)]


class ModelSettings(models.Model):
    model_id = models.CharField(max_length=255, unique=True)
    is_pinned = models.BooleanField(default=False, help_text="Never evicted; loaded at start-up.")
    ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=_between(0, MAX_SECONDS, f"must be at most {MAX_SECONDS} (ten years)"),
        help_text="Unload after this many idle seconds; empty = global OMLX_IDLE_TTL.")
    temperature = models.FloatField(null=True, blank=True, validators=_between(0, 2, "must be between 0 and 2"))
    top_p = models.FloatField(null=True, blank=True,
                              validators=[_positive_top_p, MaxValueValidator(1, message="must be in (0, 1]")])
    max_tokens = models.PositiveIntegerField(null=True, blank=True,
                                             validators=_between(1, MAX_TOKENS, f"must be between 1 and {MAX_TOKENS}"))
    alias = models.CharField(max_length=255, unique=True, null=True, blank=True,
                             help_text="Another name clients may use for this model.")
    is_hidden = models.BooleanField(default=False, help_text="Left out of /v1/models.")
    # KV limits a request gets when it gives none of its own
    max_kv_size = models.PositiveIntegerField(null=True, blank=True, validators=[validate_max_kv_size],
                                              help_text="A rotating KV cache of this many tokens.")
    kv_bits = models.PositiveSmallIntegerField(null=True, blank=True, choices=[(b, f"{b}-bit") for b in kv.KV_BITS],
                                               help_text="Quantized KV cache (decodes outside the batch).")
    kv_group_size = models.PositiveSmallIntegerField(null=True, blank=True,
                                                     choices=[(g, str(g)) for g in kv.KV_GROUP_SIZES])
    quantized_kv_start = models.PositiveIntegerField(null=True, blank=True, validators=[validate_quantized_kv_start])
    display_name = models.CharField(max_length=255, blank=True, default="")
    notes = models.TextField(blank=True, default="")
    draft_model = models.CharField(
        max_length=255, blank=True, default="",
        help_text="A small model of the same vocabulary that proposes tokens for this one (speculative "
                  "decoding); loaded, counted, pinned and evicted with it; empty = none. At the next load.")
    trace_body_bytes = models.PositiveIntegerField(
        null=True, blank=True, validators=_between(0, MAX_TOKENS, f"must be at most {MAX_TOKENS}"),
        help_text="Keep each request's body and answer in its trace, up to this many bytes each "
                  "(empty or 0 = off). Shown only to staff.")
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
        if self.draft_model and self.draft_model == self.model_id:
            raise ValidationError({"draft_model": "a model cannot be its own draft"})
        if self.alias and self.alias != self.model_id and self.alias in self._other_model_ids():
            raise ValidationError({"alias": f"'{self.alias}' is the id of another model"})
        try:
            kv.kv_config({name: getattr(self, name) for name in kv.FIELDS})
        except kv.KVFieldError as e:
            raise ValidationError({e.field: str(e).split(" ", 1)[1]}) from None

    def _other_model_ids(self) -> set[str]:
        from .catalog.discovery import discover
        from .conf import get_settings

        rows = ModelSettings.objects.exclude(pk=self.pk).values_list("model_id", flat=True)
        return (set(discover(get_settings().model_dirs)) | set(rows)) - {self.model_id}


class EvictionEvent(models.Model):
    host = models.CharField(max_length=255, blank=True, default="", db_index=True,
                            help_text="The host it happened on (OMLX_HOST_ID).")
    model_id = models.CharField(max_length=255, blank=True, db_index=True)
    action = models.CharField(max_length=32, choices=_choices(ActionKind), default=ActionKind.UNLOAD.value,
                              db_index=True, help_text="What happened: an unload, a cache reclaim or an abort.")
    reason = models.CharField(max_length=32, choices=_choices(Reason), db_index=True)
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
    # when it happened, set by the event log: a row written late (the database was locked or full)
    # keeps its own time
    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.model_id or '-'} {self.reason} {self.created_at:%Y-%m-%d %H:%M:%S}"

    def as_dict(self) -> dict:
        return {
            "id": self.id, "host": self.host or None, "model": self.model_id, "action": self.action,
            "reason": self.reason,
            "estimated_bytes": self.estimated_bytes, "freed_bytes": self.freed_bytes,
            "rss_freed_bytes": self.rss_freed_bytes, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "requested_by": self.requested_by or None,
            "duration_ms": round(self.duration_ms, 1), "detail": self.detail, "warning": self.warning,
            "time": self.created_at.timestamp(),
        }


class StoredResponse(models.Model):
    """A Responses API answer kept for `previous_response_id` and GET /v1/responses/{id}: the
    conversation it continues from (`input_items`: earlier turns and this request's input, as
    Responses items; instructions are not carried over, as OpenAI's), what it answered
    (`output_items`), and the response object as it was returned. Kept until `expires_at`
    (OMLX_RESPONSES_DAYS), at most OMLX_RESPONSES_MAX rows."""
    id = models.CharField(max_length=64, primary_key=True)
    model = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    input_items = models.JSONField(default=list)
    output_items = models.JSONField(default=list)
    response = models.JSONField(default=dict)
    owner = models.CharField(max_length=64, blank=True, default="",
                             help_text="the API key's name that made it ('' without keys): only it may read it")

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "stored response"

    def __str__(self):
        return f"{self.id} ({self.model})"
