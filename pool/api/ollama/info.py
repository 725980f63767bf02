"""Ollama's informational routes: GET /api/version, GET /api/tags (every model), GET /api/ps (the
loaded ones, from the pool's own accounting), POST /api/show (one model's card), and `GET /` and
`HEAD /`'s liveness answer. /api/pull of a model this server has succeeds, as Ollama's does; it,
/api/push, /api/create, /api/copy and /api/delete change nothing here, and for anything else answer
how models are added to this server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from django.http import HttpResponse, JsonResponse

from ...catalog.kinds import model_card
from ...errors import InvalidRequest, ModelNotFound
from ...fleet.gather import gather_json
from ...router import Router
from ...runtime import get_runtime
from .. import wants
from ..auth import fleet_hop, require_key
from ..dialects import OLLAMA
from ..fields import json_body
from ..key_limits import visible, visible_name
from ..route import api_route
from .cards import Card, model_facts
from .names import model_field, tagged

# The newest Ollama release whose API these routes and /v1/* answer like (docs/api.md says why):
# clients gate features on it (Codex's Ollama mode needs 0.13.4 for /v1/responses).
VERSION = "0.14.0"
LIVENESS = "Ollama is running"
# Ollama's status lines for a pull of a model it has: no layer left to download
PULLED = ("pulling manifest", "verifying sha256 digest", "writing manifest", "success")
# Ollama's expires_at for a model time never unloads (keep_alive < 0): now + the longest Go duration.
FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)
# what /v1/models says a model can do -> Ollama's capabilities
CAPABILITIES = {"chat": "completion", "tools": "tools", "embeddings": "embedding", "vision": "vision"}
HOW_MODELS_ARRIVE = ("Models are added here as folders, not through this API: put an mlx-lm model folder in one of "
                     "OMLX_MODEL_DIRS, or convert a GGUF with `manage.py import_gguf PATH_OR_PACKAGE` (which tells "
                     "a running server to re-discover; after adding a folder by hand, POST /api/rediscover). "
                     "GET /api/tags lists what is here.")


class NotHere(InvalidRequest):
    """One of Ollama's model-management verbs, which this server leaves to its model folders."""
    code = "not_supported"


def liveness(request) -> HttpResponse:
    """`GET /` and `HEAD /` for clients that are not browsers: Ollama's heartbeat (no key needed, as
    /health)."""
    return HttpResponse(LIVENESS, content_type="text/plain; charset=utf-8")


@api_route("GET", "HEAD", auth=require_key, dialect=OLLAMA)
async def version(request):
    return JsonResponse({"version": VERSION})


def _name(router: Router, model_id: str) -> str:
    return tagged(router.alias(model_id) or model_id)


def _summary(router: Router, model, facts: Card) -> dict[str, Any]:
    """What /api/tags and /api/ps both say of a model."""
    name = _name(router, model.id)
    return {"name": name, "model": name, "digest": facts.digest, "details": _details(router, model, facts)}


def _details(router: Router, model, facts: Card) -> dict[str, Any]:
    """Ollama's `details`; an adapter names its base as `parent_model`, as a model made FROM another does."""
    details = facts.details()
    if model.base is not None:
        details["parent_model"] = _name(router, model.base)
    return details


@api_route("GET", "HEAD", auth=require_key, dialect=OLLAMA)
async def tags(request):
    router = get_runtime().router
    models = []
    for model in router.models():
        if router.hidden(model.id) or not visible(request, model.id):
            continue
        facts = model_facts(model)
        summary = _summary(router, model, facts)
        models.append({"name": summary["name"], "model": summary["model"], "modified_at": facts.modified_at,
                       "size": facts.disk_bytes, "digest": facts.digest, "details": summary["details"]})
    listed = {m["name"] for m in models}
    for row in await _fleet_models(request, "/api/tags"):
        if row.get("name") not in listed:
            listed.add(row.get("name"))
            models.append(row)
    return JsonResponse({"models": models})


async def _fleet_models(request, path: str) -> list[dict]:
    """The other hosts' answers to the same route, where this host is one of a fleet (a hop from
    another host is answered for this host alone)."""
    fleet = get_runtime().fleet
    if fleet is None or fleet.registry is None or fleet_hop(request):
        return []
    return [row for _, body in await gather_json(fleet, path) for row in body.get("models", [])
            if isinstance(row, dict) and visible_name(request, str(row.get("model", "")))]


def expires_at(row: dict, now: float) -> str:
    """When time alone would unload a loaded model (its row in the pool's snapshot): the TTL or
    keep_alive left; while requests hold it, the whole TTL or keep_alive from now; never (a pin, a
    negative keep_alive, no TTL): Ollama's far future."""
    remaining = row.get("ttl_remaining_seconds")
    if remaining is None and row.get("active_requests") and not row.get("pinned"):
        keep_alive = row.get("keep_alive")
        if keep_alive is None:
            remaining = row.get("ttl_seconds")
        elif keep_alive >= 0:
            remaining = keep_alive
    start = datetime.fromtimestamp(now, timezone.utc)
    left = FOREVER if remaining is None or remaining >= FOREVER.total_seconds() else timedelta(seconds=remaining)
    return (start + left).isoformat()


