"""What a request's API key (auth.py attaches it as `request.omlx_key`) limits: the models it may
name and see, and the prompt cache its requests may reuse; and its requests counted by its name."""

from __future__ import annotations

import logging

from ..errors import ModelNotFound
from ..fleet.proxy import FORWARDED
from ..keys.records import KeyRecord
from ..runtime import get_runtime
from ..serving.slots import REQUEST_KEY
from ..serving.specs import REQUEST_CACHE_SCOPE
from .errors import ModelNotAllowed

log = logging.getLogger(__name__)


def key_of(request) -> KeyRecord | None:
    return getattr(request, "omlx_key", None)


def limited(request) -> bool:
    """Whether the request's key may use only some models."""
    key = key_of(request)
    return key is not None and bool(key.models)


def visible(request, model_id: str) -> bool:
    """Whether the request's key may use (and so see, in /v1/models and /api/tags) this model."""
    key = key_of(request)
    return key is None or key.allows(model_id)


def visible_name(request, name: str) -> bool:
    """`visible` for a name or alias (another host's listing)."""
    key = key_of(request)
    return key is None or not key.models or key.allows(_named(get_runtime().router, name))


def check_model(request, name: str) -> None:
    """403 `model_not_allowed` when the key is limited to other models (checked on the model id the
    name or alias resolves to); a name that is no model is a 404 naming only the key's models."""
    key = key_of(request)
    if key is None or not key.models:
        return
    router = get_runtime().router
    try:
        model_id = router.resolve(name).model_id
    except ModelNotFound:
        if name in key.models:          # another host of the fleet has it: it resolves there
            return
        raise ModelNotFound(name, [n for n in router.visible_names() if _named(router, n) in key.models]) from None
    if not key.allows(model_id):
        raise ModelNotAllowed(f"This API key ('{key.name}') may not use '{name}'; it may use: "
                              f"{', '.join(key.models)}.", param="model")


def _named(router, name: str) -> str:
    try:
        return router.resolve(name).model_id
    except ModelNotFound:
        return name


def enter(request) -> None:
    """Give the request's prompt cache scope to the specs its view makes (serving/specs.scoped): the
    key's own, or None (a sharing key, an open server); and its key's name to the model slots."""
    key = key_of(request)
    REQUEST_CACHE_SCOPE.set(key.cache_scope if key is not None else None)
    REQUEST_KEY.set(key.name if key is not None else None)


def count(request, status: int) -> None:
    """One request of a key (the model APIs), by its name and the status it got: /metrics' key_requests,
    counted on the host the request entered (a hop's is not counted again where it is served)."""
    key = key_of(request)
    if key is None or FORWARDED in request.headers:
        return
    try:
        get_runtime().metrics.key_request(key.name, status)
    except Exception:   # a runtime that did not start counts nothing
        log.debug("key_requests not counted", exc_info=True)
