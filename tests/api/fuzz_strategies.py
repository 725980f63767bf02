"""The fuzz tests' request bodies (tests/api/test_fuzz.py): JSON text the encoder would not write (deep
nesting, numbers Python cannot hold), hypothesis strategies for every field of every JSON route, nasty
values among them (huge and non-finite numbers, lone surrogates, deep and big values), and bodies() that
puts them into a route's valid base body."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from tests.conftest import DEMO

MINILM = "all-MiniLM-L6-v2"
TINY = "tiny"                   # settings, load and unload are fuzzed on this one, not on the demo model
SMALL_MAX_TOKENS = 3            # valid bodies finish fast


# ---- JSON text the encoder would not write --------------------------------------------------------

class Raw(str):
    """JSON text spliced into a body as it is: deep nesting, numbers Python cannot hold."""


def to_json(value) -> str:
    """A body as JSON text. Python's encoder writes NaN / Infinity as the bare tokens and a lone
    surrogate as its \\udXXX escape: exactly the input to test."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


def nested(depth: int, inner: str = "1") -> Raw:
    return Raw('{"a":' * depth + inner + "}" * depth)


def deep_schema(depth: int) -> Raw:
    return Raw('{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth)


# ---- the strategies -------------------------------------------------------------------------------

HUGE_INTS = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**399, -(10**399),
             Raw("9" * 5000)]                       # past Python's int-from-text limit
NON_FINITE = [float("nan"), float("inf"), float("-inf"), Raw("1e400"), Raw("-1e400")]
SURROGATES = ["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d"]      # sent as \udXXX escapes
DEEP = [Raw("[" * 100_000), Raw("[" * 900 + "]" * 900), nested(2000), nested(900)]
BIG = [list(range(10_000)), ["x"] * 10_000, [{}] * 10_000, "x" * 200_000]
CURATED = st.sampled_from(HUGE_INTS + NON_FINITE + SURROGATES + DEEP + BIG + [None, True, False, -1, 0, "", [], {}])
NASTY = st.one_of(   # the curated values as likely as all the generic ones together
    CURATED, CURATED, CURATED, CURATED, st.integers(), st.floats(), st.text(max_size=12),
    st.lists(st.integers() | st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=2),
)
UNKNOWN_FIELDS = st.sampled_from(["foo", "user", "metadata", "service_tier", "store", "thinking", "", "\ud800"])

texts = st.text(max_size=30) | st.sampled_from(SURROGATES + ["", "x" * 5_000, "héllo 🌍", "<|im_end|>", "{{ x }}"])
small_max_tokens = st.integers(1, SMALL_MAX_TOKENS)
max_tokens_values = small_max_tokens | st.sampled_from([-1, 0, 2**31, 2**63 - 1, 10**30, 10**6, 1.5, "3"])
unit_floats = st.floats(-1, 3) | st.sampled_from(NON_FINITE)
stops = texts | st.lists(texts, max_size=6)
schemas = st.sampled_from([{}, {"type": "object"}, {"type": "object", "properties": {"a": {"type": "integer"}},
                                                     "required": ["a"]},
                           {"type": "string"}, {"type": "array"}, {"$ref": "#/nope"}, {"type": "object", "x-y": 1},
                           {"type": "object", "properties": {"a": {"pattern": "("}}}, deep_schema(300), True, "x"])
tool_names = st.sampled_from(["get_weather", "a", "bad name", "", "x" * 65, "\ud800"])
openai_tools = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "code_interpreter"]),
     "function": st.fixed_dictionaries({"name": tool_names}, optional={"description": texts, "parameters": schemas,
                                                                        "strict": st.booleans()})}), max_size=2)
openai_tool_choice = st.sampled_from(["auto", "none", "required", "any",
                                      {"type": "function", "function": {"name": "get_weather"}},
                                      {"type": "function", "function": {"name": "missing"}}, {"type": "function"}])
