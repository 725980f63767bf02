"""ApiKey: one named key. Only its SHA-256 is stored; the key itself is shown once, when it is made."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db.models import (
    BooleanField,
    CharField,
    DateTimeField,
    JSONField,
    Model,
    PositiveIntegerField,
)


class ApiKey(Model):
    name = CharField(max_length=64, unique=True,
                     help_text="how traces, /metrics and the admin name the key's requests")
    prefix = CharField(max_length=16, editable=False, help_text="the key's first characters, to tell keys apart")
    key_hash = CharField(max_length=64, unique=True, editable=False)
    models = JSONField(default=list, blank=True, help_text="model ids the key may use; empty = every model")
    rate_per_minute = PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                           help_text="requests a minute (a burst of as many); empty = no limit")
    shares_cache = BooleanField(default=False,
                                help_text="share the prompt cache with the other sharing keys; off = this key's "
                                          "requests reuse only its own cached prefixes")
    created_at = DateTimeField(auto_now_add=True)
    revoked_at = DateTimeField(null=True, blank=True, editable=False)
    last_used_at = DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.revoked_at is None
