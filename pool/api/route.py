"""The decorator every JSON route wears: method check, auth, the runtime started, errors rendered."""

from __future__ import annotations

import functools

from django.views.decorators.csrf import csrf_exempt

from ..errors import MethodNotAllowed, PoolError
from ..runtime import ensure_started
from .errors import error_response, internal_error


def api_route(*methods: str, auth=None):
    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    error = MethodNotAllowed(f"{request.method} is not allowed here; use {', '.join(methods)}.")
                    response = error_response(error)
                    response["Allow"] = ", ".join(methods)
                    return response
                if auth is not None:
                    await auth(request)
                await ensure_started()
                return await view(request, *args, **kwargs)
            except PoolError as e:
                return error_response(e)
            except Exception as e:  # noqa: BLE001 - never a traceback in a body
                return internal_error(e)
        return wrapper
    return decorate
