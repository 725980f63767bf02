"""Model names as Ollama's clients write them: the router's names (ids and aliases, as /v1/* takes
them), and the same with Ollama's default tag `:latest` appended, which some clients add."""

from __future__ import annotations

from ...errors import InvalidRequest, ModelNotFound
from ...router import Router, Target

LATEST = ":latest"


def resolve(router: Router, name: str) -> Target:
    try:
        return router.resolve(name)
    except ModelNotFound:
        if not name.endswith(LATEST):
            raise
    try:
        return router.resolve(name.removesuffix(LATEST))
    except ModelNotFound:
        raise ModelNotFound(name, router.visible_names()) from None


def model_field(body: dict) -> str:
    """The model a request names: `model`, or `name` (what Ollama's older clients send)."""
    value = body.get("model")
    if value is None:
        value = body.get("name")
    if not isinstance(value, str) or not value:
        raise InvalidRequest("'model' is required: the name of a model (GET /api/tags lists them)", param="model")
    return value
