"""Where an engine's requests decode, by the KV cache they asked for.

Requests whose KV configuration can share a batch share a `BatchLane`: one mlx-lm BatchGenerator,
and mlx-lm's faster single-sequence path while only one request is in it (alone.py).
The default (a growing KVCache) is one lane; each `max_kv_size` is another (a RotatingKVCache built
by hand, since mlx-lm's make_prompt_cache ignores max_kv_size for llama, whose model makes its own
cache). Quantized KV (`kv_bits`) has no batched cache in mlx-lm, so each such request decodes in a
`SoloLane` of its own: mlx-lm's generate_step, one token per engine step, beside the batches. The
engine steps every lane in turn, so all of them run concurrently on its one thread.

A model whose caches cannot be cut back (checkpoints.py) keeps copies of a prompt's KV at its
checkpoints: on the single-sequence path as the prompt is read, in the batch by cutting the prompt
at them (`insert_segments`; at each segment's end the lane copies the request's KV out with
`extract_cache`), for the engine to keep (`checkpoints()`). Such a request moves into the batch by
the token sampled ahead (single_sequence.py) and never leaves it again."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step, generation_stream
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache, trim_prompt_cache

from .checkpoints import segments
from .drafting import DraftedSequence, Drafter
from .multi_lora import AdapterSet, BatchRows, model_for
from .protocol import KVConfig
from .single_sequence import Pending, SingleSequence, with_history

SIMILAR_TOKENS = 64        # prompts up to this long always enter together (padding them costs little)
ROTATING_KEEP = 4          # tokens a rotating cache always keeps at the start (mlx-lm's default)


@dataclass(frozen=True)
class Step:
    """One token for one request of a lane, with the logprobs vector it was sampled from; the last
    carries the request's KV and tokens."""
    uid: int
    token: int
    finish_reason: str | None
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None
    logprobs: Any = None
    draft: tuple[int, int] | None = None     # on the last: draft tokens (proposed, accepted), if it drafted


def new_cache(model, config: KVConfig) -> list[Any]:
    """An empty KV cache of the kind `config` asks for."""
    if config.max_kv_size is not None:
        return [RotatingKVCache(max_size=config.max_kv_size, keep=ROTATING_KEEP) for _ in model.layers]
    return make_prompt_cache(model)


