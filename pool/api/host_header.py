"""Every answer names the host that served it (`x-omlx-host`): in a fleet, the host a request was
routed to (the hop copies that host's header); alone, this host (OMLX_HOST_ID). A request the fleet
routed here says why (`x-omlx-placement`)."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..conf import get_settings
from ..fleet.proxy import HOST
from ..fleet.routing import PLACEMENT


def host_header(get_response):
    def named(request, response):
        if HOST not in response:
            response[HOST] = get_settings().host_id
        why = getattr(request, "omlx_placement", None)
        if why is not None and PLACEMENT not in response:
            response[PLACEMENT] = why
        return response

    if iscoroutinefunction(get_response):
        async def middleware(request):
            return named(request, await get_response(request))
        markcoroutinefunction(middleware)
        return middleware
    return lambda request: named(request, get_response(request))


host_header.async_capable = True     # type: ignore[attr-defined]
host_header.sync_capable = True      # type: ignore[attr-defined]