response_formats = st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "xml"}, {},
                                    {"type": "json_object", "schema": {"type": "object"}}]) | st.builds(
    lambda schema, strict: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}},
    schemas, st.booleans() | st.just("yes"))
keep_alives = st.sampled_from([-1, "5m", "1h", "-1", "soon", "5 minutes", 3600, 1e9] + HUGE_INTS + NON_FINITE)
kv_ints = st.integers(-2, 2**16) | st.sampled_from([4, 8, 32, 64, 128, 2**63, 10**30])
token_ids = st.integers(-2, 60_000) | st.sampled_from([2**31, 2**63, 10**30])
logit_bias = st.dictionaries(st.sampled_from(["0", "1", "49151", "99999999", "-1", "abc", "1e3", "\ud800"]),
                             st.floats(-200, 200) | st.sampled_from(NON_FINITE), max_size=3)


def openai_messages():
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": texts})
    call = {"id": st.just("call_1"), "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": tool_names,
                                               "arguments": st.sampled_from(['{"a": 1}', "{", "", "1"])})}
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"])},
        optional={"content": texts | st.lists(part, max_size=2) | st.none(), "tool_call_id": texts,
                  "tool_calls": st.lists(st.fixed_dictionaries(call), max_size=2), "name": texts})
    return st.lists(message, min_size=1, max_size=4)


def anthropic_messages():
    block = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_1"), "name": tool_names,
                               "input": st.just({"a": 1}) | st.just([]) | st.just(nested(900))}),
        st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1")},
                              optional={"content": texts, "is_error": st.booleans() | st.just("no")}),
        st.fixed_dictionaries({"type": st.sampled_from(["thinking", "image", "document", "server_tool_use"])}))
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                     "content": texts | st.lists(block, max_size=3)})
    return st.lists(message, min_size=1, max_size=4)


anthropic_tools = st.lists(st.fixed_dictionaries(
    {"name": tool_names}, optional={"type": st.sampled_from(["custom", "web_search_20250305"]), "description": texts,
                                    "input_schema": schemas}), max_size=2)
anthropic_tool_choice = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "any", "tool", "none", "all"])},
    optional={"name": tool_names, "disable_parallel_tool_use": st.booleans() | st.just(1)})

SAMPLING = {"temperature": unit_floats, "top_p": unit_floats, "stop": stops, "seed": st.integers(-2, 2**64 + 1),
            "n": st.integers(-1, 9) | st.just(True), "stream": st.booleans() | st.just("yes"),
            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | st.just("no")}),
            "max_tokens": max_tokens_values, "max_completion_tokens": max_tokens_values,
            "logit_bias": logit_bias, "presence_penalty": unit_floats, "frequency_penalty": unit_floats,
            "repetition_penalty": unit_floats, "keep_alive": keep_alives, "cache_prompt": st.booleans(),
            "max_kv_size": kv_ints, "kv_bits": kv_ints, "kv_group_size": kv_ints, "quantized_kv_start": kv_ints,
            "model": st.sampled_from([DEMO, "nope", "", MINILM, 5])}
CHAT_FIELDS = {**SAMPLING, "messages": openai_messages(), "tools": openai_tools, "tool_choice": openai_tool_choice,
               "parallel_tool_calls": st.booleans() | st.just(0), "response_format": response_formats,
               "logprobs": st.booleans() | st.integers(-1, 6), "top_logprobs": st.integers(-1, 25)}
COMPLETION_FIELDS = {**SAMPLING, "prompt": texts | st.lists(texts, max_size=2) | st.lists(token_ids, max_size=3),
                     "logprobs": st.integers(-1, 6) | st.booleans(), "echo": st.booleans(), "suffix": texts}