def prefill_chunk(config: KVConfig, tokens: int) -> int:
    """Prompt tokens read per step. A rotating cache holds its window plus the chunk being read, so
    its chunks are a quarter of the window: the peak stays near the window."""
    if config.max_kv_size is not None:
        return min(tokens, max(ROTATING_KEEP * 16, config.max_kv_size // 4))
    return tokens


def shortest_first(incoming: list[Pending], unstarted: list[int]) -> tuple[list[Pending], list[Pending]]:
    """(those that enter the batch now, those that wait a step). mlx-lm pads the prompts read together
    to the longest one's chunk, so a short prompt arriving with a long one would pay for the long one
    (measured: 7.3 s instead of 0.5 s beside a 440-token prompt). A prompt more than twice as long
    as the shortest one waiting (here or not yet started in the batch) waits until those have their
    first token; prompts of similar lengths still enter, and are read, together."""
    lengths = [len(p.tokens) for p in incoming] + unstarted
    if not lengths:
        return incoming, []
    limit = max(2 * min(lengths), SIMILAR_TOKENS)
    return [p for p in incoming if len(p.tokens) <= limit], [p for p in incoming if len(p.tokens) > limit]


class BatchLane:
    """Requests of one KV configuration. While one request is alone in the default lane it decodes
    through mlx-lm's single-sequence path (`SingleSequence`); as soon as another arrives, both join the
    `BatchGenerator`, and a request left alone in the batch leaves it again. Requests that arrive
    between two steps enter the batch together, so their prompts are read as one batch."""

    def __init__(self, model, config: KVConfig, stop_tokens: list[list[int]], *, trimmable: bool = True,
                 prefill_batch: int = 32, drafter: Drafter | None = None, adapters: AdapterSet | None = None):
        self.model, self.config, self._drafter, self._adapters = model, config, drafter, adapters
        self._drafts: dict[int, tuple[int, int]] = {}    # lane uid -> draft tokens (proposed, accepted) so far
        rows = BatchRows(adapters, self._adapter_of) if adapters is not None else model
        self._generator = BatchGenerator(rows, stop_tokens=stop_tokens, stream=generation_stream,
                                         prefill_batch_size=prefill_batch, completion_batch_size=prefill_batch)
        self._stop = {t for seq in stop_tokens for t in seq if len(seq) == 1}
        self._fast = config.max_kv_size is None           # a lone request takes the single-sequence path
        self._trimmable = trimmable                       # ... and can leave the batch again, or draft
        self._handed: list[Step] = []                     # tokens handed out by a move into the batch
        self._uids = itertools.count()
        self._incoming: list[Pending] = []
        self._single: SingleSequence | None = None
        self._in_batch: dict[int, int] = {}          # generator uid -> lane uid
        self._batched: dict[int, Pending] = {}       # lane uid -> how it entered (sampler, max_tokens)
        self._generated: dict[int, int] = {}         # lane uid -> tokens generated in the batch
        self._prefix: dict[int, int] = {}            # lane uid -> tokens whose KV it brought (a cache hit)
        self._read: dict[int, int] = {}              # lane uid -> prompt tokens with KV now, since last asked
        self._kept: list[tuple[int, list[Any], list[int]]] = []   # checkpoints since last asked: (uid, KV, tokens)
        self._prefill_step = 2048

    def set_prefill_step(self, tokens: int) -> None:
        # read by each step: the next chunk uses it
        self._prefill_step = self._generator.prefill_step_size = prefill_chunk(self.config, tokens)

    def insert(self, tokens: list[int], *, cache, all_tokens: list[int], max_tokens: int, sampler,
               processors=(), checkpoints: tuple[int, ...] = (), adapter: str | None = None) -> int:
        """A request; `checkpoints`: prompt positions at which to hand out a copy of its KV (`checkpoints()`);
        `adapter`: a LoRA adapter attached to the lane's AdapterSet, its rows run with."""
        if cache is None and self.config.max_kv_size is not None:
            cache = new_cache(self.model, self.config)
        uid = next(self._uids)
        self._incoming.append(Pending(uid, list(tokens), cache, list(all_tokens), max_tokens, sampler,
                                      tuple(processors), tuple(checkpoints), adapter))
        return uid

    def _adapter_of(self, g: int) -> str | None:
        entered = self._batched.get(self._in_batch.get(g, -1))
        return entered.adapter if entered is not None else None

    def _alone(self, pending: Pending) -> SingleSequence:
        """The single-sequence path for `pending`: drafted where the drafter wants it (never for an adapter)."""
        if pending.adapter is None and self._trimmable and self._drafter is not None and not pending.processors \
                and self._drafter.wanted():
            return DraftedSequence(self.model, pending, self._stop, self._drafter)
        return self._plain(pending)

    def _plain(self, pending: Pending) -> SingleSequence:
        return SingleSequence(model_for(self.model, self._adapters, pending.adapter), pending, self._stop)

    def step(self) -> list[Step]:
        self._place_incoming()
        handed, self._handed = self._handed, []
        if self._single is not None:
            return handed + self._step_single()
        steps = self._step_batch()
        self._maybe_leave_batch()
        return handed + steps

    def _place_incoming(self) -> None:
        if not self._incoming:
            return
        if self._fast and self._single is None and not self._in_batch and len(self._incoming) == 1:
            self._single = self._alone(self._incoming.pop())
            return
        if self._single is not None:          # company: the lone request joins the batch with them
            self._join_batch(self._leave_single())
        entering, self._incoming = shortest_first(self._incoming, self._unstarted_lengths())
        for pending in entering:
            self._to_batch(pending)

    def _join_batch(self, alone: SingleSequence) -> None:
        if self._trimmable or not alone.generated:
            self._incoming.insert(0, alone.handover())
            return
        token, logprobs, pending, held = alone.handover_ahead()
        if pending is not None:
            self._incoming.insert(0, pending)
            self._handed.append(Step(alone.uid, token, None, logprobs=logprobs))
            return
        finish = "stop" if token in self._stop else "length"     # the token ahead was its last
        self._handed.append(Step(alone.uid, token, finish, alone.cache, held, logprobs))

    def _unstarted_lengths(self) -> list[int]:
        """Prompt tokens of the batch's requests that have not produced their first token yet."""
        return [len(p.tokens) for uid, p in self._batched.items() if not self._generated.get(uid)]

    def _to_batch(self, p: Pending) -> None:
        # each segment's end is a checkpoint: the generator reports it (end_of_segment) once read
        (g,) = self._generator.insert_segments([segments(p.tokens, len(p.all_tokens), p.checkpoints)],
                                               max_tokens=[p.max_tokens], caches=[p.cache],
                                               all_tokens=[p.all_tokens], samplers=[p.sampler],
                                               logits_processors=[list(p.processors)])
        self._in_batch[g] = p.uid
        self._batched[p.uid] = replace(p, cache=None, all_tokens=[])   # the generator holds the KV now
        self._generated[p.uid] = 0
        self._prefix[p.uid] = len(p.all_tokens)

    def _step_single(self) -> list[Step]:
        alone = self._single
        out = alone.step(self._prefill_step)
        self._kept.extend((alone.uid, cache, tokens) for cache, tokens in alone.take_kept())
        if out is None:
            self._read[alone.uid] = len(alone.fed)
            return []
        token, logprobs, finish = out
        if finish is None:
            if isinstance(alone, DraftedSequence) and not alone.keeps_drafting():   # on plainly, from here
                self._single = self._plain(self._leave_single().handover())
            return [Step(alone.uid, token, None, logprobs=logprobs)]
        self._leave_single()
        cache, tokens = alone.finished_cache()
        return [Step(alone.uid, token, finish, cache, tokens, logprobs, self._drafts.pop(alone.uid, None))]

    def drop_drafter(self) -> None:
        """No more drafting: a request drafting now goes on plainly from where it is."""
        if isinstance(self._single, DraftedSequence):
            self._single = self._plain(self._leave_single().handover())
        self._drafter = None

    def _leave_single(self) -> SingleSequence:
        """The lone request leaves the single path: what it measured goes to the drafter."""
        alone, self._single = self._single, None
        assert alone is not None
        alone.close()
        if self._drafter is not None and alone.adapter is None:
            self._drafter.note(alone)
        if isinstance(alone, DraftedSequence):
            proposed, accepted = self._drafts.get(alone.uid, (0, 0))
            self._drafts[alone.uid] = (proposed + alone.proposed, accepted + alone.accepted)
        return alone

    def _step_batch(self) -> list[Step]:
        prompts, responses = self._generator.next()
        ends = []
        for r in prompts:
            uid = self._in_batch.get(r.uid)
            if uid is not None and not r.end_of_prompt:
                self._read[uid] = self._prefix[uid] + r.progress[0]
                if r.end_of_segment and self._batched[uid].checkpoints:
                    ends.append(r.uid)
        if ends:
            for g, (cache, tokens) in self._generator.extract_cache(ends).items():
                self._kept.append((self._in_batch[g], cache, list(tokens)))
        steps = []
        for r in responses:
            uid = self._in_batch.get(r.uid)
            if uid is None:
                continue
            draft = None
            if r.finish_reason is not None:
                self._forget(r.uid)
                draft = self._drafts.pop(uid, None)
            else:
                self._generated[uid] += 1
            steps.append(Step(uid, r.token, r.finish_reason, r.prompt_cache, r.all_tokens, r.logprobs, draft))
        return steps

    def _maybe_leave_batch(self) -> None:
        """A request left alone in the batch, past its prompt, continues on the single path."""
        if not (self._fast and self._trimmable) or len(self._in_batch) != 1 or self._incoming:
            return
        (g, uid), = self._in_batch.items()
        if not self._generated[uid]:
            return                            # still reading its prompt
        entered, remaining = self._batched[uid], self._batched[uid].max_tokens - self._generated[uid]
        cache, tokens = self._generator.remove([g], return_prompt_caches=True)[g]
        self._forget(g)
        trim_prompt_cache(cache, 1)           # the batch's look-ahead: feed its last token again
        pending = Pending(uid, tokens[-1:], cache, tokens[:-1], remaining, entered.sampler, entered.processors,
                          adapter=entered.adapter)
        self._single = self._plain(pending)

    def _forget(self, g: int) -> None:
        uid = self._in_batch.pop(g)
        self._batched.pop(uid, None)
        self._generated.pop(uid, None)
        self._prefix.pop(uid, None)
        self._read.pop(uid, None)

    def prompt_read(self) -> dict[int, int]:
        """The requests whose prompt advanced since the last call: lane uid -> its tokens with KV
        (a cache hit's included), for their traces' prefill progress."""
        read, self._read = self._read, {}
        return read

    def checkpoints(self) -> list[tuple[int, list[Any], list[int]]]:
        """(lane uid, a copy of its KV, the tokens in it) at each checkpoint its prompt passed since the last call."""
        kept, self._kept = self._kept, []
        return kept

    def remove(self, uid: int, *, keep_cache: bool = False):
        """Take a request out; with keep_cache, returns (its KV, its tokens) for the prompt cache."""
        self._incoming = [p for p in self._incoming if p.uid != uid]
        self._drafts.pop(uid, None)
        if self._single is not None and self._single.uid == uid:
            alone = self._leave_single()
            return alone.finished_cache() if keep_cache else None
        g = next((g for g, u in self._in_batch.items() if u == uid), None)
        if g is None:
            return None
        self._forget(g)
        caches = self._generator.remove([g], return_prompt_caches=keep_cache)
        return caches.get(g)

    @property
    def alone_uid(self) -> int | None:
        """The request decoding on the single-sequence path, if one is."""
        return self._single.uid if self._single is not None else None

    @property
    def kv_bytes(self) -> int:
        alone = self._single.kv_bytes if self._single is not None else 0
        return alone + (self._generator.prompt_cache_nbytes if self._in_batch else 0)

    @property
    def empty(self) -> bool:
        return not (self._in_batch or self._incoming or self._single is not None)

    def close(self) -> None:
        if self._single is not None:
            self._single.close()
        self._generator.close()


class SoloLane:
    """One request with quantized KV: mlx-lm's generate_step (kv_bits, kv_group_size,
    quantized_kv_start), stopping at the model's stop tokens and at max_tokens."""

    def __init__(self, model, config: KVConfig, stop_tokens: list[list[int]], adapters: AdapterSet | None = None):
        self.model, self.config, self._adapters = model, config, adapters
        self._stop = {t for seq in stop_tokens for t in seq if len(seq) == 1}
        self._steps = None
        self._cache: list[Any] = []
        self._uid, self._max_tokens, self._generated = 0, 0, 0
        self._prefill_step = 2048

    def set_prefill_step(self, tokens: int) -> None:
        self._prefill_step = tokens                   # for a request not yet started

    def insert(self, tokens: list[int], *, cache, all_tokens: list[int], max_tokens: int, sampler,
               processors=(), checkpoints: tuple[int, ...] = (), adapter: str | None = None) -> int:
        self._cache = cache or make_prompt_cache(self.model)
        self._max_tokens = max_tokens
        c = self.config
        model = model_for(self.model, self._adapters, adapter)
        self._steps = generate_step(mx.array(tokens), model, max_tokens=max_tokens, sampler=sampler,
                                    logits_processors=with_history(processors, all_tokens),
                                    prompt_cache=self._cache, kv_bits=c.kv_bits, kv_group_size=c.kv_group_size,
                                    quantized_kv_start=c.quantized_kv_start, prefill_step_size=self._prefill_step)
        return self._uid

    def step(self) -> list[Step]:
        if self._steps is None:
            return []
        token, logprobs = next(self._steps)
        token = int(token.item() if hasattr(token, "item") else token)
        self._generated += 1
        finish = "stop" if token in self._stop else ("length" if self._generated >= self._max_tokens else None)
        if finish is not None:
            self._steps.close()
            self._steps = None
        return [Step(self._uid, token, finish, logprobs=logprobs)]

    def prompt_read(self) -> dict[int, int]:
        return {}                                     # generate_step reads the whole prompt in one step

    def checkpoints(self) -> list:
        return []                                     # quantized KV is never kept in the prompt cache

    def remove(self, uid: int, *, keep_cache: bool = False):
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        return None

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self._cache) if self._steps is not None else 0

    @property
    def empty(self) -> bool:
        return self._steps is None

    def close(self) -> None:
        self._cache = []
