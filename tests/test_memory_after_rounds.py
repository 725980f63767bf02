"""What rounds of concurrent streams leave behind (a `manage.py serve` process on the demo model, 32
streams at once as in benchmarks/rss_rounds.py): MLX's active memory comes back to the weights and
the prompt cache's entries (an entry extracted from a batch is evaluated when stored, so it does not
keep the whole batch's KV), and RSS comes back with it (freed heap pages are handed back once the
requests drain, omlx_site/heap.py), since the enforcer counts RSS as usage."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from omlx_site.heap import TRIM_DELAY
from tests.conftest import DEMO

# Rounds of 32 streams for two minutes: a benchmark's run, kept out of `make test` (`make soak-tests` runs it).
pytestmark = pytest.mark.slow

STREAMS = 32
MB = 2**20
OPENING = "You are a careful assistant who answers in full sentences and checks each step twice. "


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir):
    return module_server({DEMO: demo_model_dir}, OMLX_MAX_CONCURRENT=str(STREAMS))


def _round(server, n: int) -> None:
    def one(i: int) -> int:
        body = {"model": DEMO, "max_tokens": 24, "stream": True,
                "messages": [{"role": "system", "content": OPENING},
                             {"role": "user", "content": f"Question {n}-{i}: what is {i} times {n + 7}?"}]}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
            for _ in r.iter_lines():
                pass
            return r.status_code
    with ThreadPoolExecutor(STREAMS) as pool:
        assert list(pool.map(one, range(STREAMS))) == [200] * STREAMS


def _settled(server) -> dict:
    """The pool's memory once no request runs, after the heap's trim had its moment."""
    server.wait_for(lambda: server.model(DEMO)["active_requests"] == 0)
    time.sleep(TRIM_DELAY + 1)
    memory = server.pool()["memory"]
    return {"active": memory["active_bytes"], "prompt": memory["prompt_cache_bytes"],
            "rss": psutil.Process(server.proc.pid).memory_info().rss}


def test_a_round_leaves_mlx_only_its_prompt_cache_entries(server):
    _round(server, 0)                 # loads the model, and the cache's first entries
    before = _settled(server)
    for n in (1, 2):
        _round(server, n)
    after = _settled(server)
    kept = after["active"] - before["active"]
    assert kept <= after["prompt"] - before["prompt"] + 16 * MB, (kept / MB, (after["prompt"] - before["prompt"]) / MB)


def test_rss_comes_back_after_rounds(server):
    _round(server, 10)
    before = _settled(server)
    for n in (11, 12, 13):
        _round(server, n)
    after = _settled(server)
    grew, mlx = after["rss"] - before["rss"], after["active"] - before["active"]
    # measured over these three rounds: 0.3 MB with the trim, 33 MB without
    assert grew <= mlx + 12 * MB, (grew / MB, mlx / MB)
