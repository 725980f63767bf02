"""Request limits, as pure decisions over plain values: how many tokens a request may generate in
its model's context, whether its prompt can fit before it is tokenised, the limits on counts and
lengths of a body's lists and strings. (Each API dialect words the refusals: pool/api/*/words.py.)

The context holds the prompt and what is generated. A prompt that fills it leaves nothing to
generate: refused. A `max_tokens` the client gave that does not fit beside the prompt is refused too
(OpenAI's and Anthropic's 400: the client asked for something the model cannot do, and a client such
as Claude Code reads the numbers and retries with less); a default `max_tokens` (the server's or the
model's setting) is lowered to what fits, so generation ends at the context with "length"."""

from __future__ import annotations

from dataclasses import dataclass

PROMPT, COMPLETION = "prompt", "completion"      # which part did not fit


def context_length(model_context: int | None, fallback: int) -> int:
    """The context a request gets: the model's own (config.json), else the configured fallback."""
    if isinstance(model_context, int) and not isinstance(model_context, bool) and model_context > 0:
        return model_context
    return fallback


@dataclass(frozen=True)
class ContextFit:
    max_tokens: int = 0           # tokens the request may generate (0 when refused)
    refused: str | None = None    # PROMPT or COMPLETION


def fit_context(*, prompt_tokens: int, requested: int | None, default: int, context: int) -> ContextFit:
    """How many tokens a request with this prompt may generate. `requested` is the client's own
    max_tokens (None when it gave none; then `default` applies and is lowered to what fits)."""
    if prompt_tokens >= context:
        return ContextFit(refused=PROMPT)
    room = context - prompt_tokens
    if requested is not None:
        return ContextFit(requested) if requested <= room else ContextFit(refused=COMPLETION)
    return ContextFit(max(1, min(default, room)))


def max_prompt_chars(context: int, chars_per_token: int) -> int:
    """The longest prompt (in characters) that is tokenised at all: no tokenizer packs more than a
    few characters into a token of real text, so a longer prompt cannot fit the context, and reading
    it would only fill the heap (a 10 MB prompt took 660 MB to tokenise)."""
    return context * chars_per_token


def prompt_chars(messages: list[dict] | None, prompt: str | None) -> int:
    """The characters a request's prompt is made of: a completion's prompt, or every message's
    content and tool-call arguments (the chat template's own text is not counted)."""
    if messages is None:
        return len(prompt or "")
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):      # text and image parts: the texts' characters
            total += sum(len(part.get("text") or "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                total += len(function.get("arguments") or "") + len(function.get("name") or "")
    return total


def too_many(count: int, limit: int) -> str | None:
    """The problem with a list of `count` items where `limit` are allowed, or None."""
    return f"has {count} items; this server takes at most {limit}" if count > limit else None


def stop_problem(stops: list[str] | tuple[str, ...], *, max_count: int | None, max_chars: int) -> str | None:
    """The problem with a request's stop strings, or None."""
    if max_count is not None and len(stops) > max_count:
        return f"at most {max_count} stop strings are allowed; got {len(stops)}"
    for i, stop in enumerate(stops):
        if len(stop) > max_chars:
            return f"each stop string may be at most {max_chars} characters; number {i} has {len(stop)}"
    return None
