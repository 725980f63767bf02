"""Who may call what: /v1/* needs the Bearer key when OMLX_API_KEY is set; /api/* and the admin JSON
routes take the Bearer key or a staff session."""

from __future__ import annotations

import hmac

from ..conf import get_settings
from ..errors import Unauthorized


def bearer_ok(request) -> bool:
    key = get_settings().api_key
    if not key:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


async def staff_session_ok(request) -> bool:
    user = await request.auser()
    return bool(user.is_authenticated and user.is_staff)


async def require_key(request) -> None:
    if not bearer_ok(request):
        raise Unauthorized("Missing or wrong API key: send 'Authorization: Bearer <key>'.")


async def require_key_or_staff(request) -> None:
    if get_settings().api_key and not bearer_ok(request) and not await staff_session_ok(request):
        raise Unauthorized("Send 'Authorization: Bearer <key>' or log in as staff.")
