"""Ollama's JavaScript client (ollama-js, pinned in tests/clients/package.json, installed by `make test`)
through Node against a real server with the demo models: tests/clients/ollama_js.mjs runs every call an
Ollama front end makes and prints one JSON line per check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEMO

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
MINILM = "all-MiniLM-L6-v2"
KEY = "k3y-ollama-js"
CHECKS = ["version", "list", "chat", "tools", "format", "generate", "ps", "show", "embed", "errors"]


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir, minilm_dir):
    return module_server({DEMO: demo_model_dir, MINILM: minilm_dir}, OMLX_API_KEY=KEY)


def test_every_check_of_ollama_js_passes(server):
    node = shutil.which("node")
    assert node, "Node.js is needed for this test (`make test` installs it with the client)"
    assert (CLIENTS / "node_modules" / "ollama").is_dir(), "run `make test` (it runs npm ci in tests/clients)"
    env = {**os.environ, "OMLX_URL": server.url, "OMLX_MODEL": DEMO, "OMLX_EMBED_MODEL": MINILM, "OMLX_KEY": KEY}
    run = subprocess.run([node, "ollama_js.mjs"], cwd=CLIENTS, env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    failed = [line for line in lines if not line["ok"]]
    assert not failed and run.returncode == 0, (failed, run.stderr[-2000:])
    assert [line["check"] for line in lines] == CHECKS
    by_check = {line["check"]: line["value"] for line in lines}
    assert sorted(by_check["list"]) == [f"{MINILM}:latest", f"{DEMO}:latest"] and by_check["embed"] == 384