MESSAGES_FIELDS = {"model": SAMPLING["model"], "max_tokens": max_tokens_values, "messages": anthropic_messages(),
                   "system": texts | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]),
                                                                     "text": texts}), max_size=2),
                   "stop_sequences": st.lists(texts, max_size=3) | texts, "temperature": unit_floats,
                   "top_p": unit_floats, "top_k": st.integers(-1, 100) | st.sampled_from(HUGE_INTS),
                   "stream": st.booleans() | st.just("yes"), "tools": anthropic_tools,
                   "tool_choice": anthropic_tool_choice, "metadata": st.just({"user_id": "u"})}
EMBEDDING_FIELDS = {"model": st.sampled_from([MINILM, DEMO, "nope", ""]),
                    "input": texts | st.lists(texts, max_size=3) | st.lists(token_ids, max_size=4)
                    | st.lists(st.lists(token_ids, max_size=3), max_size=2),
                    "encoding_format": st.sampled_from(["float", "base64", "int8", "", None]),
                    "dimensions": st.integers(-1, 1000) | st.sampled_from(HUGE_INTS), "user": texts,
                    "keep_alive": keep_alives}
SETTINGS_FIELDS = {"is_pinned": st.booleans(), "is_hidden": st.booleans(), "ttl_seconds": st.integers(-1, 10**6),
                   "temperature": unit_floats, "top_p": unit_floats, "max_tokens": st.integers(-1, 10**6),
                   "alias": st.sampled_from(["alpha", DEMO, "", None, "a/b"]) | texts, "display_name": texts,
                   "notes": texts, "model_alias": texts, "model_id": texts,
                   "max_kv_size": kv_ints, "kv_bits": kv_ints, "kv_group_size": kv_ints, "quantized_kv_start": kv_ints}
UNLOAD_FIELDS = {"force": st.booleans() | st.just("yes")}

# ---- Ollama's native API ---------------------------------------------------------------------------

ollama_models = st.sampled_from([DEMO, f"{DEMO}:latest", f"{DEMO}:7b", "nope", "", MINILM, 5])
ollama_formats = st.sampled_from(["json", "", "yaml", None]) | schemas
ollama_options = st.fixed_dictionaries({}, optional={
    "temperature": unit_floats, "top_p": unit_floats, "top_k": st.integers(-1, 100) | st.sampled_from(HUGE_INTS),
    "seed": st.integers(-2, 2**64 + 1), "stop": stops, "num_predict": max_tokens_values,
    "num_ctx": st.integers(-1, 10**6) | st.sampled_from(HUGE_INTS), "repeat_penalty": unit_floats,
    "presence_penalty": unit_floats, "frequency_penalty": unit_floats, "num_gpu": st.integers(-1, 99)})
ollama_call = st.fixed_dictionaries({"function": st.fixed_dictionaries(
    {"name": tool_names}, optional={"arguments": st.just({"city": "Paris"}) | st.just("{") | st.just([])})})
ollama_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={"content": texts | st.none() | st.just([]), "images": st.lists(st.just("aGk="), max_size=1),
              "tool_calls": st.lists(ollama_call, max_size=2), "tool_name": tool_names,
              "thinking": texts}), min_size=1, max_size=4)
OLLAMA_SHARED = {"model": ollama_models, "format": ollama_formats, "options": ollama_options,
                 "keep_alive": keep_alives, "stream": st.booleans() | st.just("yes"),
                 "think": st.booleans() | st.sampled_from(["high", "x"])}
OLLAMA_CHAT_FIELDS = {**OLLAMA_SHARED, "messages": ollama_messages, "tools": openai_tools}
OLLAMA_GENERATE_FIELDS = {**OLLAMA_SHARED, "prompt": texts, "suffix": texts, "system": texts, "raw": st.booleans(),
                          "template": texts | st.sampled_from(["{{ .Prompt }}", "{{", "{% for %}"]),
                          "images": st.lists(st.just("aGk="), max_size=2), "context": st.lists(token_ids, max_size=3)}
