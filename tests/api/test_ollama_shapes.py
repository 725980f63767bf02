"""Ollama's shapes as tables: which paths speak Ollama's words, its error envelope and mid-stream NDJSON
error line, what a closing server answers inside an NDJSON stream, expires_at from a snapshot row,
Ollama's human parameter sizes, and a model folder's card (digest, parameters, quantization, template)."""

from __future__ import annotations

import json
import struct
from datetime import datetime, timedelta, timezone

import pytest

from omlx_site.inflight import closing_messages
from pool.api.dialects import ANTHROPIC, OLLAMA, OPENAI, for_path
from pool.api.errors import MethodNotAllowed, Unauthorized, error_response, stream_error
from pool.api.ollama.cards import card, human_number
from pool.api.ollama.info import FOREVER, expires_at
from pool.api.ollama.names import tagged
from pool.errors import Busy, InvalidRequest, ModelNotFound, WrongKind


@pytest.mark.parametrize("path, dialect", [
    ("/api/tags", OLLAMA), ("/api/ps", OLLAMA), ("/api/show", OLLAMA), ("/api/version", OLLAMA),
    ("/api/chat", OLLAMA), ("/api/generate", OLLAMA), ("/api/embed", OLLAMA), ("/api/embeddings", OLLAMA),
    ("/api/pull", OLLAMA), ("/api/delete", OLLAMA),
    ("/api/pool", OPENAI), ("/api/models/x/load", OPENAI), ("/api/telemetry", OPENAI), ("/api/rediscover", OPENAI),
    ("/v1/models", OPENAI), ("/v1/messages", ANTHROPIC), ("/metrics", OPENAI),
])
def test_which_paths_speak_ollamas_words(path, dialect):
    assert for_path(path) is dialect


WRONG_KIND = WrongKind(model="m", kind="embeddings", noun="an embedding model", wanted="chat",
                       wanted_noun="a chat model", alternatives=["c"])


@pytest.mark.parametrize("error, status, text", [
    (ModelNotFound("x:latest", ["a", "b"]), 404, 'model "x:latest" not found (available: a, b)'),
    (InvalidRequest("'model' is required"), 400, "'model' is required"),
    (Unauthorized("Missing or wrong API key."), 401, "Missing or wrong API key."),
    (MethodNotAllowed("GET is not allowed here; use POST."), 405, "GET is not allowed here; use POST."),
    (Busy("busy", retry_after=2.5), 503, "busy"),
    (WRONG_KIND, 400, '"m" is an embedding model: it serves /api/embed and /api/embeddings, not /api/chat and '
                      "/api/generate, which needs a chat model (available: c)"),
])
def test_the_error_envelope_is_ollamas(error, status, text):
    response = error_response(error, OLLAMA)
    assert response.status_code == status
    assert json.loads(response.content) == {"error": text}
    if isinstance(error, Busy):
        assert response["Retry-After"] == "3"
    line = stream_error(error, OLLAMA)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and json.loads(line) == {"error": text}


def test_a_closing_server_ends_an_ndjson_stream_with_an_error_line():
    (chunk,) = closing_messages(started=True, sse=True, path="/api/chat")
    assert json.loads(chunk["body"])["error"].startswith("The server is shutting down")
    assert b"[DONE]" not in chunk["body"] and b"data:" not in chunk["body"]
    start, body = closing_messages(started=False, sse=False, path="/api/generate")
    assert start["status"] == 503 and list(json.loads(body["body"])) == ["error"]


NOW = 1_750_000_000.0
AT = datetime.fromtimestamp(NOW, timezone.utc)


@pytest.mark.parametrize("row, left", [
    ({"ttl_remaining_seconds": 300.0}, timedelta(seconds=300)),                       # the TTL or keep_alive left
    ({"ttl_remaining_seconds": 0.0}, timedelta(0)),
    ({"ttl_remaining_seconds": None}, FOREVER),                                       # a pin, keep_alive < 0, no TTL
    ({"ttl_remaining_seconds": None, "active_requests": 1, "keep_alive": 60}, timedelta(seconds=60)),   # busy
    ({"ttl_remaining_seconds": None, "active_requests": 1, "keep_alive": -1, "ttl_seconds": 60}, FOREVER),
    ({"ttl_remaining_seconds": None, "active_requests": 1, "keep_alive": None, "ttl_seconds": 120},
     timedelta(seconds=120)),
    ({"ttl_remaining_seconds": None, "active_requests": 2, "keep_alive": None, "ttl_seconds": None}, FOREVER),
    ({"ttl_remaining_seconds": None, "active_requests": 1, "pinned": True, "keep_alive": 60}, FOREVER),
])
def test_expires_at(row, left):
    assert datetime.fromisoformat(expires_at(row, NOW)) == AT + left


