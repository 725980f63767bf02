"""The decorator every JSON route wears: method check, a JSON body on state-changing calls, Django's
CSRF check on browser requests without the key, auth, the runtime ready (omlx_site.startup starts
it), errors rendered in the route's dialect (`dialect=OPENAI` or `ANTHROPIC`, dialects.py)."""

from __future__ import annotations

import functools

from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from ..errors import InvalidRequest, PoolError
from ..fleet.routing import fleet_routes, route
from ..runtime import ready_runtime
from . import tracing
from .auth import carries_key, fleet_hop, hop_key, is_browser, needs_csrf_check
from .dialects import OPENAI, Dialect
from .errors import MethodNotAllowed, error_response, internal_error, stream_error
from .key_limits import check_model, count, enter, limited


def is_json(content_type: str) -> bool:
    """`application/json` or a `+json` type; parameters (charset) are already stripped."""
    content_type = content_type.lower()
    return content_type == "application/json" or (content_type.startswith("application/")
                                                   and content_type.endswith("+json"))


FETCH = "sec-fetch-site"        # a browser's fetch metadata


def require_json_body(request) -> None:
    """A page on another site can post a form or text/plain without asking; a JSON body needs a
    CORS preflight this server never grants. Every browser's POST carries an Origin, so a script's
    (`curl -d`, as Ollama's docs write it) without one, or with the key, is taken as it is; and other
    methods (DELETE) always need a preflight."""
    if request.method != "POST" or carries_key(request) or not (is_browser(request) or FETCH in request.headers):
        return
    if not is_json(request.content_type or ""):
        raise InvalidRequest("State-changing calls take a JSON body: send 'Content-Type: application/json' "
                         "(the body may be {}).", code="unsupported_media_type")


def csrf_refusal(request):
    """Django's CSRF check for a browser's state-changing request without the key: the response it
    refuses with (settings.CSRF_FAILURE_VIEW: the API's envelope), or None."""
    if not needs_csrf_check(request.method, key_valid=carries_key(request), browser=is_browser(request)):
        return None
    return CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})


def api_route(*methods: str, auth=None, dialect: Dialect = OPENAI, wants=None):
    """`wants(request, kwargs)`: what the route asks of the fleet (fleet/routing.Want, or None), for
    the routes a fleet may serve on another host (pool/api/wants.py); its model is also the one a
    model-limited API key is checked against (key_limits.py)."""
    def decorate(view):
        # Django's middleware skips these views; csrf_refusal applies its rule where it belongs
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            response = await answer(request, *args, **kwargs)
            count(request, response.status_code)
            return response

        async def answer(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    error = MethodNotAllowed(f"{request.method} is not allowed here; use {', '.join(methods)}.")
                    response = error_response(error, dialect)
                    response["Allow"] = ", ".join(methods)
                    return response
                require_json_body(request)
                hop = fleet_hop(request)        # another host of the fleet checked the client (and its origin)
                refusal = None if hop else csrf_refusal(request)
                if refusal is not None:
                    return refusal
                if auth is not None and not hop:
                    await auth(request)
                elif hop:
                    await hop_key(request)
                enter(request)
                ready_runtime()
                # the body is read again only where a fleet routes or the key is limited to some models
                want = wants(request, kwargs) if wants is not None and (limited(request) or fleet_routes()) else None
                if want is not None:
                    check_model(request, want.model)
                    there = await route(request, want, hop=hop, stream_error=lambda e: stream_error(e, dialect)) \
                        if fleet_routes() else None
                    if there is not None:
                        return there
                return await tracing.run(view, request, args, kwargs, dialect)
            except PoolError as e:
                return error_response(e, dialect)
            except Exception as e:  # noqa: BLE001 - never a traceback in a body
                return internal_error(e, dialect)
        return wrapper
    return decorate
