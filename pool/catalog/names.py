"""Model names as clients write them -> model ids: the one resolution rule.

An exact id wins, then an exact alias, then either ignoring case (ids before aliases)."""

from __future__ import annotations

from collections.abc import Iterable


def resolve_name(name: str, models: Iterable[tuple[str, str | None]]) -> str | None:
    """The id that `name` names among (id, alias) pairs, or None. An id listed twice keeps the
    alias it was last given."""
    aliases = dict(models)
    ids = sorted(aliases)
    lowered = name.lower()
    rules = (lambda i: i == name, lambda i: aliases[i] == name,
             lambda i: i.lower() == lowered, lambda i: aliases[i] is not None and aliases[i].lower() == lowered)
    for matches in rules:
        for model_id in ids:
            if matches(model_id):
                return model_id
    return None
