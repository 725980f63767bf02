"""How requests reach a language model's engine thread: a prompt is encoded (on a worker thread),
then posted; requests that arrive together enter the batch together.

A wave of clients (8 chats sent at once) reaches the engine thread over some milliseconds: each
prompt is encoded on a worker thread and posted when its coroutine next runs. A step taken as soon
as the first arrives splits the wave: its prompt is read alone, the others a step later, and each
group that enters mlx-lm's BatchGenerator costs a forward pass of its own (the group's first decode
step, before it joins the batch). Measured on the 2-core CPU VM (issue 22): 8 streams entered as 2
then 6, a 1.1 s step for the first two prompts before the others were read at all.

So encoding a prompt announces a request (`Arrivals.expect`), and posting it ends the announcement
(`arrived`). Before the step that starts newly inserted requests, the engine thread waits for the
requests still on their way, at most ADMIT_WAIT after the first new one. A request alone is announced
and posted before its step, so it waits for nothing.
"""

from __future__ import annotations

import collections
import time

ADMIT_WAIT = 0.02      # seconds the step that starts new requests waits for announced ones, at most
ANNOUNCED_FOR = 0.5    # an announcement older than this is not waited for (a prompt only counted, or refused)


class Arrivals:
    """Announced requests (their encode's start time) and the newly inserted ones not yet stepped.
    `expect`/`arrived` run on any thread (deque appends and pops are atomic); the rest on the
    engine thread."""

    def __init__(self):
        self._announced: collections.deque[float] = collections.deque()
        self._first_new: float | None = None
        self.admissions = 0     # steps that started newly inserted requests
        self.waits = 0          # times the engine thread waited for announced requests

    def expect(self) -> None:
        self._announced.append(time.monotonic())

    def arrived(self) -> None:
        try:
            self._announced.popleft()
        except IndexError:      # it had expired
            pass

    def inserted(self) -> None:
        if self._first_new is None:
            self._first_new = time.monotonic()

    def wait(self) -> float:
        """Seconds the engine thread should still wait for commands before its next step (0: none)."""
        if self._first_new is None:
            return 0.0
        now = time.monotonic()
        while self._announced and now - self._announced[0] > ANNOUNCED_FOR:
            self.arrived()
        left = self._first_new + ADMIT_WAIT - now if self._announced else 0.0
        if left > 0:
            self.waits += 1
        return max(left, 0.0)

    def stepped(self) -> None:
        if self._first_new is not None:
            self._first_new = None
            self.admissions += 1

    def idle(self) -> None:
        """Nothing to step (the new requests failed to start): no window is open."""
        self._first_new = None


class PromptEncoding:
    """A text engine's prompts: its tokenizer, and encoding that announces a request to `arrivals`."""

    _tokenizer = None
    arrivals: Arrivals

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int | None:
        return len(self._tokenizer) if self._tokenizer is not None else None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt of a chat; `tools` (OpenAI function tools) go to the chat template, which
        renders them where it knows how (one without tool support ignores them)."""
        tok = self._tokenizer
        self.arrivals.expect()
        try:
            if getattr(tok, "has_chat_template", False):
                extra = {"tools": list(tools)} if tools else {}
                return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra))
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
            return list(tok.encode(text))
        except BaseException:
            self.arrivals.arrived()
            raise

    def chat_checkpoints(self, messages: list[dict], tools: list[dict] | None, prompt: list[int]) -> tuple[int, ...]:
        """Where this chat's prompt meets the prompts the same chat sends next, for a model whose cache
        cannot be cut back to a shorter prefix (a recurrent state, a wrapped sliding window): the end
        of its system prompt, the end of the turns before its last user message (a client that edits
        or regenerates that message shares those), and where the next turn's own rendering of the
        assistant's answer parts from this prompt's generation prompt. Each is found by rendering
        those messages alone and comparing tokens, as mlx_lm.server finds the system prompt's end."""
        tok = self._tokenizer
        if not getattr(tok, "has_chat_template", False) or not messages:
            return ()
        extra = {"tools": list(tools)} if tools else {}
        systems = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")),
                       len(messages))
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
        renders = [messages[:systems] + [{"role": "user", "content": ""}] if 0 < systems < len(messages) else None,
                   messages[:last_user] if systems < last_user else None,
                   messages + [{"role": "assistant", "content": "."}]]
        marks = set()
        for render in renders:
            if render is None:
                continue
            try:
                tokens = tok.apply_chat_template(render, add_generation_prompt=False, tokenize=True, **extra)
            except Exception:  # noqa: BLE001 - a template may refuse a partial chat: no mark there
                continue
            shared = next((i for i, (a, b) in enumerate(zip(tokens, prompt)) if a != b), min(len(tokens), len(prompt)))
            if 0 < shared < len(prompt) - 1:
                marks.add(shared)
        return tuple(sorted(marks))

    def encode_text(self, prompt: str) -> list[int]:
        self.arrivals.expect()
        try:
            return list(self._tokenizer.encode(prompt))
        except BaseException:
            self.arrivals.arrived()
            raise
