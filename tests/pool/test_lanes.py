"""The default lane on the demo model: a lone request decodes on mlx-lm's single-sequence path and
moves into the batch when another arrives (and back when it is left alone), and greedy output is
the same token for token whichever path a request took."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from pool.engines.generation_request import coalesced
from pool.engines.lanes import BatchLane
from pool.engines.protocol import Chunk, EngineError
from pool.policy.kv import KVConfig
from tests.pool.conftest import prompt


def alone_greedy(model, tokenizer, tokens: list[int], max_tokens: int) -> list[int]:
    """Raw mlx-lm: generate_step, greedy, stopping at the end-of-sequence token."""
    out = []
    for token, _ in generate_step(mx.array(tokens), model, max_tokens=max_tokens, sampler=make_sampler(temp=0)):
        out.append(token)
        if token in tokenizer.eos_token_ids:
            break
    return out


def lane_for(model, tokenizer, trimmable: bool = True) -> BatchLane:
    return BatchLane(model, KVConfig(), [[t] for t in sorted(tokenizer.eos_token_ids)], trimmable=trimmable)


def insert(lane, tokens, max_tokens):
    return lane.insert(tokens, cache=None, all_tokens=[], max_tokens=max_tokens, sampler=make_sampler(temp=0))


def a_then_b(lane: BatchLane, a: list[int], b: list[int], arrives_after: int):
    """Request a (20 tokens) alone, and b (30) once a has `arrives_after` tokens: (each one's tokens, the
    lane's path step by step with repeats dropped: who was alone, None for the batch, each one's last Step)."""
    uids = {insert(lane, a, 20): "a"}
    got, paths, last = {"a": [], "b": []}, [], {}
    while not lane.empty:
        for s in lane.step():
            got[uids[s.uid]].append(s.token)
            if s.finish_reason is not None:
                last[uids[s.uid]] = s
        paths.append(uids.get(lane.alone_uid))
        if len(got["a"]) == arrives_after and len(uids) == 1:
            uids[insert(lane, b, 30)] = "b"
    return got, [p for i, p in enumerate(paths) if i == 0 or paths[i - 1] != p], last


def test_a_lone_request_runs_alone_and_two_that_arrive_together_share_the_batch(demo):
    model, tokenizer = demo
    a, b = prompt(tokenizer, "What is the capital of France?"), prompt(tokenizer, "Name three colours.")
    expected = {"a": alone_greedy(model, tokenizer, a, 12), "b": alone_greedy(model, tokenizer, b, 12)}

    lane = lane_for(model, tokenizer)
    uid = insert(lane, a, 12)
    out = []
    while not lane.empty:
        steps = lane.step()
        assert lane.alone_uid in (uid, None)
        out += [s.token for s in steps]
    assert out == expected["a"]

    uids = {insert(lane, a, 12): "a", insert(lane, b, 12): "b"}
    got = {"a": [], "b": []}
    lane.step()
    assert lane.alone_uid is None                      # arrived together: both in the batch
    while not lane.empty:
        for s in lane.step():
            got[uids[s.uid]].append(s.token)
    assert got == expected


def test_a_request_moves_into_the_batch_and_back_without_changing_its_tokens(demo):
    model, tokenizer = demo
    a, b = prompt(tokenizer, "What is the capital of France?"), prompt(tokenizer, "Write a poem about the sea.")
    expected = {"a": alone_greedy(model, tokenizer, a, 20), "b": alone_greedy(model, tokenizer, b, 30)}

    got, seen, last = a_then_b(lane_for(model, tokenizer), a, b, arrives_after=4)
    assert got == expected
    assert seen == ["a", None, "b", None]       # a alone, both in the batch, then b alone once a has finished
    # the finished request's KV and tokens agree, for the prompt cache
    for name in "ab":
        assert last[name].prompt_cache[0].offset == len(last[name].all_tokens)


def test_chunks_that_piled_up_are_joined_and_the_last_and_errors_stay_in_order():
    error = EngineError("x")
    cases = [
        ([], []),
        ([Chunk("a")], [Chunk("a")]),
        ([Chunk("a"), Chunk("b"), Chunk("c")], [Chunk("abc")]),
        ([Chunk("a"), Chunk("b", "stop", 3, 2)], [Chunk("ab", "stop", 3, 2)]),
        ([Chunk("a"), error, Chunk("b")], [Chunk("a"), error, Chunk("b")]),
    ]
    for items, expected in cases:
        assert coalesced(items) == expected


@pytest.mark.parametrize("incoming, unstarted, enter", [
    ([], [], []),
    ([20], [], [20]),
    ([20, 440], [], [20]),                 # the long one waits for the short one's first token
    ([440, 20], [], [20]),
    ([440], [20], []),                     # a short one in the batch has not started yet
    ([440], [], [440]),
    ([100, 150, 190], [], [100, 150, 190]),  # similar lengths are read together
    ([10, 60], [], [10, 60]),              # short prompts always enter together
    ([1, 300], [], [1]),                   # a request handed over from the single path, and a long one
])
def test_prompts_enter_the_batch_shortest_first(incoming, unstarted, enter):
    from pool.engines.lanes import shortest_first
    from pool.engines.single_sequence import Pending

    pendings = [Pending(i, [0] * n, None, [], 8, None) for i, n in enumerate(incoming)]
    now, later = shortest_first(pendings, unstarted)
    assert [len(p.tokens) for p in now] == enter
    assert sorted(p.uid for p in now + later) == list(range(len(incoming)))


@pytest.mark.parametrize("company", [0, 1], ids=["alone", "in the batch"])
def test_a_long_prompt_reports_its_tokens_read_chunk_by_chunk(demo, company):
    model, tokenizer = demo
    long = prompt(tokenizer, "Tell me about the sea. " * 40)
    lane = lane_for(model, tokenizer)
    lane.set_prefill_step(64)
    uid = insert(lane, long, 2)
    for _ in range(company):
        insert(lane, long[:40], 2)
    reads = []
    while not any(s.uid == uid for s in lane.step()):
        reads += [n for u, n in lane.prompt_read().items() if u == uid]
    assert len(reads) >= len(long) // 64 - 1 and reads == sorted(reads) and 0 < reads[0] < reads[-1] < len(long)
    assert lane.prompt_read() == {}                     # said once


@pytest.mark.parametrize("arch", ["qwen3_5", "falcon_h1", "gemma3_text"])
@pytest.mark.parametrize("arrives_after", [4, 19])
def test_a_lone_request_whose_cache_cannot_be_cut_back_moves_into_the_batch_by_its_token_ahead(
        arch, arrives_after, make_model):
    """A recurrent state (qwen3_5, falcon_h1) or a sliding window cannot give its last token back: the
    lone request hands out the token generate_step sampled ahead and the batch feeds it; it stays in
    the batch (19: that token is its last)."""
    from mlx_lm.utils import load

    model, tokenizer = load(str(make_model(f"arch-{arch}", None, arch=arch)))
    a, b = prompt(tokenizer, "What is the capital of France?"), prompt(tokenizer, "Write a poem about the sea.")
    expected = {"a": alone_greedy(model, tokenizer, a, 20), "b": alone_greedy(model, tokenizer, b, 30)}
    assert len(expected["a"]) == 20          # random weights: no early end-of-sequence to hide the 19 case

    got, seen, last = a_then_b(lane_for(model, tokenizer, trimmable=False), a, b, arrives_after)
    assert got == expected
    assert seen == ["a", None]                   # never back to the single path
    assert last["a"].finish_reason == "length"
    if arrives_after == 19:                      # its last token was handed out, never fed: the KV holds 19
        assert len(last["a"].all_tokens) == len(a) + 19
