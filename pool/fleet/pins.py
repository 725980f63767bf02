"""Pins in a fleet: a pinned model stays loaded on at least one host. Where no live host has it, the
host the router would send it to loads it; every host runs this over the same published data, so
they agree on who (and a second copy, if two ever disagree, is harmless)."""

from __future__ import annotations

from typing import Iterable

from ..policy.vocabulary import RESIDENT_STATES
from .placement import HostView, place


def pin_duties(pinned: Iterable[str], hosts: list[HostView]) -> dict[str, str]:
    """pinned model id -> the host that must load it now; a model resident somewhere is not listed."""
    duties = {}
    for model_id in sorted(set(pinned)):
        views = [h.model(model_id) for h in hosts]
        if any(v is not None and v.state in RESIDENT_STATES for v in views):
            continue
        target = place(model_id, hosts).host
        if target is not None:
            duties[model_id] = target
    return duties


def pin_locations(pinned: Iterable[str], hosts: list[HostView]) -> dict[str, list[str]]:
    """pinned model id -> the hosts it is loaded (or loading) on, for /api/fleet and the dashboard."""
    return {model_id: sorted(h.id for h in hosts
                             if (m := h.model(model_id)) is not None and m.state in RESIDENT_STATES)
            for model_id in sorted(set(pinned))}
