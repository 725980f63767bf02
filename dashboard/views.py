"""The dashboard page: one template; everything live arrives over /ws/pool/. `/` is also Ollama's
heartbeat: a client that does not ask for HTML (Ollama's clients, curl) and any HEAD get
`Ollama is running`."""

from django.contrib.auth.views import redirect_to_login
from django.middleware.csrf import get_token
from django.shortcuts import render

from pool.api.ollama.info import liveness
from pool.conf import get_settings

from .access import is_open, may_view


def wants_html(request) -> bool:
    return "text/html" in request.headers.get("Accept", "").lower()


def index(request):
    if request.method == "HEAD" or not wants_html(request):
        return liveness(request)
    client = request.META.get("REMOTE_ADDR")
    if not may_view(request.user, client):
        return redirect_to_login(request.get_full_path())
    config = {
        "ws_path": "/ws/pool/",
        "telemetry_url": "/api/telemetry",
        "history_url": "/admin/pool/evictionevent/",
        "settings_url": "/admin/model/{id}/settings",
        "window_seconds": 15 * 60,
        "requests_url": "/api/requests",
        "can_cancel": bool(request.user.is_staff),   # POST /api/requests/{id}/cancel is staff only
        "csrf_token": get_token(request),   # the playground's and the cancel's POSTs (the cookie is set too)
    }
    conf = get_settings()
    if conf.fleet:    # a fleet's page: its Fleet section, and which host this page is
        config.update({"fleet": True, "host": conf.host_id})
    return render(request, "dashboard/index.html", {"config": config, "open_access": is_open(client)})
