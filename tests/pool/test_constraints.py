"""Constrained decoding on the demo model through mlx-lm itself (generate_step, BatchGenerator):
JSON schemas whose outputs validate with jsonschema, json_object, tool calls that mlx-lm's
json_tools parser reads, and the processor following re-fed and shorter token lists. The schemas are in
constraint_schemas.py; the schema keywords it refuses, named, are in test_constraints_unsupported.py."""

from __future__ import annotations

import json
import threading

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tool_parsers import json_tools

from pool.engines.grammar import make_processor, sync_plan
from pool.serving.constraints import TOOL_CALL_END, TOOL_CALL_START, json_object, json_schema, tool_calls
from tests.pool.constraint_schemas import SCHEMAS

MAX_TOKENS = 160
SAMPLED = {"temp": 0.9, "top_p": 0.95}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"$defs": {"zone": {"type": "string", "maxLength": 30}}, "type": "object",
                   "additionalProperties": False, "required": ["zone"],
                   "properties": {"zone": {"$ref": "#/$defs/zone"}}}}}
NO_ARGUMENTS = {"type": "function", "function": {"name": "ping", "description": "Is the server up"}}


def chat(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def alone(model, tokenizer, prompt: list[int], processors: list, sampler=None, max_tokens=MAX_TOKENS) -> list[int]:
    """mlx-lm's single-sequence path, to the end-of-sequence (not included)."""
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens,
                                  sampler=sampler or make_sampler(temp=0.0), logits_processors=processors):
        if token in tokenizer.eos_token_ids:
            break
        out.append(token)
    return out


def batched(model, tokenizer, requests: list[tuple[list[int], list, object]], max_tokens=MAX_TOKENS) -> list[list[int]]:
    """mlx-lm's BatchGenerator: (prompt, processors, sampler) each, all in one batch."""
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids], max_tokens=max_tokens)
    try:
        uids = gen.insert([p for p, _, _ in requests], max_tokens=[max_tokens] * len(requests),
                          samplers=[s for _, _, s in requests], logits_processors=[lp for _, lp, _ in requests])
        out: dict[int, list[int]] = {u: [] for u in uids}
        running = set(uids)
        while running:
            for r in gen.next_generated():
                if r.token not in tokenizer.eos_token_ids:
                    out[r.uid].append(r.token)
                if r.finish_reason is not None:
                    running.discard(r.uid)
        return [out[u] for u in uids]
    finally:
        gen.close()


def valid(schema: dict, text: str):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value


@pytest.fixture(scope="module")
def schema_outputs(demo):
    """Every schema, greedy and sampled, decoded in one BatchGenerator batch (20 constrained requests)."""
    model, tokenizer = demo
    mx.random.seed(7)
    cases = [(name, mode) for name in SCHEMAS for mode in ("greedy", "sampled")]
    requests = [(chat(tokenizer, SCHEMAS[name][1]),
                 [make_processor(json_schema(SCHEMAS[name][0], True).grammar, tokenizer)],
                 make_sampler(**(SAMPLED if mode == "sampled" else {"temp": 0.0}))) for name, mode in cases]
    outputs = batched(model, tokenizer, requests)
    return {case: tokenizer.decode(tokens) for case, tokens in zip(cases, outputs)}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_output_validates_against_its_schema(schema_outputs, name, mode):
    valid(SCHEMAS[name][0], schema_outputs[(name, mode)])


def test_json_object_gives_an_object_on_both_paths(demo):
    model, tokenizer = demo
    prompt = chat(tokenizer, 'What is the capital of France? Reply in JSON with the key "capital".')
    processor = make_processor(json_object().grammar, tokenizer)
    lone = alone(model, tokenizer, prompt, [processor], max_tokens=60)
    assert isinstance(json.loads(tokenizer.decode(lone)), dict)
    assert processor.consumed == lone and not processor.failed
    (in_batch,) = batched(model, tokenizer,
                          [(prompt, [make_processor(json_object().grammar, tokenizer)], make_sampler(temp=0.0))],
                          max_tokens=60)
    assert in_batch == lone


def calls_in(text: str) -> list[dict]:
    """The fallback format's calls, each read with mlx-lm's json_tools parser."""
    assert text.startswith(TOOL_CALL_START) and text.endswith(TOOL_CALL_END), text
    bodies = [part.split(TOOL_CALL_END)[0] for part in text.split(TOOL_CALL_START)[1:]]
    assert text == "\n".join(f"{TOOL_CALL_START}{b}{TOOL_CALL_END}" for b in bodies)
    return [json_tools.parse_tool_call(b) for b in bodies]


def check_call(call: dict, tools: list[dict]) -> None:
    function = next(t["function"] for t in tools if t["function"]["name"] == call["name"])
    jsonschema.validate(call["arguments"], function.get("parameters") or {"type": "object", "maxProperties": 0})


