"""The dashboard page: one template; everything live arrives over /ws/pool/."""

from django.contrib.auth.views import redirect_to_login
from django.shortcuts import render

from pool.conf import get_settings

from .access import is_open, may_view


def index(request):
    client = request.META.get("REMOTE_ADDR")
    if not may_view(request.user, client):
        return redirect_to_login(request.get_full_path())
    config = {
        "ws_path": "/ws/pool/",
        "telemetry_url": "/api/telemetry",
        "history_url": "/admin/pool/evictionevent/",
        "settings_url": "/admin/model/{id}/settings",
        "window_seconds": 15 * 60,
    }
    conf = get_settings()
    if conf.fleet:    # a fleet's page: its Fleet section, and which host this page is
        config.update({"fleet": True, "host": conf.host_id})
    return render(request, "dashboard/index.html", {"config": config, "open_access": is_open(client)})
