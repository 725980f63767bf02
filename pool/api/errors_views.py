"""Django's 404/500 handlers: OpenAI's envelope for the API paths, plain pages elsewhere."""

from django.http import HttpResponseNotFound, HttpResponseServerError

from ..errors import NotFound, PoolError
from .errors import error_response

API_PREFIXES = ("/v1/", "/api/", "/health", "/metrics", "/admin/model/")


def not_found(request, exception=None):
    if request.path.startswith(API_PREFIXES):
        return error_response(NotFound(f"No route for {request.method} {request.path}."))
    return HttpResponseNotFound("<h1>Not found</h1>")


def server_error(request):
    if request.path.startswith(API_PREFIXES):
        return error_response(PoolError("The server failed while handling the request; see its log.",
                                        code="internal_error"))
    return HttpResponseServerError("<h1>Server error</h1>")