@pytest.mark.parametrize("question, tools, name, parallel, expected_name", [
    ("What is the weather in Paris?", [WEATHER, CLOCK], None, False, None),
    ("What is the weather in Paris?", [WEATHER, CLOCK], "get_time", False, "get_time"),
    ("What time is it in Tokyo, and the weather in Oslo?", [WEATHER, CLOCK], None, True, None),
    ("Is the server up?", [NO_ARGUMENTS, WEATHER], "ping", True, "ping"),
], ids=["required", "named", "parallel", "no-parameters"])
def test_tool_calls_parse_with_mlx_lm_and_arguments_validate(demo, question, tools, name, parallel, expected_name):
    model, tokenizer = demo
    constraint = tool_calls(tools, name, parallel, max_calls=2)
    text = tokenizer.decode(alone(model, tokenizer, chat(tokenizer, question),
                                  [make_processor(constraint.grammar, tokenizer)], max_tokens=120))
    calls = calls_in(text)
    assert 1 <= len(calls) <= (2 if parallel else 1)
    for call in calls:
        assert expected_name in (None, call["name"])
        check_call(call, tools)


@pytest.mark.parametrize("parallel, max_calls, calls_written, more_allowed", [
    (False, 8, 1, False),
    (True, 1, 1, False),
    (True, 2, 1, True),
    (True, 2, 2, False),
    (True, 3, 2, True),
])
def test_parallel_calls_stop_at_the_cap(demo, parallel, max_calls, calls_written, more_allowed):
    _, tokenizer = demo
    one = (f'{TOOL_CALL_START}\n{{"name": "get_weather", "arguments": {{"city": "Oslo", "unit": "celsius"}}}}\n'
           f'{TOOL_CALL_END}')
    written = list(tokenizer.encode("\n".join([one] * calls_written), add_special_tokens=False))
    prompt = chat(tokenizer, "weather")
    processor = make_processor(tool_calls([WEATHER], None, parallel, max_calls=max_calls).grammar, tokenizer)
    logits = mx.zeros((1, len(tokenizer._tokenizer)))
    processor(mx.array(prompt), logits)
    next_allowed = set(np.flatnonzero(allowed(processor(mx.array(prompt + written), logits))).tolist())
    assert processor.consumed == written and not processor.failed
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    assert next_allowed == set(tokenizer.eos_token_ids) | ({newline} if more_allowed else set())


def test_constrained_and_unconstrained_share_a_batch(demo):
    model, tokenizer = demo
    schema = SCHEMAS["flat_required"][0]
    constrained_prompt = chat(tokenizer, SCHEMAS["flat_required"][1])
    free_prompt = chat(tokenizer, "Write one sentence about the sea.")
    greedy = make_sampler(temp=0.0)
    constrained, free = batched(model, tokenizer, [
        (constrained_prompt, [make_processor(json_schema(schema).grammar, tokenizer)], greedy),
        (free_prompt, [], greedy)], max_tokens=40)
    valid(schema, tokenizer.decode(constrained))
    assert free == alone(model, tokenizer, free_prompt, [], max_tokens=40)
    assert not tokenizer.decode(free).lstrip().startswith("{")


def test_a_request_moved_from_generate_step_to_the_batch_continues_its_grammar(demo):
    """The lone path's look-ahead has shown the processor the last token; the batch re-feeds it (the
    same list again): the grammar must not advance twice, so the output equals an unmoved run."""
    model, tokenizer = demo
    schema, question = SCHEMAS["nested_enum_bounds"]
    prompt, constraint = chat(tokenizer, question), json_schema(schema)
    unmoved = alone(model, tokenizer, prompt, [make_processor(constraint.grammar, tokenizer)])

    processor, cache, first = make_processor(constraint.grammar, tokenizer), make_prompt_cache(model), []
    steps = generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS, sampler=make_sampler(temp=0.0),
                          prompt_cache=cache, logits_processors=[processor])
    for token, _ in steps:
        first.append(token)
        if len(first) == 6:
            break
    steps.close()
    # as pool/engines/single_sequence.py hands over
    trim_prompt_cache(cache, cache[0].offset - (len(prompt) + len(first) - 1))
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    try:
        (uid,) = gen.insert([first[-1:]], max_tokens=[MAX_TOKENS - len(first)], caches=[cache],
                            all_tokens=[prompt + first[:-1]], samplers=[make_sampler(temp=0.0)],
                            logits_processors=[[processor]])
        rest, done = [], False
        while not done:
            for r in gen.next_generated():
                if r.token not in tokenizer.eos_token_ids:
                    rest.append(r.token)
                done = done or r.finish_reason is not None
    finally:
        gen.close()
    assert first + rest == unmoved
    valid(schema, tokenizer.decode(unmoved))


# ---- the processor on its own: real tokenizer and grammar, flat logits -------------------------------

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def allowed(out: mx.array) -> np.ndarray:
    return np.isfinite(np.array(out.reshape(-1)))


@pytest.fixture(scope="module")
def person_tokens(demo):
    _, tokenizer = demo
    encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    return {"al": encode('{"name": "Al", "age": 3}'), "bo": encode('{"name": "Bo", "age": 4}')}


