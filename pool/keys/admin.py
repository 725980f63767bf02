"""The admin for keys: a key is made here with its name and limits, and its plain value is shown once,
in the message after the save (only its SHA-256 is stored); revoke and rotate are actions."""

from django import forms
from django.contrib import admin, messages

from .models import ApiKey
from .records import name_problem
from .services import KeyRefused, fresh_secret, revoke_key, rotate_key


class ApiKeyForm(forms.ModelForm):
    models = forms.CharField(required=False, help_text="model ids, separated by commas; empty = every model")

    class Meta:
        model = ApiKey
        fields = ("name", "models", "rate_per_minute", "shares_cache")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.initial["models"] = ", ".join(self.instance.models or [])

    def clean_name(self):
        name = self.cleaned_data["name"]
        problem = name_problem(name)
        if problem:
            raise forms.ValidationError(problem)
        return name

    def clean_models(self):
        return sorted({m.strip() for m in (self.cleaned_data.get("models") or "").split(",") if m.strip()})


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ("name", "prefix", "models", "rate_per_minute", "shares_cache", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = ("shares_cache",)
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke", "rotate")

    def get_readonly_fields(self, request, obj=None):
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            obj.save()
            return
        plain = fresh_secret(obj)
        obj.save()
        self.message_user(request, f"The key '{obj.name}' is {plain} — copy it now: it is stored hashed and "
                                   "is never shown again.", messages.WARNING)

    @admin.action(description="Revoke the selected keys (refused at once)")
    def revoke(self, request, queryset):
        for key in queryset:
            revoke_key(name=key.name)
        self.message_user(request, f"Revoked: {', '.join(k.name for k in queryset)}.")

    @admin.action(description="Rotate the selected keys (a new secret; the old one is refused at once)")
    def rotate(self, request, queryset):
        for key in queryset:
            try:
                _, plain = rotate_key(name=key.name)
            except KeyRefused as e:
                self.message_user(request, str(e), messages.ERROR)
                continue
            self.message_user(request, f"The key '{key.name}' is now {plain} — copy it now: it is never shown again.",
                              messages.WARNING)