@api_route("GET", "HEAD", auth=require_key, dialect=OLLAMA)
async def ps(request):
    runtime = get_runtime()
    router = runtime.router
    snapshot = runtime.snapshot()
    records = {m.id: m for m in router.models()}
    models = []
    for row in snapshot["models"]:
        model = records.get(row["id"])
        if row["state"] != "loaded" or row["hidden"] or model is None or not visible(request, row["id"]):
            continue
        # Ollama's size holds the KV of the context it reports beside it: here, what one request at the
        # whole context would add (the snapshot's estimate, from the model's own caches); unified
        # memory, so all of it is the GPU's
        at_context = (row.get("kv_layout") or {}).get("kv_bytes_at_context") or 0
        size = (row["measured_bytes"] or row["size_bytes"]) + at_context
        models.append({**_summary(router, model, model_facts(model)), "size": size, "size_vram": size,
                       "expires_at": expires_at(row, snapshot["time"]), "context_length": row["context_length"]})
    models += await _fleet_models(request, "/api/ps")      # a model loaded on two hosts is listed twice
    models.sort(key=lambda m: m["expires_at"], reverse=True)    # Ollama's order: the longest left first
    return JsonResponse({"models": models})


def _parameters(router: Router, model_id: str, facts: Card, context_length: int | None) -> list[tuple[str, Any]]:
    """Ollama's PARAMETER lines: the context, the stop string, and the sampling defaults in force
    (the model's settings, else its generation_config.json)."""
    params: list[tuple[str, Any]] = []
    if context_length:
        params.append(("num_ctx", context_length))
    params += [("stop", stop) for stop in facts.stop]
    settings = router.model_settings.get(model_id, {})
    for name in ("temperature", "top_p", "top_k"):
        value = settings.get(name)
        if value is None:
            value = facts.generation.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            params.append((name, value))
    return params


def _parameter_text(params: list[tuple[str, Any]]) -> str:
    return "\n".join(f"{name:<30} {_quoted(value)}" for name, value in params)


def _quoted(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def _modelfile(name: str, model_id: str, facts: Card, params: list[tuple[str, Any]]) -> str:
    """FROM names the model, never its folder: a path tells a client nothing it can use and tells
    anyone who can read the answer how the server's disk is laid out."""
    lines = [f'# Modelfile generated by omlx-site for "{name}"',
             "# This model is a folder of the server's, served as it is: no Modelfile builds it here.",
             f"FROM {tagged(model_id)}"]
    if facts.template:
        lines.append(f'TEMPLATE """{facts.template}"""')
    lines += [f"PARAMETER {name} {_quoted(value)}" for name, value in params]
    return "\n".join(lines) + "\n"


@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_model_here_first)
async def show(request):
    body = json_body(request)
    name = model_field(body)
    router = get_runtime().router
    model = router.resolve(name).model
    facts = model_facts(model)
    context_length = model_card(model.card_folder, model.kind)["context_length"]
    params = _parameters(router, model.id, facts, context_length)
    answer: dict[str, Any] = {
        "modelfile": _modelfile(name, model.id, facts, params),
        "parameters": _parameter_text(params),
        "template": facts.template,
        "details": _details(router, model, facts),
        "model_info": facts.model_info(context_length),
        "capabilities": [CAPABILITIES[c] for c in model.kind.capabilities if c in CAPABILITIES],
        "modified_at": facts.modified_at,
    }
    if facts.license:
        answer["license"] = facts.license
    return JsonResponse({k: v for k, v in answer.items() if v != ""})    # Ollama leaves empty fields out


def _refusal(verb: str, advice: str, method: str = "POST"):
    async def refuse(request):
        raise NotHere(f"This server does not {verb} models through Ollama's API, and nothing on disk was changed. "
                      f"{advice}{HOW_MODELS_ARRIVE}")
    refuse.__name__ = refuse.__qualname__ = verb
    return api_route(method, auth=require_key, dialect=OLLAMA)(refuse)


@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_model_here_first)
async def pull(request):
    """A model this server has is already pulled: Ollama's answer for one it has (Codex's Ollama mode
    pulls before its first turn). Any other is refused, saying how models arrive."""
    body = json_body(request)
    name = model_field(body)
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", param="stream")
    router = get_runtime().router
    try:
        router.resolve(name)
    except ModelNotFound:
        raise NotHere(f"The model '{name}' is not on this server, which does not pull models through Ollama's "
                      f"API; nothing on disk was changed. {HOW_MODELS_ARRIVE}") from None
    if not stream:
        return JsonResponse({"status": "success"})
    lines = b"".join(json.dumps({"status": status}).encode() + b"\n" for status in PULLED)
    return HttpResponse(lines, content_type="application/x-ndjson")

push = _refusal("push", "")
create = _refusal("create", "A Modelfile does not build models here; per-model defaults (temperature, top_p, "
                            "max_tokens, TTL, pin, alias) are model settings: the admin, or "
                            "/admin/model/<id>/settings. ")
copy = _refusal("copy", "To give a model another name, set its alias (a model setting: the admin, or "
                        "/admin/model/<id>/settings). ")
delete = _refusal("delete", "To remove a model, remove its folder (or hide it with the model setting is_hidden). ",
                  "DELETE")
