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

from .checkpoints import chat_marks, generation_tail
from .grammar import prepare as prepare_grammar

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
    """A text engine's prompts: its tokenizer (and its grammar tables), and encoding that announces a
    request to `arrivals`."""

    _tokenizer = None
    _generation_tail: int | None = None    # checkpoints.generation_tail of this tokenizer, once asked
    arrivals: Arrivals

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int | None:
        return len(self._tokenizer) if self._tokenizer is not None else None

    def prepare_constraints(self) -> None:
        """Build the tokenizer's grammar tables now (about 1 s, once per tokenizer), on the calling
        thread, rather than on the engine thread at the first constrained request, where they would
        stall the model's running streams."""
        if self._tokenizer is not None:
            prepare_grammar(self._tokenizer)

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
        """Where this chat's prompt meets the prompts the same chat sends next (checkpoints.chat_marks),
        for a model whose cache cannot be cut back."""
        if self._generation_tail is None:
            self._generation_tail = generation_tail(self._tokenizer)
        return chat_marks(self._tokenizer, messages, tools, prompt, self._generation_tail)

    def encode_text(self, prompt: str) -> list[int]:
        self.arrivals.expect()
        try:
            return list(self._tokenizer.encode(prompt))
        except BaseException:
            self.arrivals.arrived()
            raise
