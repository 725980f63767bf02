"""Model names -> ids: the one rule the pool and the `pin` command share."""

import pytest

from pool.catalog.names import resolve_name

MODELS = [("Qwen3-8B", "qwen"), ("llama", None), ("LLAMA-big", "Llama"), ("org/Model", None)]


@pytest.mark.parametrize("name, expected", [
    ("Qwen3-8B", "Qwen3-8B"),          # an exact id
    ("qwen", "Qwen3-8B"),              # an exact alias
    ("qwen3-8b", "Qwen3-8B"),          # an id, ignoring case
    ("QWEN", "Qwen3-8B"),              # an alias, ignoring case
    ("llama", "llama"),                # an exact id beats another model's alias in another case
    ("Llama", "LLAMA-big"),            # an exact alias beats an id in another case
    ("LLAMA", "llama"),                # ignoring case, ids come before aliases
    ("org/model", "org/Model"),
    ("missing", None),
    ("", None),
    ("llama:latest", "llama"),         # Ollama's default tag, as /api/tags lists every untagged name
    ("qwen:latest", "Qwen3-8B"),       # an alias with it
    ("org/Model:LATEST", "org/Model"),
    ("Qwen3-8B:7b:latest", None),      # a tagged name never gets `:latest` in a listing
    (":latest", None),
    ("missing:latest", None),
])
def test_resolve_name(name, expected):
    assert resolve_name(name, MODELS) == expected


def test_an_id_or_alias_that_ends_in_latest_is_itself_never_another_model():
    models = [("m:latest", None), ("m", None), ("other", "o:latest"), ("o", None)]
    assert resolve_name("m:latest", models) == "m:latest" and resolve_name("m", models) == "m"
    assert resolve_name("o:latest", models) == "other"
