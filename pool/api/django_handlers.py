"""Django's 400/404/500 handlers and its CSRF failure view: the API's envelope (Anthropic's under
/v1/messages, OpenAI's on the other API paths), Django's plain pages elsewhere; a 404 is the
envelope on every path."""

from django.core.exceptions import DisallowedHost
from django.http import HttpResponseServerError
from django.views import csrf, defaults

from ..errors import InvalidRequest
from .dialects import for_path
from .errors import Forbidden, RouteNotFound, error_response, internal

API_PREFIXES = ("/v1/", "/api/", "/health", "/metrics", "/admin/model/")


def is_api(request) -> bool:
    return request.path.startswith(API_PREFIXES)


def bad_request(request, exception=None):
    """A request Django refused before any view: a Host it does not answer to (DNS rebinding), or a
    body it could not parse."""
    if not is_api(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        error = InvalidRequest("The Host header names a host this server does not answer to; add the name "
                           "to OMLX_ALLOWED_HOSTS if it is yours.", code="disallowed_host")
    else:
        error = InvalidRequest("The request could not be read.")
    return error_response(error, for_path(request.path))


def csrf_failure(request, reason=""):
    """A cookie-authenticated change from a page of another origin, or without the CSRF token."""
    if not is_api(request):
        return csrf.csrf_failure(request, reason)
    error = Forbidden(f"Cross-site request refused: {reason.rstrip('.')}. Browsers: send the page's CSRF token in "
                      "X-CSRFToken; scripts: send the API key instead of a session cookie.", code="csrf_failed")
    return error_response(error, for_path(request.path))


def not_found(request, exception=None):
    """Every path no route answers, the API's or not: the JSON envelope (clients probe paths such as
    /v1/models under other prefixes); the dashboard's pages are routes, and stay HTML."""
    return error_response(RouteNotFound(f"No route for {request.method} {request.path}."), for_path(request.path))


def server_error(request):
    if is_api(request):
        return error_response(internal(), for_path(request.path))
    return HttpResponseServerError("<h1>Server error</h1>")
