"""ASGI entry point: HTTP through Django (static files included), websockets through Channels.
`in_flight` counts the HTTP requests running, for `serve`'s graceful shutdown; the first request
starts the runtime (omlx_site/startup.py)."""

import os

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX (other ASGI servers)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omlx_site.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from omlx_site.inflight import InFlight  # noqa: E402
from omlx_site.startup import StartOnFirstScope  # noqa: E402

in_flight = InFlight(ASGIStaticFilesHandler(django_asgi_app))

application = StartOnFirstScope(ProtocolTypeRouter({
    "http": in_flight,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
}))
