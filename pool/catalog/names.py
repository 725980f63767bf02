"""Model names as clients write them -> model ids: the one resolution rule.

An exact id wins, then an exact alias, then either ignoring case (ids before aliases). A name that
matches none and ends in Ollama's default tag `:latest` names what it names without the tag: Ollama's
listings (/api/tags) add the tag to every untagged name, and clients send those names to every
dialect (Codex's Ollama mode sends them to /v1/responses)."""

from __future__ import annotations

from collections.abc import Iterable

LATEST = ":latest"


def tagged(name: str) -> str:
    """A name as Ollama lists it: with a tag, `:latest` unless its last path part has one."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def resolve_name(name: str, models: Iterable[tuple[str, str | None]]) -> str | None:
    """The id that `name` names among (id, alias) pairs, or None. An id listed twice keeps the
    alias it was last given."""
    aliases = dict(models)
    found = _match(name, aliases)
    if found is None and name.lower().endswith(LATEST):
        bare = name[:-len(LATEST)]
        # only the name Ollama's listing made from an untagged one: `x:7b:latest` is no listed name
        if bare and tagged(bare) == bare + LATEST:
            found = _match(bare, aliases)
    return found


def _match(name: str, aliases: dict[str, str | None]) -> str | None:
    ids = sorted(aliases)
    lowered = name.lower()
    rules = (lambda i: i == name, lambda i: aliases[i] == name,
             lambda i: i.lower() == lowered, lambda i: aliases[i] is not None and aliases[i].lower() == lowered)
    for matches in rules:
        for model_id in ids:
            if matches(model_id):
                return model_id
    return None
