"""Per-request sampling on the demo model: logits processors (bias, penalties, a constraint) give the
same greedy tokens whichever path a request takes (alone, batched, moved between them), logprobs
are read from the generators' own vector, and n choices share one read of their prompt."""

from __future__ import annotations

import asyncio
import math

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from pool.engines import processors
from pool.engines.generation_request import coalesced
from pool.engines.generator import TextEngine
from pool.engines.lanes import BatchLane, SoloLane, new_cache
from pool.engines.processors import TokenText, logits_processors, over_completion, token_logprob
from pool.engines.protocol import Chunk, EngineError, SamplingParams, TokenLogprob
from pool.engines.shared_prefill import SharedPrefill
from pool.policy.kv import KVConfig
from tests.conftest import as_the_pool_loads
from tests.pool.conftest import prompt


class Forbid:
    """A constraint whose processor (one per request) forbids a token and notes the length of every
    token list it is shown. It stands for a grammar: the engine's processors make its processor
    (the `forbid_as_grammar` fixture)."""

    def __init__(self, token: int):
        self.token, self.seen = token, []

    @property
    def grammar(self) -> "Forbid":
        return self

    def make_processor(self, tokenizer):
        seen = []
        self.seen.append(seen)

        def processor(tokens, logits):
            seen.append(len(tokens))
            return logits.at[:, self.token].add(-math.inf)
        return processor


@pytest.fixture(autouse=True)
def forbid_as_grammar(monkeypatch):
    real = processors.make_processor
    monkeypatch.setattr(processors, "make_processor",
                        lambda grammar, tokenizer: grammar.make_processor(tokenizer) if isinstance(grammar, Forbid)
                        else real(grammar, tokenizer))


def reference(model, tokenizer, tokens, params) -> list[int]:
    """Raw mlx-lm: generate_step with the request's processors, greedy, to the end-of-sequence."""
    out = []
    for token, _ in generate_step(mx.array(tokens), model, max_tokens=params.max_tokens, sampler=make_sampler(temp=0),
                                  logits_processors=logits_processors(params, tokenizer)):
        out.append(token)
        if token in tokenizer.eos_token_ids:
            break
    return out


def run_lane(model, tokenizer, jobs, *, join_after: int | None = None, kv=KVConfig()):
    """Decode `jobs` [(tokens, params)] in one lane: all at once, or the second joining once the first
    has `join_after` tokens (which moves the first from the single path into the batch and back)."""
    stop = [[t] for t in sorted(tokenizer.eos_token_ids)]
    lane = (BatchLane if kv.batches else SoloLane)(model, kv, stop)

    def insert(tokens, params):
        return lane.insert(tokens, cache=None, all_tokens=[], max_tokens=params.max_tokens,
                           sampler=make_sampler(temp=0), processors=logits_processors(params, tokenizer))
    waiting = list(jobs) if join_after is None else list(jobs[:1])
    names = {insert(*job): i for i, job in enumerate(waiting)}
    got = [[] for _ in jobs]
    while not lane.empty:
        for s in lane.step():
            got[names[s.uid]].append(s.token)
        if join_after is not None and len(got[0]) == join_after and len(names) == 1:
            names[insert(*jobs[1])] = 1
    return got


FRANCE, CATS = "What is the capital of France?", "Write the word cat five times."


def cases(tokenizer):
    """(the question, the request's params): each changes the demo model's greedy answer."""
    paris = tokenizer.encode(" Paris")[0]
    return {
        "constraint": (FRANCE, SamplingParams(max_tokens=14, constraint=Forbid(tokenizer.encode("The")[0]))),
        "logit_bias": (FRANCE, SamplingParams(max_tokens=14, logit_bias=((paris, -100.0),))),
        "penalties": (CATS, SamplingParams(max_tokens=14, presence_penalty=1.5, frequency_penalty=1.0)),
        "repetition": (FRANCE, SamplingParams(max_tokens=14, repetition_penalty=1.8)),
    }


