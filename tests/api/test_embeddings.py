"""POST /v1/embeddings: the body's shapes parsed (tables), then through the ASGI application in this
process with the official openai client and plain HTTP, on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from pool.api.openai.embeddings import encode_vector, parse_embeddings, parse_input
from pool.errors import InvalidRequest
from pool.serving.embedding import Embeddings
from tests.conftest import DEMO

MINILM = "all-MiniLM-L6-v2"


# ---- the body, parsed --------------------------------------------------------------------------

@pytest.mark.parametrize("value, inputs", [
    ("hello", ("hello",)),
    (["a", "b"], ("a", "b")),
    ([1, 2, 3], ((1, 2, 3),)),                      # one token array
    ([[1, 2], [3]], ((1, 2), (3,))),                # several
    (["a", [1]], ("a", (1,))),
])
def test_input_shapes(value, inputs):
    assert parse_input(value) == inputs


@pytest.mark.parametrize("value, message", [
    ("", "item 0 is empty"),
    ([], "must not be empty"),
    ([[]], "item 0 is empty"),
    (["a", ""], "item 1 is empty"),
    (5, "must be a string, a list of strings"),
    ([1.5], "item 0 is neither"),
    ([True], "item 0 is neither"),
    ([[1, "x"]], "item 0 is neither"),
    ([[1, -2]], "negative token id"),
    (["x"] * 2049, "at most 2048"),
    ({"text": "a"}, "must be a string"),
])
def test_bad_inputs(value, message):
    with pytest.raises(InvalidRequest, match=message) as e:
        parse_input(value)
    assert e.value.param == "input"


@pytest.mark.parametrize("body, param", [
    ({"input": "a"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "m", "input": "a", "dimensions": 0}, "dimensions"),
    ({"model": "m", "input": "a", "dimensions": "384"}, "dimensions"),
    ({"model": "m", "input": "a", "user": 5}, "user"),
    ({"model": "m", "input": "a", "keep_alive": "soon"}, "keep_alive"),
])
def test_bad_bodies_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_embeddings(body)
    assert e.value.param == param


def test_a_good_body():
    spec, fmt = parse_embeddings({"model": "m", "input": ["a"], "encoding_format": "base64", "dimensions": 384,
                                  "user": "u", "keep_alive": "5m"})
    assert (spec.model, spec.inputs, spec.dimensions, spec.keep_alive, fmt) == ("m", ("a",), 384, 300.0, "base64")
    assert parse_embeddings({"model": "m", "input": "a"})[1] == "float"


def test_base64_is_little_endian_float32():
    vector = np.array([0.5, -1.25, 1.0], dtype=np.float32)
    result = Embeddings("m", vector[None, :], prompt_tokens=3)
    raw = base64.b64decode(encode_vector(result, 0, "base64"))
    assert raw == bytes.fromhex("0000003f" "0000a0bf" "0000803f")     # IEEE 754 bytes, least significant first
    assert np.frombuffer(raw, dtype="<f4").tolist() == vector.tolist()
    assert encode_vector(result, 0, "float") == vector.tolist()


# ---- through the server ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir, minilm_dir):
    """The demo chat model and MiniLM, at most one of them loaded at a time."""
    return module_asgi_server({DEMO: demo_model_dir, MINILM: minilm_dir}, OMLX_MAX_LOADED_MODELS=1)


SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The new movie is awesome.", "The film was great, I loved it."]


def test_the_openai_client_gets_normalised_vectors_that_know_similar_sentences(server):
    client = server.openai()
    reply = client.embeddings.create(model=MINILM, input=SENTENCES)     # the client asks for base64
    assert reply.object == "list" and reply.model == MINILM
    assert [d.index for d in reply.data] == [0, 1, 2, 3] and {d.object for d in reply.data} == {"embedding"}
    v = np.array([d.embedding for d in reply.data])
    assert v.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    cos = v @ v.T
    assert cos[0, 1] > cos[0, 2] + 0.3 and cos[0, 1] > cos[1, 3] + 0.3 and cos[2, 3] > cos[1, 2] + 0.3
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == 8 + 11 + 8 + 11   # [CLS] .. [SEP] each

    plain = server.post("/v1/embeddings", {"model": MINILM, "input": SENTENCES, "encoding_format": "float"})
    assert plain.status_code == 200
    floats = np.array([d["embedding"] for d in plain.json()["data"]])
    np.testing.assert_allclose(floats, v, atol=1e-7)     # base64 decodes to the float vectors
    one = client.embeddings.create(model=MINILM, input=SENTENCES[2], encoding_format="float", dimensions=384)
    np.testing.assert_allclose(one.data[0].embedding, v[2], atol=1e-6)


def test_token_arrays_embed_as_their_text(server):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(server.home / "models" / MINILM))
    ids = [tokenizer.encode(s, add_special_tokens=False) for s in SENTENCES[:2]]
    client = server.openai()
    texts = np.array([d.embedding for d in client.embeddings.create(model=MINILM, input=SENTENCES[:2]).data])
    arrays = client.embeddings.create(model=MINILM, input=ids)
    np.testing.assert_allclose([d.embedding for d in arrays.data], texts, atol=1e-6)
    single = client.embeddings.create(model=MINILM, input=ids[0])
    np.testing.assert_allclose(single.data[0].embedding, texts[0], atol=1e-6)
    assert single.usage.prompt_tokens == len(ids[0]) + 2


@pytest.mark.parametrize("body, status, param, code", [
    ({"input": "x", "dimensions": 128}, 400, "dimensions", None),
    ({"input": ["fine", "word " * 300]}, 400, "input", "context_length_exceeded"),
    ({"input": [[101, 30522]]}, 400, "input", None),
    ({"input": ""}, 400, "input", None),
    ({"input": "x", "model": DEMO}, 400, "model", "model_kind_mismatch"),
    ({"input": "x", "model": "no-such-model"}, 404, "model", "model_not_found"),
])
def test_errors_are_openai_envelopes(server, body, status, param, code):
    r = server.post("/v1/embeddings", {"model": MINILM, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    if code:
        assert error["code"] == code


def test_a_chat_route_refuses_an_embedding_model_and_the_pool_swaps_kinds(server):
    client = server.openai()
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.completions.create(model=MINILM, prompt="hi", max_tokens=2)

    client.embeddings.create(model=MINILM, input="x")
    kinds = {m["id"]: m["kind"] for m in server.pool()["models"]}
    assert kinds == {DEMO: "chat", MINILM: "embeddings"}
    assert server.states() == {DEMO: "unloaded", MINILM: "loaded"}
    assert server.chat(DEMO).status_code == 200            # one model at a time: MiniLM goes
    assert server.states() == {DEMO: "loaded", MINILM: "unloaded"}
    client.embeddings.create(model=MINILM, input="x")      # and the chat model goes for it
    assert server.states() == {DEMO: "unloaded", MINILM: "loaded"}
    evicted = [(e["model"], e["reason"]) for e in server.events() if e["action"] == "unload"]
    assert evicted[:2] == [(DEMO, "count_cap"), (MINILM, "count_cap")]    # newest first
    assert server.model(MINILM)["measured_bytes"] > 85 * 10**6
