"""A chat model's draft (its `draft_model` setting): another chat model of the pool, named by id or
alias, whose weights its engine reads beside its own (engines/drafting.py), so the pair loads,
counts, pins and goes as one. A name that finds no such model is no draft (the model decodes alone)."""

from __future__ import annotations

from typing import Mapping

from ..catalog.kinds import CHAT
from ..catalog.names import resolve_name
from .entries import Entry


def draft_of(entries: Mapping[str, Entry], entry: Entry) -> Entry | None:
    name = entry.model_settings.get("draft_model")
    if not name or entry.kind is not CHAT:
        return None
    found = resolve_name(name, [(e.id, e.alias) for e in entries.values()])
    draft = entries.get(found) if found is not None else None
    if draft is None or draft is entry or draft.kind is not CHAT:
        return None
    return draft
