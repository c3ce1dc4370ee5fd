"""The sans-IO generation state machine: prompt in, text deltas out.

Theory of operation: a :class:`Generation` never runs the model itself. Its
driver (a test, the CLI, the engine's inference task) asks it for the tokens to
feed next (:meth:`Generation.next_input`), runs the model over them with the
generation's own KV cache, and hands the logits back to :meth:`Generation.advance`,
which returns a :class:`~kestrel_trio.text.step_result.StepResult`. Phases:

    PREFILL  next_input() is the next chunk of the prompt; the logits of all
             but the last chunk are ignored.
    DECODE   next_input() is the last sampled token; each advance() samples
             one token, detokenizes it incrementally and filters stop strings.
    DONE     finish_reason is set ("stop" or "length"); usage is final. A
             "length" cut between two tokens of one UTF-8 character drops
             that character's incomplete bytes: text never ends inside a
             character, nor with a U+FFFD the model did not produce.

A generation ends with "length" at ``max_tokens``, at the end of its cache,
or when its ``repetition_guard`` sees the output loop (the answer is cut short
either way, so clients treat both alike).

Because the driver owns the compute, several generations can be stepped in one
batched forward, and a driver can stop between any two steps (cancellation).

A prompt with images (Qwen3-VL) carries them as ``images``; ``prompt_ids``
then already hold each image's expanded ``<|image_pad|>`` run. The driver
encodes the images over its first steps (``vision_steps``, one vision block
per step) and keeps the result in ``vl_prompt``
until the prompt is in; positions are then shifted by ``rope_delta``.

A generation given a :class:`~kestrel_trio.text.speculative.SpeculationState`
may decode several tokens a step (speculative decoding): the driver asks for a
draft (:meth:`Generation.draft`), feeds ``[last token, *draft]`` as one segment
with every row's logits, and hands the rows to
:meth:`Generation.advance_speculative`, whose result carries every token kept
(:meth:`~kestrel_trio.text.step_result.StepResult.tokens`), each through the same per-token path as a plain
step; the cache is cut back to the tokens kept.

A generation with a :class:`~kestrel_trio.text.constraints.constraint.Constraint`
(structured outputs) keeps its own ``constraint`` state: while it is active,
each sampled token is drawn from the grammar's mask, and the token is then fed
to the grammar. A driver may compute the masks of a batch ahead
(:func:`~kestrel_trio.text.constraints.constraint.start_masks`) for the generations whose
step samples (:attr:`Generation.samples_next`); otherwise ``advance`` computes it.

A generation with a :class:`~kestrel_trio.text.constraints.reasoning_budget.ReasoningBudget` keeps its own
``reasoning`` state: once its reasoning block has used the budget, the next token is the
end-of-reasoning token, drawn by the same sampler from a mask that allows it alone (so logprobs, stop
ids and the grammar see it as any other token), and a speculative step's row does the same.
"""

from __future__ import annotations

import enum
import inspect
from typing import Iterator, Sequence

import attrs
import numpy as np

from kestrel_trio._model import KVCache, VLPrompt
from kestrel_trio.text.constraints.constraint import Constraint, ConstraintState
from kestrel_trio.text.constraints.reasoning_budget import BudgetState, ReasoningBudget
from kestrel_trio.text.media.images import ProcessedImage
from kestrel_trio.text.repetition import RepetitionWatch
from kestrel_trio.text.sampling.params import SamplingParams
from kestrel_trio.text.sampling.sampler import Sampler, TokenLogprobs
from kestrel_trio.text.speculative import SpeculationState
from kestrel_trio.text.step_result import StepResult
from kestrel_trio.text.stops import StopStringMatcher
from kestrel_trio.text.tokens.detokenizer import IncrementalDetokenizer
from kestrel_trio.text.tokens.tokenizer import Tokenizer

__all__ = ["Phase", "Generation", "DEFAULT_PREFILL_CHUNK"]

DEFAULT_PREFILL_CHUNK = 256  # prompt tokens per prefill step (EngineLimits.prefill_chunk, Model.prefill)


