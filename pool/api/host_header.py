"""Every answer names the host that served it (`x-omlx-host`): in a fleet, the host a request was
routed to (the hop copies that host's header); alone, this host (OMLX_HOST_ID)."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..conf import get_settings
from ..fleet.proxy import HOST


def host_header(get_response):
    def named(response):
        if HOST not in response:
            response[HOST] = get_settings().host_id
        return response

    if iscoroutinefunction(get_response):
        async def middleware(request):
            return named(await get_response(request))
        markcoroutinefunction(middleware)
        return middleware
    return lambda request: named(get_response(request))


host_header.async_capable = True     # type: ignore[attr-defined]
host_header.sync_capable = True      # type: ignore[attr-defined]
