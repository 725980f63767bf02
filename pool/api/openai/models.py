"""GET /v1/models and /v1/models/{id}: every model the router knows, with its capabilities and
context length (read from its folder, not loaded)."""

from __future__ import annotations

from django.http import JsonResponse

from ...catalog.kinds import model_card
from ...router import Router
from ...runtime import get_runtime
from .. import wants
from ..auth import require_key
from ..key_limits import visible
from ..route import api_route


def model_object(router: Router, model) -> dict:
    created = int(model.path.stat().st_mtime) if model.path.exists() else 0
    return {"id": model.id, "object": "model", "created": created, "owned_by": "omlx-site",
            "alias": router.alias(model.id), "state": model.state, "size_bytes": model.size_bytes,
            **model_card(model.card_folder, model.kind), **({"parent": model.base} if model.base else {})}


def remote_model_object(router: Router, row: dict) -> dict:
    """A model only other hosts of the fleet have, as their snapshot shows it."""
    return {"id": row["id"], "object": "model", "created": 0, "owned_by": "omlx-site", "alias": router.alias(row["id"]),
            "state": row["state"], "size_bytes": row["size_bytes"], "capabilities": row.get("capabilities", []),
            "context_length": row.get("context_length"), **({"parent": row["base"]} if row.get("base") else {})}


@api_route("GET", auth=require_key)
async def list_models(request):
    runtime = get_runtime()
    router = runtime.router
    data = [model_object(router, m) for m in router.models() if not router.hidden(m.id) and visible(request, m.id)]
    if runtime.fleet is not None and runtime.fleet.registry is not None:
        known = {m["id"] for m in data} | {m.id for m in router.models()}
        for record in await runtime.fleet.records():
            for row in record["snapshot"]["models"]:
                if row["id"] not in known and not row.get("hidden") and visible(request, row["id"]):
                    known.add(row["id"])
                    data.append(remote_model_object(router, row))
        data.sort(key=lambda m: m["id"])
    return JsonResponse({"object": "list", "data": data})


@api_route("GET", auth=require_key, wants=wants.model_in_path_here_first)
async def get_model(request, model_id: str):
    router = get_runtime().router
    return JsonResponse(model_object(router, router.resolve(model_id).model))