class Phase(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class Generation:
    """One request's progress from prompt to finished text.

    Args:
        prompt_ids: the prompt's token ids (non-empty).
        params: sampling parameters; ``max_tokens`` must already fit the context.
        tokenizer: for incremental detokenization.
        eos_token_ids: tokens that end the generation unless ``params.ignore_eos``.
        cache: this generation's own KV cache (empty).
        vocab_size: rows of the model's logits (may exceed the tokenizer's: padding rows are never sampled).
        prefill_chunk: prompt tokens per prefill step.
        images: the prompt's images in prompt order (Qwen3-VL), already preprocessed.
        constraint: the grammar the output must follow (structured outputs), or None.
        contain_memory_errors: a MemoryError while sampling is recorded in
            :attr:`memory_failure` instead of raised (for a driver that rolls back, as the engine does).
        speculation: the drafter and policy of speculative decoding, or None for plain decoding
            (the caller leaves it out where it does not apply: see ``speculative.steps_aside``).
        reasoning_budget: the tokens the reasoning block may hold before its end token is forced, or None.
    """

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        tokenizer: Tokenizer,
        eos_token_ids: frozenset[int],
        cache: KVCache,
        vocab_size: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        images: tuple[ProcessedImage, ...] = (),
        constraint: Constraint | None = None,
        contain_memory_errors: bool = False,
        speculation: SpeculationState | None = None,
        reasoning_budget: ReasoningBudget | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self._cache = cache
        self.generated_ids: list[int] = []
        self.finish_reason: str | None = None
        self.phase = Phase.PREFILL
        self._prefilled = 0
        self.cached_tokens = 0  # prompt tokens restored from a prefix cache instead of computed
        self._chunk = prefill_chunk
        self._max_tokens = params.max_tokens if params.max_tokens is not None else 2**31
        self._stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self._sampler = Sampler(params, vocab_size)
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = StopStringMatcher(params.stop)
        self._repetition = RepetitionWatch(params.repetition_guard) if params.repetition_guard is not None else None
        self._usable_vocab = min(vocab_size, tokenizer.vocab_size)
        self.has_images = bool(images)  # never reuses or stores prefix KV: equal pad ids may be different images
        self._images = tuple(images)  # handed to the vision tower by take_images
        self._vl_prompt: VLPrompt | None = None  # set once the images are encoded; dropped once the prompt is in
        self._vision_steps: Iterator[None] | None = None  # the vision tower mid-way, advanced a block per step
        self._rope_delta = 0  # position of token i is i + rope_delta once past the prompt's images
        self.constraint: ConstraintState | None = constraint.start() if constraint is not None else None
        self._memory_failure: str | None = None  # set by advance() when sampling ran out of memory
        self._contain_memory_errors = contain_memory_errors
        self.speculation = speculation if constraint is None and not images else None
        self.reasoning: BudgetState | None = reasoning_budget.start() if reasoning_budget is not None else None
        self._vocab_size = vocab_size

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.generated_ids)

    @property
    def samples_next(self) -> bool:
        """Whether the next :meth:`advance` samples a token (a decode step, or the prompt's last chunk)."""
        if self.phase is Phase.PREFILL:
            return self.prefill_range()[1] >= len(self.prompt_ids)
        return self.phase is Phase.DECODE

    @property
    def fresh(self) -> bool:
        """True before the first step: a prefix may still be restored into the cache."""
        return self.phase is Phase.PREFILL and self._prefilled == 0

    @property
    def cache(self) -> KVCache:
        """This generation's own KV cache."""
        return self._cache

    def reuse_prefix(self, cache: KVCache, restored: int) -> None:
        """Take ``cache`` as this generation's, its first ``restored`` prompt tokens counted as prefilled.

        Args:
            cache: the cache to use from now on (a prefix cache's, holding the KV of ``restored`` tokens).
            restored: prompt tokens whose KV ``cache`` holds (0: nothing reused).
        """
        if not self.fresh or cache.length != restored or restored >= len(self.prompt_ids):
            raise ValueError(f"cannot reuse {restored} tokens (cache {cache.length}, prompt {len(self.prompt_ids)})")
        self._cache = cache
        self._prefilled = self.cached_tokens = restored


    # ---- images (Qwen3-VL): the step runs the vision tower, the generation keeps its progress ----

    @property
    def needs_vision(self) -> bool:
        """Whether the prompt's images are still to be encoded before its next prefill chunk."""
        return self.has_images and self._vl_prompt is None and self.phase is Phase.PREFILL

    @property
    def vision_started(self) -> bool:
        """Whether the vision tower is running over this generation's images."""
        return self._vision_steps is not None

    @property
    def vl_prompt(self) -> VLPrompt | None:
        """The encoded prompt (image features and 3-D positions) while its prefill runs, else None."""
        return self._vl_prompt

    def take_images(self) -> tuple[ProcessedImage, ...]:
        """Hand the prompt's images over to the vision tower (the generation keeps no copy)."""
        images, self._images = self._images, ()
        return images

    def start_vision(self, steps: Iterator[None]) -> None:
        """Keep the vision tower's steps (a generator returning the :class:`VLPrompt`), one block per
        :meth:`step_vision`."""
        self._vision_steps = steps

    def step_vision(self) -> bool:
        """Run the next vision block; True once the images are encoded (the prompt's prefill can start)."""
        assert self._vision_steps is not None, "start_vision first"
        try:
            next(self._vision_steps)
            return False
        except StopIteration as done:
            self._vl_prompt, self._vision_steps = done.value, None
            self._rope_delta = self._vl_prompt.rope_delta
            return True

    def vision_failed(self) -> bool:
        """Whether the vision tower stopped with an error part way (it cannot resume: the images are gone)."""
        steps = self._vision_steps
        return inspect.isgenerator(steps) and inspect.getgeneratorstate(steps) == inspect.GEN_CLOSED

    def chunk_has_image_rows(self) -> bool:
        """Whether the next prefill chunk holds image rows (it then goes alone through the VL prefill)."""
        if self.phase is not Phase.PREFILL or self._vl_prompt is None:
            return False
        start, end = self.prefill_range()
        lo, hi = np.searchsorted(self._vl_prompt.image_rows, [start, end])
        return bool(hi > lo)

    # ---- memory: what a driver that contains MemoryErrors (the engine) rolls back to ----

    @property
    def kv_tokens(self) -> int:
        """Tokens whose KV this generation has counted as in its cache: what a failed step rolls back to."""
        if self.phase is Phase.PREFILL:
            return self._prefilled
        return len(self.prompt_ids) + max(0, len(self.generated_ids) - 1)  # the newest token is not fed yet

    @property
    def memory_failure(self) -> str | None:
        """"retry" or "fatal" once sampling ran out of memory (``contain_memory_errors``; see :meth:`advance`)."""
        return self._memory_failure

    def take_memory_failure(self) -> str | None:
        """:attr:`memory_failure`, cleared (the driver has dealt with it)."""
        failure, self._memory_failure = self._memory_failure, None
        return failure

    def roll_back(self) -> None:
        """Cut the cache back to :attr:`kv_tokens`, forgetting whatever a failed step half wrote."""
        self._cache.truncate(self.kv_tokens)

    def progress(self) -> tuple[str, int, int]:
        """A marker that changes whenever :meth:`advance` ran (phase, prompt tokens in, tokens generated)."""
        return self.phase.value, self._prefilled, len(self.generated_ids)

    def drop_cache(self) -> None:
        """Let go of the KV cache once the generation is over (a prefix cache may still keep it)."""
        c = self._cache
        self._cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, dtype=c.dtype, max_tokens=0)
        if self.speculation is not None:
            self.speculation.drafter.release()

    def cached_token_ids(self) -> list[int]:
        """The ids of the tokens whose KV the cache holds, in order."""
        return (self.prompt_ids + self.generated_ids)[: self.cache.length]

    def prefill_range(self) -> tuple[int, int]:
        """Prompt rows ``[start, end)`` that :meth:`next_input` returns while prefilling."""
        return self._prefilled, min(self._prefilled + self._chunk, len(self.prompt_ids))

    def next_positions(self) -> np.ndarray:
        """Rotary positions of :meth:`next_input`, int64 [T] (text rows: all three M-RoPE positions equal)."""
        if self.phase is Phase.PREFILL and self._vl_prompt is not None:
            start, end = self.prefill_range()
            return self._vl_prompt.positions[0, start:end]  # [T]
        n = self.next_input().size
        return np.arange(self.cache.length, self.cache.length + n, dtype=np.int64) + self._rope_delta  # [T]

    def next_input(self) -> np.ndarray:
        """The token ids to feed the model next, int64 [T]."""
        if self.phase is Phase.PREFILL:
            start, end = self.prefill_range()
            return np.asarray(self.prompt_ids[start:end], dtype=np.int64)
        if self.phase is Phase.DECODE:
            return np.asarray(self.generated_ids[-1:], dtype=np.int64)
        raise RuntimeError("the generation is finished")

    def advance(self, logits: np.ndarray | None) -> StepResult:
        """Take the logits [vocab] of the last token fed; sample when the prompt is in.

        ``logits`` may be None for a step that samples nothing (:attr:`samples_next` False: a prompt
        chunk before the last), whose logits the forward pass need not compute.

        With ``contain_memory_errors``, a MemoryError while sampling does not
        escape (so the other generations of a batched step keep their
        results): the step is undone when nothing was emitted yet, and
        :attr:`memory_failure` says so ("retry"; "fatal" when a token had been
        taken already). The driver then cuts the cache back to
        :attr:`kv_tokens` and retries or ends the generation.
        """
        return self._contained(self._advance, logits)

    def _contained(self, advance, *args) -> StepResult:
        """``advance(*args)``, a MemoryError contained as :meth:`advance` says."""
        if self.phase is Phase.DONE:
            raise RuntimeError("the generation is finished")
        saved = (self.phase, self._prefilled, self._vl_prompt, len(self.generated_ids))
        try:
            return advance(*args)
        except MemoryError:
            if not self._contain_memory_errors:
                raise
            if len(self.generated_ids) != saved[3]:
                self._memory_failure = "fatal"
            else:
                self.phase, self._prefilled, self._vl_prompt = saved[:3]
                self._memory_failure = "retry"
            return StepResult()

    def _advance(self, logits: np.ndarray | None) -> StepResult:
        if logits is None and self.samples_next:
            raise ValueError("this step samples a token: it needs the logits of the last token fed")
        if self.phase is Phase.PREFILL:
            self._prefilled += min(self._chunk, len(self.prompt_ids) - self._prefilled)
            if self._prefilled < len(self.prompt_ids):
                return StepResult()
            self.phase = Phase.DECODE
            self._vl_prompt = None  # image features are only needed by prefill
        elif self.speculation is not None:
            self.speculation.plain_step()
        assert logits is not None
        return self._sample_and_emit(logits)

    # ---- speculative decoding: a draft verified in one forward pass (kestrel_trio.text.speculative) ----

    def draft(self) -> list[int]:
        """The tokens to verify after the last one this step ([] for a plain step).

        Empty unless speculation is on for this generation and it is decoding;
        never longer than what the length limit and the KV reservation leave
        room for (the step also keeps the target's own next token).
        """
        spec = self.speculation
        if spec is None or self.phase is not Phase.DECODE:
            return []
        room = self._max_tokens - len(self.generated_ids) - 1
        if self._cache.max_tokens is not None:
            room = min(room, self._cache.max_tokens - self._cache.length - 1)
        return spec.propose(self.prompt_ids + self.generated_ids, room)

    def advance_speculative(self, logits: np.ndarray, draft: Sequence[int]) -> StepResult:
        """Take the logits [1 + k, vocab] of ``[last token, *draft]``; keep the draft's accepted prefix and one more.

        Row i decides the token after the first i drafted tokens, through the
        same sampler and per-token path as :meth:`advance` (stops, length,
        EOS, logprobs): a drafted token the row accepts is kept, the first one
        it rejects is replaced by the row's own token, and after k accepted
        row k adds one more. A stop inside the run ends it there. The cache
        is then cut back to the tokens kept. Memory errors: as :meth:`advance`.

        Returns:
            The last token's StepResult; the earlier ones are in its ``before``.
        """
        if self.phase is not Phase.DECODE or logits.shape[0] != len(draft) + 1:
            raise ValueError(f"need a decoding generation and {len(draft) + 1} logit rows, got {logits.shape[0]}")
        return self._contained(self._verify, logits, list(draft))

    def _verify(self, logits: np.ndarray, draft: list[int]) -> StepResult:
        results: list[StepResult] = []
        accepted = 0
        for i, row in enumerate(logits):  # row: [vocab]
            row = self._usable(row)
            forced = self._forced_mask()  # [vocab] bool, or None
            if forced is not None:  # the budget decides this row: the draft is kept only if it guessed the same
                token, scored = self._sampler.sample_scored(row, self.generated_ids, self.prompt_ids, forced)
            elif i < len(draft):
                token, scored = self._sampler.sample_draft(row, self.generated_ids, self.prompt_ids, draft[i])
            else:
                token, scored = self._sampler.sample_scored(row, self.generated_ids, self.prompt_ids)
            kept = i < len(draft) and token == draft[i]
            accepted += kept
            results.append(self._emit(token, scored))
            if not kept or self.phase is Phase.DONE:
                break
        self._cache.truncate(self.kv_tokens)  # the KV of rejected drafts is forgotten
        assert self.speculation is not None
        self.speculation.record(len(draft), accepted)
        return attrs.evolve(results[-1], before=tuple(results[:-1]))

    def _usable(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` [vocab] with the embedding's padding rows (past the tokenizer's vocabulary) at -inf."""
        if self._usable_vocab < logits.shape[-1]:
            logits = logits.copy()  # [vocab]
            logits[self._usable_vocab :] = -np.inf  # padding rows of the embedding are not tokens
        return logits

    def _sample_and_emit(self, logits: np.ndarray) -> StepResult:
        logits = self._usable(logits)  # [vocab]
        grammar = self.constraint
        allowed = grammar.token_mask() if grammar is not None and grammar.active else None  # [vocab] bool
        forced = self._forced_mask()  # [vocab] bool: the end of reasoning alone, once its budget is spent
        if forced is not None:  # a grammar waits while the block is open, so it has no say here
            allowed = forced
        if allowed is None:  # no grammar: the sampler's plain call
            token, scored = self._sampler.sample_scored(logits, self.generated_ids, self.prompt_ids)
        else:
            token, scored = self._sampler.sample_scored(logits, self.generated_ids, self.prompt_ids, allowed)
        return self._emit(token, scored)

    def _forced_mask(self) -> np.ndarray | None:
        """A bool [vocab] mask allowing only the token the reasoning budget forces next, or None."""
        forced = self.reasoning.forced() if self.reasoning is not None else None
        if forced is None:
            return None
        mask = np.zeros(self._vocab_size, dtype=bool)  # [vocab]
        mask[forced] = True
        return mask

    def _emit(self, token: int, scored: TokenLogprobs | None) -> StepResult:
        """Take ``token`` as the next generated one: reasoning budget, grammar, stop ids, stop strings, length."""
        grammar = self.constraint
        self.generated_ids.append(token)
        if self.reasoning is not None:
            self.reasoning.push(token)
        if grammar is not None:
            grammar.consume(token)
        if token in self._stop_ids or (grammar is not None and grammar.ended):
            return self._finish("stop", token, "", self._detokenizer.flush(), None)
        text, stopped = self._stops.push(self._detokenizer.push(token))
        if stopped:
            return self._finish("stop", token, text, None, scored)
        if len(self.generated_ids) >= self._max_tokens or (self._repetition is not None
                                                           and self._repetition.push(token)):
            # Cut short: bytes of a character whose rest was never generated are dropped, never sent as U+FFFD.
            return self._finish("length", token, text, self._detokenizer.flush(cut=True), scored)
        return StepResult(text=text, token_id=token, logprobs=scored)

    def _finish(
        self, reason: str, token: int, emitted: str, held: str | None, scored: TokenLogprobs | None
    ) -> StepResult:
        """End the generation; ``held`` is text the detokenizer still held (None: a stop string matched)."""
        if held is not None:
            # Text still held back can no longer grow into a stop string, unless it completes one now.
            tail, stopped = self._stops.push(held)
            if not stopped:
                tail += self._stops.flush()
                stopped = self._stops.stopped  # overlapping stops can only be confirmed at flush
            emitted += tail
            reason = "stop" if stopped else reason
        self.finish_reason = reason
        self.phase = Phase.DONE
        matched = self._stops.matched if reason == "stop" else None
        return StepResult(text=emitted, token_id=token, finish_reason=reason, logprobs=scored, stop_sequence=matched)
