from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "pool.keys"
    label = "keys"
    verbose_name = "API keys"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import signals  # noqa: F401 - a change to a key reaches this process's registry at once
