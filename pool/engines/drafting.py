"""Speculative decoding with a model's draft, for a request decoding alone (lanes.BatchLane's
single-sequence path) through mlx-lm's own `speculative_generate_step`: the draft proposes a few
tokens, the target checks them in one forward pass and keeps those it would have chosen.

A request uses the draft only when policy/drafts.py says it pays on this model (seconds per token
measured with and without it as the model runs), stops using it when its own acceptance falls (it
goes on plainly from where it is), and never in a batch: when another request arrives it joins the
batch as any lone request does, and the draft's cache is dropped. A request with logits processors
(a grammar, penalties) decodes plainly: mlx-lm feeds them the draft's tokens before the target has
checked them, and a grammar's state cannot take that back.

The draft's cache is read with the whole prompt first (the draft keeps no prompt cache of its own),
a chunk per engine step like the target's prompt. At the end of a speculative round the target's
cache holds every token but the last one handed out (mlx-lm rewinds what was not accepted), which
SingleSequence.handover and finished_cache allow for."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Awaitable, Callable

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache

from ..policy.drafts import DraftRecord, counts_rate, keeps_drafting, use_draft
from .loading import fill_weights, open_model
from .memory_release import release_memory
from .protocol import LoadOptions
from .single_sequence import Pending, SingleSequence, read_prompt_chunk

log = logging.getLogger(__name__)

AVERAGE = 0.3      # weight of the newest request in the per-token moving averages


class Drafter:
    """A model's draft (its mlx-lm model and the tokens it proposes a round) and what drafting has
    measured on this model. Lives on the engine thread."""

    def __init__(self, model, *, tokens: int, min_acceptance: float, nbytes: int = 0):
        self.model, self.tokens, self.min_acceptance, self.nbytes = model, tokens, min_acceptance, nbytes
        self.record = DraftRecord()

    def wanted(self) -> bool:
        """Whether the next lone request drafts (counts as a decision)."""
        choice = use_draft(self.record, min_acceptance=self.min_acceptance)
        self.record = replace(self.record, requests=self.record.requests + 1)
        return choice

    def note(self, sequence: SingleSequence) -> None:
        """A lone request's decoding ended (or left this path): its rate, its draft's acceptance."""
        rate = sequence.decode_rate() if not sequence.processors else None    # a grammar's steps cost more
        r = self.record
        if isinstance(sequence, DraftedSequence):
            if rate is not None and counts_rate(r, drafted=True):
                r = replace(r, drafted_seconds_per_token=_average(r.drafted_seconds_per_token, rate[1] / rate[0]),
                            drafted_tokens=r.drafted_tokens + rate[0])
            r = replace(r, proposed=r.proposed + sequence.proposed, accepted=r.accepted + sequence.accepted,
                        drafted_requests=r.drafted_requests + 1)
        else:
            if rate is not None and counts_rate(r, drafted=False):
                r = replace(r, plain_seconds_per_token=_average(r.plain_seconds_per_token, rate[1] / rate[0]),
                            plain_tokens=r.plain_tokens + rate[0])
            r = replace(r, plain_requests=r.plain_requests + 1)
        self.record = r


class DraftHolder:
    """An engine's side of its draft: letting go of it under memory pressure (the enforcer's
    DROP_DRAFT); the model decodes plainly from then on, until its next load."""

    _drafter: Drafter | None
    _lanes: dict
    _weight_bytes: int
    model_info: dict
    call: Callable[[Callable[[], Any]], Awaitable[Any]]   # EngineWorker's: fn on the engine thread

    async def drop_draft(self) -> int:
        """The bytes the draft took (0: it had none)."""
        def drop() -> int:
            drafter, self._drafter = self._drafter, None
            if drafter is None:
                return 0
            for lane in self._lanes.values():
                if hasattr(lane, "drop_drafter"):
                    lane.drop_drafter()
            freed = drafter.nbytes
            self._weight_bytes -= freed
            self.model_info.pop("draft", None)
            del drafter
            release_memory()
            return freed
        return await self.call(drop)


def load_drafter(options: LoadOptions, config: dict, model_id: str) -> Drafter | None:
    """The draft the pool named for this model, read (on the engine thread, after the model's own
    weights); None when there is none, or it cannot serve this model (logged; the model serves alone)."""
    if options.draft is None:
        return None
    try:
        model, _, draft_config = open_model(options.draft, dequantize=options.draft_dequantize)
    except Exception as e:  # noqa: BLE001 - a draft that cannot load leaves its model serving alone
        log.warning("%s: its draft %s could not be read (%s); it decodes without one", model_id, options.draft.name, e)
        return None
    ours, theirs = _vocabulary(config), _vocabulary(draft_config)
    if ours is None or ours != theirs:
        log.warning("%s: its draft %s has another vocabulary (%s, not %s); it decodes without one",
                    model_id, options.draft.name, theirs, ours)
        return None
    return Drafter(model, tokens=options.draft_tokens, min_acceptance=options.draft_min_acceptance,
                   nbytes=fill_weights(model, options.group_bytes))


def _vocabulary(config: dict) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("vocab_size", config.get("vocab_size"))
    return value if isinstance(value, int) else None


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - AVERAGE) * old + AVERAGE * new


class DraftedSequence(SingleSequence):
    """SingleSequence through mlx-lm's speculative_generate_step (one token per engine step)."""

    def __init__(self, model, pending: Pending, stop: set[int], drafter: Drafter):
        super().__init__(model, pending, stop)
        self.drafter = drafter
        self.draft_cache = make_prompt_cache(drafter.model)
        self.draft_read = 0                 # of the tokens before `pending`, those the draft has read
        self.proposed = self.accepted = 0
        self._round_start = 0               # generated tokens when the current round began

    def _read_chunk(self, prefill_step: int) -> bool:
        if super()._read_chunk(prefill_step):
            return True
        if self.draft_read >= len(self.fed):
            return False
        n = min(prefill_step, len(self.fed) - self.draft_read)
        read_prompt_chunk(self.drafter.model, self.draft_cache, self.fed[self.draft_read:self.draft_read + n])
        self.draft_read += n
        return True

    def _start(self):
        return speculative_generate_step(
            mx.array(self.pending), self.model, self.drafter.model,
            num_draft_tokens=self.drafter.tokens, max_tokens=self.max_tokens, sampler=self.sampler,
            prompt_cache=self.cache + self.draft_cache)

    def _next(self) -> tuple[int, Any]:
        token, logprobs, from_draft = next(self._steps)
        if from_draft:
            self.accepted += 1
        else:       # a round ends with the target's own token
            self.proposed += min(self.drafter.tokens, self.max_tokens - self._round_start)
            self._round_start = len(self.generated) + 1
        return int(token), logprobs

    def keeps_drafting(self) -> bool:
        return keeps_drafting(self.proposed, self.accepted, min_acceptance=self.drafter.min_acceptance)

    @property
    def kv_bytes(self) -> int:
        return super().kv_bytes + sum(c.nbytes for c in self.draft_cache)

    def close(self) -> None:
        if self._steps is not None and len(self.generated) > self._round_start:
            # the round in progress was cut short (a stop, the last token): count what it proposed
            self.proposed += min(self.drafter.tokens, self.max_tokens - self._round_start)
            self._round_start = len(self.generated)
        super().close()
