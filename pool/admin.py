"""Django admin: settings are editable and reach the running pool at once; history is read-only."""

from asgiref.sync import async_to_sync
from django.contrib import admin

from .models import EvictionEvent, ModelSettings, StoredResponse
from .services import SETTINGS_FIELDS, write_model_settings


def _apply_to_running_pool(model_id: str, values: dict) -> None:
    from .runtime import _runtime

    if _runtime is None:
        return

    async def apply():
        _runtime.router.apply_model_settings(model_id, values)
    async_to_sync(apply)()


@admin.register(ModelSettings)
class ModelSettingsAdmin(admin.ModelAdmin):
    list_display = ("model_id", "alias", "is_pinned", "ttl_seconds", "is_hidden", "temperature", "max_tokens",
                    "updated_at")
    list_filter = ("is_pinned", "is_hidden")
    list_editable = ("is_pinned", "ttl_seconds")
    search_fields = ("model_id", "alias", "display_name")

    def get_readonly_fields(self, request, obj=None):
        return ("model_id",) if obj is not None else ()   # a row is a model's; it does not move

    def save_model(self, request, obj, form, change):
        # The form has validated; the write goes through the one write path all the same.
        changes = {name: getattr(obj, name) for name in SETTINGS_FIELDS}
        values = write_model_settings(model_id=obj.model_id, changes=changes)
        obj.pk = ModelSettings.objects.get(model_id=obj.model_id).pk
        _apply_to_running_pool(obj.model_id, values)


@admin.register(EvictionEvent)
class EvictionEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "model_id", "action", "reason", "estimated_bytes", "freed_bytes", "bytes_before",
                    "bytes_after", "requested_by", "duration_ms", "warning")
    list_filter = ("action", "reason", "model_id", "warning", ("created_at", admin.DateFieldListFilter))
    search_fields = ("model_id", "requested_by", "detail")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(StoredResponse)
class StoredResponseAdmin(admin.ModelAdmin):
    """Stored /v1/responses answers: read-only, deletable (the same as DELETE /v1/responses/{id})."""
    list_display = ("id", "model", "created_at", "expires_at")
    list_filter = ("model", ("created_at", admin.DateFieldListFilter))
    search_fields = ("id", "model")
    date_hierarchy = "created_at"
    readonly_fields = ("id", "model", "created_at", "expires_at", "input_items", "output_items", "response")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