@pytest.mark.parametrize("case", ["constraint", "logit_bias", "penalties", "repetition"])
def test_processors_give_the_same_greedy_tokens_on_every_path(demo, case):
    model, tokenizer = demo
    question, params = cases(tokenizer)[case]
    a, b = prompt(tokenizer, question), prompt(tokenizer, "Name three colours.")
    plain = reference(model, tokenizer, a, SamplingParams(max_tokens=14))
    expected = reference(model, tokenizer, a, params)
    assert expected != plain                               # the processor changed the answer

    other = (b, SamplingParams(max_tokens=10))
    assert run_lane(model, tokenizer, [(a, params)])[0] == expected                        # alone
    assert run_lane(model, tokenizer, [(a, params), other])[0] == expected                 # batched
    assert run_lane(model, tokenizer, [(a, params), other], join_after=3)[0] == expected   # moved, and back
    if case == "constraint":
        forbidden = params.constraint.token
        assert forbidden not in expected
        quantized = run_lane(model, tokenizer, [(a, params)], kv=KVConfig(kv_bits=8))[0]   # the solo lane
        assert quantized and forbidden not in quantized
        # every path showed the processor the prompt and every token since: one more each call,
        # or the same list again where a request moved between generators
        assert len(params.constraint.seen) == 5          # reference, alone, batched, moved, quantized
        for seen in params.constraint.seen:
            assert seen[0] == len(a)
            assert all(later - earlier in (0, 1) for earlier, later in zip(seen, seen[1:])), seen


def test_the_penalties_count_the_completion_not_the_prompt():
    calls = []
    wrapped = over_completion([lambda tokens, logits: calls.append(tokens.tolist()) or logits])
    for tokens in ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]):
        wrapped(mx.array(tokens), mx.zeros((1, 8)))
    assert calls == [[], [4], [4, 5], [4, 5]]


@pytest.mark.parametrize("params, count", [
    (SamplingParams(), 0),
    (SamplingParams(logit_bias=((3, 5.0),)), 1),
    (SamplingParams(presence_penalty=0.5), 1),
    (SamplingParams(frequency_penalty=-0.5, presence_penalty=0.1), 1),
    (SamplingParams(repetition_penalty=1.1), 1),
    (SamplingParams(logit_bias=((3, 5.0),), repetition_penalty=1.1, constraint=Forbid(0)), 3),
])
def test_a_request_gets_processors_only_for_what_it_asked(params, count):
    assert len(logits_processors(params, tokenizer=None)) == count
    assert params.processed == bool(count)


def test_logit_bias_adds_to_the_named_tokens():
    (bias,) = logits_processors(SamplingParams(logit_bias=((1, 2.0), (3, -100.0))), tokenizer=None)
    assert bias(mx.array([0]), mx.zeros((1, 4))).tolist() == [[0.0, 2.0, 0.0, -100.0]]


@pytest.mark.parametrize("text", [" Paris", "naïve café", "日本語", "a\n\tb", "🙂!"])
def test_token_bytes_join_into_the_texts_bytes(demo, text):
    _, tokenizer = demo
    token_text = TokenText(tokenizer)
    pieces = [token_text(t) for t in tokenizer.encode(text)]
    assert b"".join(bytes(raw) for _, raw in pieces) == text.encode("utf-8")
    assert all(name == bytes(raw).decode("utf-8", "replace") for name, raw in pieces)


def test_a_tokens_logprob_and_the_most_likely_ones(demo):
    _, tokenizer = demo
    logits = mx.array([0.0, 3.0, 1.0, 2.0, -1.0])
    logprobs = logits - mx.logsumexp(logits)
    text = TokenText(tokenizer)
    entry = token_logprob(logprobs, 3, 3, text)
    assert entry.token == text(3)[0] and entry.bytes == text(3)[1]
    assert entry.logprob == pytest.approx(logprobs[3].item())
    assert [t for t, _, _ in entry.top] == [text(i)[0] for i in (1, 3, 2)]
    assert [lp for _, lp, _ in entry.top] == pytest.approx([logprobs[i].item() for i in (1, 3, 2)])
    assert token_logprob(logprobs, 4, 0, text).top == ()