def test_forever_is_ollamas_far_future():
    assert (AT + FOREVER).year == 2025 + 292


@pytest.mark.parametrize("n, text", [(134_515_008, "134.52M"), (8_030_261_248, "8.0B"), (8_000_000_000, "8B"),
                                     (22_713_216, "22.71M"), (7_000_000, "7M"), (5_400, "5K"), (999, "999")])
def test_human_number_is_ollamas(n, text):
    assert human_number(n) == text


def _safetensors(path, tensors: dict) -> None:
    header = json.dumps(tensors).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_a_folders_card(tmp_path):
    config = {"model_type": "llama", "max_position_embeddings": 2048, "hidden_size": 64, "num_hidden_layers": 2,
              "quantization": {"group_size": 32, "bits": 4, "lm_head": {"bits": 8, "group_size": 32}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "</s>"}, "chat_template": [{"name": "tool_use", "template": "T"},
                                                              {"name": "default", "template": "D"}]}))
    _safetensors(tmp_path / "model.safetensors", {
        "__metadata__": {"format": "mlx"},
        "layer.weight": {"dtype": "U32", "shape": [64, 8], "data_offsets": [0, 0]},     # 4 bits: 64 x 64
        "layer.scales": {"dtype": "F16", "shape": [64, 2], "data_offsets": [0, 0]},
        "layer.biases": {"dtype": "F16", "shape": [64, 2], "data_offsets": [0, 0]},
        "lm_head.weight": {"dtype": "U32", "shape": [10, 16], "data_offsets": [0, 0]},  # 8 bits: 10 x 64
        "lm_head.scales": {"dtype": "F16", "shape": [10, 2], "data_offsets": [0, 0]},
        "norm.weight": {"dtype": "F16", "shape": [64], "data_offsets": [0, 0]},
    })
    first = card(tmp_path)
    assert first.parameters == 64 * 64 + 10 * 64 + 64 and first.quantization == "Q4"
    assert first.template == "D" and first.stop == ("</s>",)
    assert first.disk_bytes == (tmp_path / "model.safetensors").stat().st_size
    assert first.details() == {"parent_model": "", "format": "safetensors", "family": "llama", "families": ["llama"],
                               "parameter_size": "5K", "quantization_level": "Q4"}   # 4800
    info = first.model_info(2048)
    assert info["llama.context_length"] == 2048 and info["llama.embedding_length"] == 64
    assert info["llama.block_count"] == 2 and info["general.parameter_count"] == first.parameters
    assert card(tmp_path).digest == first.digest                   # stable
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 65}))
    assert card(tmp_path).digest != first.digest                   # a new config is a new digest
    (tmp_path / "chat_template.jinja").write_text("J")
    assert card(tmp_path).template == "J"


def test_an_unquantized_folder_names_its_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    _safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [100, 10], "data_offsets": [0, 0]},
                                                  "ids": {"dtype": "I64", "shape": [1, 512], "data_offsets": [0, 0]}})
    facts = card(tmp_path)
    assert facts.quantization == "F32" and facts.template == "" and facts.stop == ()
    assert facts.details()["family"] == "bert" and facts.model_info(None).get("bert.context_length") is None


@pytest.mark.parametrize("name, listed", [
    ("smollm2", "smollm2:latest"), ("llama3:8b", "llama3:8b"), ("Org/Name", "Org/Name:latest"),
    ("hf.co/org/name:q4", "hf.co/org/name:q4"), ("host:5000/name", "host:5000/name:latest"),
])
def test_listed_names_carry_ollamas_tag(name, listed):
    assert tagged(name) == listed