OLLAMA_EMBED_FIELDS = {"model": st.sampled_from([MINILM, f"{MINILM}:latest", DEMO, "nope", ""]),
                       "input": EMBEDDING_FIELDS["input"], "truncate": st.booleans() | st.just("no"),
                       "dimensions": EMBEDDING_FIELDS["dimensions"], "keep_alive": keep_alives,
                       "options": ollama_options}
OLLAMA_EMBEDDINGS_FIELDS = {"model": OLLAMA_EMBED_FIELDS["model"], "prompt": texts, "keep_alive": keep_alives}
OLLAMA_SHOW_FIELDS = {"model": ollama_models, "name": ollama_models, "verbose": st.booleans() | st.just(1)}

# ---- OpenAI's Responses API ---------------------------------------------------------------------------

response_parts = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal", "x"])},
    optional={"text": texts, "image_url": st.just("data:image/png;base64,aGk=")}), max_size=2)
response_items = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "robot"])},
                          optional={"type": st.just("message"), "content": texts | response_parts}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.sampled_from(["call_1", "", 5]),
                           "name": tool_names, "arguments": st.sampled_from(['{"a": 1}', "{", "", "1"])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.sampled_from(["call_1", "zz"])},
                          optional={"output": texts | st.just({"a": 1})}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "web_search_call", "item_reference", ""])})),
    min_size=1, max_size=4)
response_tools = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search", "file_search"])},
    optional={"name": tool_names, "description": texts, "parameters": schemas, "strict": st.booleans()}), max_size=2)
response_text = st.fixed_dictionaries({}, optional={"format": st.sampled_from(
    [{"type": "text"}, {"type": "json_object"}, {"type": "xml"}, {}]) | st.builds(
    lambda schema, strict: {"type": "json_schema", "name": "x", "schema": schema, "strict": strict},
    schemas, st.booleans() | st.just("yes")), "verbosity": st.sampled_from(["low", "x"])})
RESPONSES_FIELDS = {
    "model": SAMPLING["model"], "input": texts | response_items, "instructions": texts | st.none(),
    "tools": response_tools, "parallel_tool_calls": st.booleans() | st.just(0), "text": response_text,
    "tool_choice": st.sampled_from(["auto", "none", "required", "any", {"type": "function", "name": "get_weather"},
                                    {"type": "function", "name": "missing"}, {"type": "function"}]),
    "max_output_tokens": max_tokens_values, "temperature": unit_floats, "top_p": unit_floats,
    "stream": st.booleans() | st.just("yes"), "store": st.booleans() | st.just("no"),
    "previous_response_id": st.sampled_from(["resp_nope", "", "resp_" + "0" * 48, 5, None]),
    "metadata": st.dictionaries(st.text(max_size=70), texts, max_size=20) | st.just([]),
    "truncation": st.sampled_from(["auto", "disabled", "x"]), "keep_alive": keep_alives,
    "reasoning": st.just({"effort": "high"}) | st.just({}), "include": st.just(["reasoning.encrypted_content"]),
}


def bodies(base: dict, fields: dict) -> st.SearchStrategy:
    """The route's valid base body with one or two fields given a plausible or a nasty value, maybe one
    removed, maybe an unknown field added; now and then not an object at all."""
    names = sorted(set(base) | set(fields))

    def changed(chosen):
        return st.fixed_dictionaries({name: st.one_of(fields.get(name, NASTY), NASTY) for name in chosen})

    def build(changes, removed, unknown):
        body = {k: v for k, v in base.items() if k not in removed}
        return {**body, **changes, **unknown}
    chosen = st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True) if names else st.just([])
    objects = st.builds(build, chosen.flatmap(changed), st.sets(st.sampled_from(names), max_size=1) if names
                        else st.just(set()), st.dictionaries(UNKNOWN_FIELDS, NASTY, max_size=1))
    return st.one_of(objects, objects, objects, objects, NASTY)
