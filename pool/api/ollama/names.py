"""Model names as Ollama's clients write them: the router's names (ids and aliases, as /v1/* takes
them), `:latest` included (catalog/names.py resolves it for every dialect). /api/tags and /api/ps
name each model with its tag, as Ollama does: clients key on that (Open WebUI's unload adds
`:latest` to a bare name and looks it up in /api/tags)."""

from __future__ import annotations

from ...catalog.names import tagged
from ...errors import InvalidRequest

__all__ = ["tagged", "model_field"]


def model_field(body: dict) -> str:
    """The model a request names: `model`, or `name` (what Ollama's older clients send)."""
    value = body.get("model")
    if value is None:
        value = body.get("name")
    if not isinstance(value, str) or not value:
        raise InvalidRequest("'model' is required: the name of a model (GET /api/tags lists them)", param="model")
    return value
