"""Model names as Ollama's clients write them: the router's names (ids and aliases, as /v1/* takes
them), and the same with Ollama's default tag `:latest` appended. /api/tags and /api/ps name each
model with its tag, as Ollama does: clients key on that (Open WebUI's unload adds `:latest` to a
bare name and looks it up in /api/tags)."""

from __future__ import annotations

from ...errors import InvalidRequest, ModelNotFound
from ...router import Router, Target

LATEST = ":latest"


def tagged(name: str) -> str:
    """A name as Ollama lists it: with a tag, `:latest` unless its last path part has one."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


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
