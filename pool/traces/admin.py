"""Request traces in the Django admin: read-only, filterable, deletable (the writer prunes them too)."""

from django.contrib import admin

from .models import RequestTrace


@admin.register(RequestTrace)
class RequestTraceAdmin(admin.ModelAdmin):
    list_display = ("created_at", "id", "model", "dialect", "route", "key", "status", "error", "finish_reason",
                    "prompt_tokens", "completion_tokens", "ttft_ms", "decode_tps")
    list_filter = ("model", "dialect", "status", "key", "cancelled", "disconnected",
                   ("created_at", admin.DateFieldListFilter))
    search_fields = ("id", "model", "key", "error")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
