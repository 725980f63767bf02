"""The write paths for keys, shared by the admin and `manage.py keys`: each returns what the caller
shows, the plain key only where one is made (it is never stored)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from .models import ApiKey
from .records import SHOWN, key_hash, name_problem, new_key


class KeyRefused(ValueError):
    """A key cannot be made or changed as asked (the message says why)."""


def fresh_secret(key: ApiKey) -> str:
    plain = new_key()
    key.key_hash, key.prefix = key_hash(plain), plain[:SHOWN]
    return plain


def create_key(*, name: str, models: list[str] | None = None, rate_per_minute: int | None = None,
               shares_cache: bool = False) -> tuple[ApiKey, str]:
    """(the row, the plain key to show once)."""
    problem = name_problem(name)
    if problem:
        raise KeyRefused(problem)
    if rate_per_minute is not None and rate_per_minute < 1:
        raise KeyRefused("a rate is at least 1 request a minute")
    if ApiKey.objects.filter(name=name).exists():
        raise KeyRefused(f"a key named '{name}' exists (rotate it for a new secret; a revoked key comes back that way)")
    key = ApiKey(name=name, models=sorted(set(models or [])), rate_per_minute=rate_per_minute,
                 shares_cache=shares_cache)
    plain = fresh_secret(key)
    key.save()
    return key, plain


def revoke_key(*, name: str) -> ApiKey:
    key = _get(name)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def rotate_key(*, name: str) -> tuple[ApiKey, str]:
    """A new secret for the same name, limits and cache scope; the old secret is refused at once.
    A revoked key is made active again by its rotation."""
    with transaction.atomic():
        key = _get(name)
        plain = fresh_secret(key)
        key.revoked_at = None
        key.save(update_fields=["key_hash", "prefix", "revoked_at"])
    return key, plain


def _get(name: str) -> ApiKey:
    try:
        return ApiKey.objects.get(name=name)
    except ApiKey.DoesNotExist:
        raise KeyRefused(f"no key is named '{name}'") from None
