"""JSON routes for operators: the pool snapshot, load/unload, load plans, settings, history."""

from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse

from ... import services
from ...errors import InvalidRequest
from ...runtime import get_runtime
from ...strict_json import dumps_finite
from .. import wants
from ..auth import require_key_or_staff
from ..fields import json_body
from ..route import api_route


def _finite_json(body: dict) -> HttpResponse:
    """The snapshot's shape as the websocket sends it: never a bare NaN or Infinity."""
    return HttpResponse(dumps_finite(body), content_type="application/json")


def _state_body(request) -> dict:
    """State-changing calls require a JSON body (an empty object is fine): a plain form post
    from another site cannot forge one."""
    if request.content_type != "application/json":
        raise InvalidRequest("Send a JSON body with 'Content-Type: application/json' (e.g. {}).")
    return json_body(request) if request.body else {}


@api_route("GET")
async def health(request):
    """200 once the runtime has started; api_route answers 503 with the reason when it cannot."""
    return JsonResponse({"status": "ok"})


@api_route("GET", auth=require_key_or_staff)
async def pool_snapshot(request):
    return _finite_json(get_runtime().snapshot())


@api_route("POST", auth=require_key_or_staff, wants=wants.model_in_path)
async def load_model(request, model_id: str):
    _state_body(request)
    entry = await get_runtime().router.load(model_id)
    return JsonResponse({"status": "ok", "model": entry.id, "state": entry.state,
                         "measured_bytes": entry.measured_bytes, "load_seconds": entry.load_seconds,
                         "note": entry.load_note})


@api_route("POST", auth=require_key_or_staff, wants=wants.loaded_model_in_path)
async def unload_model(request, model_id: str):
    body = _state_body(request)
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise InvalidRequest("'force' must be true or false", param="force")
    runtime = get_runtime()
    entry = await runtime.router.unload(model_id, force=force)
    body = {"status": "ok", "model": entry.id, "state": entry.state}
    if runtime.events.pending:    # the unload is done; its history row waits for the database
        body["note"] = ("the history row waits in memory until the database takes writes again "
                        "(GET /api/evictions shows it with \"stored\": false)")
    return JsonResponse(body)


@api_route("GET", auth=require_key_or_staff, wants=wants.model_in_path_here_first)
async def load_plan(request, model_id: str):
    model, plan = get_runtime().router.plan(model_id)
    return JsonResponse({"model": model, "fits": plan.fits, "evicts": list(plan.victim_ids),
                         "with_headroom": plan.with_headroom, "code": plan.code, "message": plan.message,
                         "blockers": list(plan.blockers), "needed_bytes": plan.needed_bytes,
                         "resident_bytes": plan.resident_bytes, "budget_bytes": plan.budget_bytes})


@api_route("GET", "POST", "PUT", auth=require_key_or_staff, wants=wants.model_in_path_here_first)
async def model_settings(request, model_id: str):
    router = get_runtime().router
    if request.method == "GET":
        return JsonResponse(await services.get_model_settings(router=router, name=model_id))
    body = _state_body(request)
    return JsonResponse(await services.update_model_settings(router=router, name=model_id, changes=body))


@api_route("GET", auth=require_key_or_staff)
async def fleet(request):
    """Every live host of the fleet with its snapshot, and where the pinned models are loaded; alone,
    this host only."""
    runtime = get_runtime()
    if runtime.fleet is None:
        return _finite_json({"host": runtime.settings.host_id, "fleet": False,
                             "hosts": [{"host": runtime.settings.host_id, "url": runtime.settings.advertise_url,
                                        "age_seconds": 0.0, "snapshot": runtime.snapshot()}],
                             "pins": {}})
    return _finite_json(await runtime.fleet.state())


@api_route("GET", auth=require_key_or_staff)
async def evictions(request):
    try:
        limit = int(request.GET.get("limit", 50))
    except ValueError:
        raise InvalidRequest("'limit' must be an integer", param="limit") from None
    if not 1 <= limit <= 1000:
        raise InvalidRequest("'limit' must be between 1 and 1000", param="limit")
    model, reason = request.GET.get("model") or None, request.GET.get("reason") or None
    body: dict = {}
    try:
        stored = await services.recent_events(model=model, reason=reason, limit=limit)
    except DatabaseError as e:
        stored, body["note"] = [], f"the database does not answer ({type(e).__name__}): only the events not " \
                                   "yet written are shown"
    # events the database could not take yet (locked, full): shown first, `"stored": false`
    waiting = [e for e in get_runtime().events.unstored()
               if (model is None or e["model"] == model) and (reason is None or e["reason"] == reason)]
    return JsonResponse({"events": (waiting + stored)[:limit], **body})


@api_route("POST", auth=require_key_or_staff)
async def enforcer_tick(request):
    """Run one enforcer tick now (operators: "check now"; tests: no waiting for the poll)."""
    _state_body(request)
    runtime = get_runtime()
    decision = await runtime.host.tick()
    actions = [{"kind": a.kind, "model": a.model, "reason": a.reason} for a in decision.actions] if decision else []
    return _finite_json({"level": runtime.host.enforcer.level, "actions": actions,
                         "memory": runtime.snapshot()["memory"]})


@api_route("POST", auth=require_key_or_staff)
async def rediscover(request):
    """Re-scan the model folders: new models appear, and failed loads may be tried again."""
    _state_body(request)
    router = get_runtime().router
    router.rediscover()
    await services.load_all_settings(router)
    return JsonResponse({"status": "ok", "models": [m.id for m in router.models()]})