def test_chunks_of_several_choices_are_joined_per_choice():
    lp = TokenLogprob("a", -0.1, (97,))
    error = EngineError("x")
    cases = [
        ([Chunk("a", index=0), Chunk("x", index=1), Chunk("b", index=0)], [Chunk("ab", index=0), Chunk("x", index=1)]),
        ([Chunk("a", logprobs=(lp,)), Chunk("b", "stop", 3, 2, logprobs=(lp,))],
         [Chunk("ab", "stop", 3, 2, logprobs=(lp, lp))]),
        ([Chunk("a", index=1), Chunk("b", "length", index=1), Chunk("c", index=1)],
         [Chunk("ab", "length", index=1), Chunk("c", index=1)]),
        ([Chunk("a", index=1), error, Chunk("b", index=1)], [Chunk("a", index=1), error, Chunk("b", index=1)]),
    ]
    for items, expected in cases:
        assert coalesced(items) == expected


def test_choices_share_one_read_of_their_prompt(demo):
    model, tokenizer = demo
    tokens = prompt(tokenizer, "What is the capital of France?")
    expected = reference(model, tokenizer, tokens, SamplingParams(max_tokens=10))
    job = SharedPrefill(model, tokens, new_cache(model, KVConfig()), [], ["a", "b", "c"])
    steps = 0
    while not job.step(8):
        steps += 1
    assert steps == math.ceil((len(tokens) - 1) / 8) - 1 and job.fed == tokens[:-1] and job.pending == tokens[-1:]
    forks = job.fork()
    assert [name for name, _ in forks] == ["a", "b", "c"]
    assert len({id(cache[0]) for _, cache in forks}) == 3
    assert all(cache[0].offset == len(tokens) - 1 for _, cache in forks)

    lane = BatchLane(model, KVConfig(), [[t] for t in sorted(tokenizer.eos_token_ids)])
    uids = {lane.insert(job.pending, cache=cache, all_tokens=job.fed, max_tokens=10, sampler=make_sampler(temp=0)): name
            for name, cache in forks}
    got = {name: [] for name in uids.values()}
    while not lane.empty:
        for s in lane.step():
            got[uids[s.uid]].append(s.token)
    assert got == {"a": expected, "b": expected, "c": expected}


async def test_the_engine_streams_n_choices_with_logprobs_and_forgets_a_closed_request(demo_model_dir):
    engine = TextEngine("demo", demo_model_dir, load=as_the_pool_loads(demo_model_dir))
    await engine.load()
    try:
        tokens = engine.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        texts, entries, finals = {}, {}, {}
        async for chunk in engine.generate(tokens, SamplingParams(max_tokens=8, n=3, logprobs=2)):
            texts[chunk.index] = texts.get(chunk.index, "") + chunk.text
            entries.setdefault(chunk.index, []).extend(chunk.logprobs)
            if chunk.finish_reason:
                finals[chunk.index] = chunk
        assert sorted(finals) == [0, 1, 2] and len(set(texts.values())) == 1 and "Paris" in texts[0]
        for index, final in finals.items():
            assert final.prompt_tokens == len(tokens) and len(entries[index]) == final.completion_tokens
            for e in entries[index]:
                assert e.logprob <= 0 and len(e.top) == 2
                assert e.top[0][0] == e.token and e.top[0][1] == pytest.approx(e.logprob)   # greedy: the top one

        # a closed request leaves nothing behind, whether its choices were reading their prompt or decoding
        long_prompt = tokens * 30
        for after in (0, 1):
            stream = engine.generate(long_prompt, SamplingParams(max_tokens=200, n=2))
            if after:
                await stream.__anext__()
            await stream.aclose()
            for _ in range(100):
                if engine.active_requests == 0:
                    break
                await asyncio.sleep(0.05)
            assert engine.active_requests == 0

        sampled = {}
        async for chunk in engine.generate(tokens, SamplingParams(max_tokens=12, n=3, temperature=1.5, seed=3)):
            sampled[chunk.index] = sampled.get(chunk.index, "") + chunk.text
        assert len(set(sampled.values())) > 1           # each choice draws its own tokens
    finally:
        await engine.stop()
