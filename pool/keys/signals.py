"""A key saved or deleted in this process (the admin, `manage.py keys`) reaches its registry at once:
the next request reads the keys again. Other processes read them within registry.REFRESH_SECONDS."""

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from .models import ApiKey
from .registry import REGISTRY


@receiver(post_save, sender=ApiKey)
@receiver(post_delete, sender=ApiKey)
def key_changed(sender, **kwargs) -> None:
    REGISTRY.invalidate()
