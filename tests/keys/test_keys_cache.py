"""The prompt cache isolated per API key through a real server (issue 23; vLLM's CVE-2025-46570 class):
a key's requests never reuse another key's cached prefix, whose hit would tell it (`cached_tokens`,
the shorter time to the first token) that the other sent that prompt; a key's own second request
does; keys marked as sharing share. Also across a hop (the key's name) and after the entries went to
the disk tier and the server restarted."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import DEMO
from tests.keys.helpers import BOOT, FLEET, keys, made

PROMPT = "Read this and answer with one word. " + " ".join(f"item{i}" for i in range(120))


@pytest.fixture(scope="module")
def server(module_server, stand_in_demo_dir):     # cached_tokens only: the two-layer stand-in reads prompts 7x faster
    return module_server({DEMO: stand_in_demo_dir}, OMLX_API_KEY=BOOT, OMLX_FLEET_KEY=FLEET)


@pytest.fixture(scope="module")
def named(server) -> dict[str, str]:
    # a fresh key for each check that needs one with no entries yet: a chat's prompts share the template's
    # first tokens, so a key's own older entry gives a few cached tokens even for another prompt
    found = {name: made(server, name) for name in ("alice", "bob", "erin", "frank", "gina", "hank")}
    found |= {name: made(server, name, "--shares-cache") for name in ("carol", "dave")}
    return found


def cached(server, key: str, prompt: str = PROMPT, headers: dict | None = None) -> int:
    client = server.openai(api_key=key, default_headers=headers)
    reply = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": prompt}], max_tokens=1,
                                           temperature=0)
    return reply.usage.prompt_tokens_details.cached_tokens


def test_two_keys_sending_the_same_prefix_do_not_share_it(server, named):
    assert cached(server, named["alice"]) == 0
    assert cached(server, named["bob"]) == 0                # the same prompt: alice's entry is not bob's
    assert cached(server, named["alice"]) > 100             # alice's own second request reuses it
    assert cached(server, named["bob"]) > 100
    assert cached(server, BOOT) == 0                        # the bootstrap key has its own scope too


def test_keys_marked_as_sharing_share(server, named):
    shared = "Shared: " + PROMPT
    assert cached(server, named["carol"], shared) == 0
    assert cached(server, named["dave"], shared) > 100
    assert cached(server, named["erin"], shared) == 0       # a key of its own does not see theirs


def test_a_hop_serves_in_the_keys_scope(server, named):
    hop = {"x-omlx-forwarded": "another-host", "x-omlx-fleet-key": FLEET}
    assert cached(server, "unused", headers={**hop, "x-omlx-key-name": "alice"}) > 100
    assert cached(server, "unused", headers={**hop, "x-omlx-key-name": "frank"}) == 0
    assert cached(server, "unused", headers={**hop, "x-omlx-key-name": "unknown-here"}) == 0   # its own scope


def test_the_disk_tier_keeps_keys_apart_across_a_restart(server, named):
    prompt = "On disk: " + PROMPT
    assert cached(server, named["gina"], prompt) == 0
    unloaded = server.post(f"/api/models/{DEMO}/unload", {})
    assert unloaded.status_code == 200, unloaded.text          # the entries go to the disk tier
    server.stop()
    server.start()
    assert cached(server, named["hank"], prompt) == 0
    assert cached(server, named["gina"], prompt) > 100         # read back from disk, for gina only
    assert "gina" in keys(server, "list")


def test_a_stored_response_belongs_to_the_key_that_made_it(server, named):
    """Another key cannot read, continue or delete it: to that key the id does not exist."""
    mine, theirs = server.openai(api_key=named["gina"]), server.openai(api_key=named["hank"])
    first = mine.responses.create(model=DEMO, input="Say hi.", max_output_tokens=4)
    for attempt in (lambda: theirs.responses.retrieve(first.id), lambda: theirs.responses.input_items.list(first.id),
                    lambda: theirs.responses.delete(first.id),
                    lambda: theirs.responses.create(model=DEMO, input="And?", max_output_tokens=2,
                                                    previous_response_id=first.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert mine.responses.retrieve(first.id).id == first.id
    assert mine.responses.create(model=DEMO, input="And?", max_output_tokens=2, previous_response_id=first.id).output
