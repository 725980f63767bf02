"""What error messages may carry (a `manage.py serve` process): a model that fails to load names the
problem in the 409, the snapshot and the websocket without echoing its files' content; and the docs'
status table names the codes the server sends."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from websockets.sync.client import connect

from tests.conftest import ROOT

MARKER = "Zebra-Quartz-7731<b>"     # what a model folder's config.json says, never what a client reads


def _broken(folder, kind: str, tokenizer_from):
    """A folder whose tokenizer and weights load (the demo model's) and whose config.json names no
    architecture."""
    folder.mkdir()
    for f in tokenizer_from.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json" and f.is_file():
            shutil.copy(f, folder / f.name)
    (folder / "config.json").write_text(json.dumps({"model_type": MARKER}))
    (folder / "model.safetensors").symlink_to(tokenizer_from / "model.safetensors")
    if kind == "embeddings":
        (folder / "modules.json").write_text("[]")
    return folder


@pytest.mark.parametrize("kind", ["chat", "embeddings"])
def test_a_load_error_names_the_field_not_its_value(start_server, tmp_path, demo_model_dir, kind):
    server = start_server({"broken": _broken(tmp_path / "broken", kind, demo_model_dir)}, demo=False)
    if kind == "chat":
        r = server.chat("broken")
    else:
        r = server.post("/v1/embeddings", {"model": "broken", "input": "x"})
    message = r.json()["error"]["message"]
    assert r.status_code == 409 and "model_type" in message and "Zebra" not in r.text, r.text
    failure = server.model("broken")["failure"]
    assert "model_type" in failure and "Zebra" not in server.get("/api/pool").text, failure
    with connect(f"ws://127.0.0.1:{server.port}/ws/pool/", origin=server.url, open_timeout=20) as ws:
        snapshot = ws.recv(timeout=20)
    assert '"failed"' in snapshot and "model_type" in snapshot and "Zebra" not in snapshot


def test_the_docs_name_the_404_codes_the_server_sends(start_server):
    server = start_server(demo=False)
    sent = {server.get("/v1/no-such-route").json()["error"]["code"],
            server.chat("no-such-model").json()["error"]["code"]}
    table = (ROOT / "docs" / "api.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| 404 |"))
    assert sent == {"not_found", "model_not_found"} and set(re.findall(r"`(\w+)`", row)) == sent, row
    for status in ("414", "431"):
        assert f"\n| {status} |" in table, status
