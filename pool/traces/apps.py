from django.apps import AppConfig


class TracesConfig(AppConfig):
    name = "pool.traces"
    label = "traces"
    verbose_name = "Request traces"
    default_auto_field = "django.db.models.BigAutoField"
