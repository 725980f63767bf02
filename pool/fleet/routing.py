"""Where a request is served in a fleet, and the hop when that is another host: placement.py decides
over what every host last published; proxy.py carries the request. Without OMLX_REDIS_URL every request
is served here. A request that arrived over a hop is served here (it was routed where it entered)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..catalog.names import resolve_name
from ..errors import HostUnavailable, InsufficientMemory, ModelNotFound
from ..policy.vocabulary import RESIDENT_STATES
from ..runtime import get_runtime
from .placement import Placement, Why, place
from .prefix import prefix_keys
from .proxy import HostGone, forward

log = logging.getLogger(__name__)

PLACEMENT = "x-omlx-placement"      # why the fleet chose the host that served (placement.Why)
TRIES = 2                           # a request whose host went away before answering: once more elsewhere


@dataclass(frozen=True)
class Want:
    """What a route asks of the fleet, read from the request before its view runs."""
    model: str                              # the name the client gave
    messages: list[Any] | None = None       # a chat's messages (for prompt-prefix keys)
    host: str | None = None                 # an operator's choice of host (?host=)
    resident: bool = False                  # only where the model is loaded (an unload)
    here_first: bool = False                # here when this host has the model's folder


def fleet_routes() -> bool:
    """Whether this host is in a fleet that routes (OMLX_REDIS_URL)."""
    member = get_runtime().fleet
    return member is not None and member.registry is not None


async def route(request, want: Want, *, hop: bool, stream_error: Callable[[Exception], bytes]):
    """None when this host serves the request (its view runs); else the answer of the host that did."""
    member = get_runtime().fleet
    if member is None or member.registry is None:
        return None
    keys = prefix_keys(want.messages) if want.messages else []
    if hop:
        _served_here(member, want, keys)
        return None
    tried: list[str] = []
    for _ in range(TRIES):
        views, records = await member.views(exclude=tuple(tried))
        model_id = _model_id(want.model, records, member)
        if model_id is None:
            if tried:
                break               # the hosts that had it went away: a 503 (below), not a 404
            return None             # not in the fleet: this host's view answers (a 404 naming the models)
        placement = _placement(model_id, want, views, keys, member.host_id)
        if placement.host is None:
            if tried:
                break
            raise _refusal(want.model, model_id, placement, member)
        if placement.host == member.host_id:
            _served_here(member, want, keys, model_id)
            request.omlx_placement = placement.why      # the answer's x-omlx-placement (api/host_header.py)
            return None
        try:
            key = getattr(request, "omlx_key", None)
            response = await forward(request, records[placement.host]["url"], placement.host, origin=member.host_id,
                                     fleet_key=member.key, stream_error=stream_error,
                                     key_name=key.name if key is not None else None,
                                     deadline=member.runtime.settings.hop_read_timeout)
        except HostGone as e:
            log.warning("host %s did not answer (%s); routing again", placement.host, e)
            member.forget(placement.host)
            tried.append(placement.host)
            continue
        response[PLACEMENT] = placement.why
        return response
    raise HostUnavailable(f"The host{'s' if len(tried) > 1 else ''} {', '.join(tried)} chosen for '{want.model}' "
                          f"did not answer; retry shortly.", retry_after=1)


def _placement(model_id: str, want: Want, views, keys: list[str], local: str) -> Placement:
    if want.host is not None:
        found = any(v.id == want.host and v.model(model_id) is not None for v in views)
        if not found:
            raise ModelNotFound(f"{want.model} on host {want.host}", sorted(v.id for v in views))
        return Placement(want.host, Why.LOADED)
    if want.here_first:     # a question about the model, not a load: any host with its folder answers
        having = [v.id for v in views if v.model(model_id) is not None]
        return Placement(local if local in having else min(having), Why.LOADED)
    if want.resident:
        holders = [v.id for v in views if (m := v.model(model_id)) is not None and m.state in RESIDENT_STATES]
        if holders:
            return Placement(holders[0], Why.LOADED)
    return place(model_id, views, prefix_keys=keys)


def _model_id(name: str, records: dict[str, dict], member) -> str | None:
    router = member.runtime.router
    pairs = {m["id"]: router.alias(m["id"]) for r in records.values() for m in r["snapshot"]["models"]}
    return resolve_name(name, pairs.items())


def _served_here(member, want: Want, keys: list[str], model_id: str | None = None) -> None:
    if keys:
        model_id = model_id or _local_id(member, want.model)
        if model_id is not None:
            member.ledger.served(model_id, keys)


def _local_id(member, name: str) -> str | None:
    router = member.runtime.router
    return resolve_name(name, ((m.id, router.alias(m.id)) for m in router.models()))


def _refusal(name: str, model_id: str, placement: Placement, member) -> Exception:
    if placement.why == Why.NO_HOST:
        return ModelNotFound(name, member.runtime.router.visible_names())
    reasons = "; ".join(f"on {host}: {why}" for host, why in placement.refusals.items())
    return InsufficientMemory(f"No host of the fleet has room for '{model_id}': {reasons}", blockers=placement.refusals)