@pytest.mark.parametrize("calls, final", [
    (["", "al:1", "al:2", "al:3"], "al:3"),                       # one token a call
    (["", "al:2", "al:2", "al:3"], "al:3"),                       # the same list again: no second advance
    (["", "al:4", "al:3", "al:4"], "al:4"),                       # shorter: roll back one, then forward
    (["", "al:5", "al:2"], "al:2"),                               # shorter by several
    (["", "al:all", "bo:all"], "bo:all"),                         # another branch: back to the fork, then along
    (["", "al:all", "al:all+eos", "al:all+eos"], "al:all"),       # EOS ends it: nothing more counts
    (["", "al:3", "al:all"], "al:all"),                           # several tokens at once
], ids=["step", "refed", "shorter", "much-shorter", "branch", "eos", "jump"])
def test_the_processor_follows_the_token_list_it_is_given(demo, person_tokens, calls, final):
    _, tokenizer = demo
    eos = sorted(tokenizer.eos_token_ids)[0]

    def tokens_of(spec: str) -> list[int]:
        if not spec:
            return []
        which, count = spec.split(":")
        tokens = list(person_tokens[which])
        if count == "all+eos":
            return tokens + [eos]
        return tokens if count == "all" else tokens[:int(count)]

    prompt = chat(tokenizer, "a person")
    vocab = len(tokenizer._tokenizer)
    logits = mx.zeros((1, vocab))
    processor = make_processor(json_schema(PERSON).grammar, tokenizer)
    for spec in calls:
        out = processor(mx.array(prompt + tokens_of(spec)), logits)
    expected_processor = make_processor(json_schema(PERSON).grammar, tokenizer)
    expected_processor(mx.array(prompt), logits)
    expected = expected_processor(mx.array(prompt + tokens_of(final)), logits)
    assert processor.consumed == tokens_of(final) and not processor.failed
    assert np.array_equal(allowed(out), allowed(expected))
    if final.endswith("all"):
        assert np.flatnonzero(allowed(out)).tolist() == sorted(tokenizer.eos_token_ids)   # complete: EOS only


def test_a_token_the_grammar_refuses_leaves_only_eos(demo):
    _, tokenizer = demo
    prompt = chat(tokenizer, "a person")
    processor = make_processor(json_schema(PERSON).grammar, tokenizer)
    logits = mx.zeros((1, len(tokenizer._tokenizer)))
    processor(mx.array(prompt), logits)
    out = processor(mx.array(prompt + list(tokenizer.encode("hello", add_special_tokens=False))), logits)
    assert processor.failed
    assert np.flatnonzero(allowed(out)).tolist() == sorted(tokenizer.eos_token_ids)


@pytest.mark.parametrize("extra", [-49000, 0, 100, 40000])
def test_logits_wider_or_narrower_than_the_vocabulary(demo, person_tokens, extra):
    """A model's logits may outnumber its tokenizer's tokens (padding): those are never allowed."""
    _, tokenizer = demo
    vocab = len(tokenizer._tokenizer)
    prompt, written = chat(tokenizer, "a person"), person_tokens["al"][:3]
    reference = make_processor(json_schema(PERSON).grammar, tokenizer)
    reference(mx.array(prompt), mx.zeros((1, vocab)))
    expected = allowed(reference(mx.array(prompt + written), mx.zeros((1, vocab))))
    processor = make_processor(json_schema(PERSON).grammar, tokenizer)
    processor(mx.array(prompt), mx.zeros((1, vocab + extra)))
    out = allowed(processor(mx.array(prompt + written), mx.zeros((1, vocab + extra))))
    assert out.shape == (vocab + extra,) and expected.any()
    assert np.array_equal(out[:vocab], expected[:vocab + extra]) and not out[vocab:].any()


def test_the_processor_runs_on_a_thread_other_than_the_importing_one(demo):
    """The engine thread makes and calls processors; MLX streams are per thread."""
    _, tokenizer = demo
    prompt, result = chat(tokenizer, "a person"), {}

    def engine_thread():
        try:
            processor = make_processor(json_schema(PERSON).grammar, tokenizer)
            processor(mx.array(prompt), mx.zeros((1, 8)))
            vocab = len(tokenizer._tokenizer)
            result["allowed"] = np.flatnonzero(allowed(processor(mx.array(prompt), mx.zeros((1, vocab))))).tolist()
        except Exception as e:   # noqa: BLE001  reported below
            result["error"] = e

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    assert result["allowed"] == tokenizer.encode('{"', add_special_tokens=False)   # the grammar forces '{"name": '


@pytest.mark.parametrize("consumed, seen, plan", [
    ([], [], (0, [])),
    ([], [1, 2], (0, [1, 2])),
    ([1, 2], [1, 2, 3], (0, [3])),
    ([1, 2, 3], [1, 2, 3], (0, [])),
    ([1, 2, 3], [1, 2], (1, [])),
    ([1, 2, 3], [1, 9, 8, 7], (2, [9, 8, 7])),
    ([1, 2], [], (2, [])),
    ([5], [6], (1, [6])),
])
def test_sync_plan(consumed, seen, plan):
    assert sync_plan(consumed, seen) == plan
