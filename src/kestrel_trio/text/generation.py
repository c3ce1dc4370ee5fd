"""The sans-IO generation state machine: prompt in, text deltas out.

Theory of operation: a :class:`Generation` never runs the model itself. Its
driver (a test, the CLI, the engine's inference task) asks it for the tokens to
feed next (:meth:`Generation.next_input`), runs the model over them with the
generation's own KV cache, and hands the logits back to :meth:`Generation.advance`,
which returns a :class:`StepResult`. Phases:

    PREFILL  next_input() is the next chunk of the prompt; the logits of all
             but the last chunk are ignored.
    DECODE   next_input() is the last sampled token; each advance() samples
             one token, detokenizes it incrementally and filters stop strings.
    DONE     finish_reason is set ("stop" or "length"); usage is final.

Because the driver owns the compute, several generations can be stepped in one
batched forward, and a driver can stop between any two steps (cancellation).

A prompt with images (Qwen3-VL) carries them as ``images``; ``prompt_ids``
then already hold each image's expanded ``<|image_pad|>`` run. The driver
encodes the images over its first steps (``vision_steps``, one vision block
per step) and keeps the result in ``vl_prompt``
until the prompt is in; positions are then shifted by ``rope_delta``.
"""

from __future__ import annotations

import enum
from typing import Iterator

import attrs
import numpy as np

from kestrel_trio._model import KVCache
from kestrel_trio._model.qwen3_vl import VLPrompt
from kestrel_trio.errors import ContextLengthError
from kestrel_trio.text.detokenizer import IncrementalDetokenizer
from kestrel_trio.text.images import ProcessedImage
from kestrel_trio.text.sampling import Sampler, SamplingParams, TokenLogprobs
from kestrel_trio.text.stops import StopStringMatcher
from kestrel_trio.text.tokenizer import Tokenizer

__all__ = ["Phase", "StepResult", "Generation", "check_context"]


class Phase(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@attrs.frozen
class StepResult:
    """What one step produced.

    Attributes:
        text: newly completed text (may be empty: held back for UTF-8 or a possible stop string).
        token_id: the token sampled by this step, or None for a prefill chunk.
        finish_reason: "stop" or "length" once finished, else None.
        logprobs: the sampled token's logprobs when ``params.logprobs`` is set;
            None for an EOS / stop token id that ended the generation (its text
            is never emitted, so it is not reported, as OpenAI does not).
    """

    text: str = ""
    token_id: int | None = None
    finish_reason: str | None = None
    logprobs: TokenLogprobs | None = None


def check_context(
    prompt_tokens: int, max_tokens: int | None, context_length: int, *, param: str, max_tokens_param: str = "max_tokens",
    context_name: str = "model's context length",
) -> int:
    """The effective max_tokens, or ContextLengthError naming the field at fault.

    Args:
        prompt_tokens: tokens in the prompt.
        max_tokens: requested new tokens, None for "as many as fit".
        context_length: the context window served (tokens).
        param: the request field that carried the prompt.
        max_tokens_param: the request field that carried ``max_tokens``.
        context_name: how the message names ``context_length`` (``Model.context_name``).
    """
    if prompt_tokens >= context_length:
        raise ContextLengthError(
            f"The prompt is {prompt_tokens} tokens, but the {context_name} is {context_length} tokens "
            f"(at least one token must remain for the answer)",
            param=param,
        )
    room = context_length - prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ContextLengthError(
            f"The prompt ({prompt_tokens} tokens) plus {max_tokens_param} ({max_tokens}) exceeds the "
            f"{context_name} of {context_length} tokens",
            param=max_tokens_param,
        )
    return max_tokens


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
        contain_memory_errors: a MemoryError while sampling is recorded in
            :attr:`memory_failure` instead of raised (for a driver that rolls back, as the engine does).
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
        prefill_chunk: int = 256,
        images: tuple[ProcessedImage, ...] = (),
        contain_memory_errors: bool = False,
    ) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.cache = cache
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
        self._usable_vocab = min(vocab_size, tokenizer.vocab_size)
        self.has_images = bool(images)  # never reuses or stores prefix KV: equal pad ids may be different images
        self.images = tuple(images)  # dropped once encoded into vl_prompt
        self.vl_prompt: VLPrompt | None = None  # set by the driver's first step; dropped once the prompt is in
        self.vision_steps: Iterator[None] | None = None  # the vision tower mid-way, advanced a block per step
        self.rope_delta = 0  # position of token i is i + rope_delta once past the prompt's images
        self.memory_failure: str | None = None  # set by advance() when sampling ran out of memory
        self._contain_memory_errors = contain_memory_errors

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.generated_ids)

    @property
    def fresh(self) -> bool:
        """True before the first step: a prefix may still be restored into the cache."""
        return self.phase is Phase.PREFILL and self._prefilled == 0

    def reuse_prefix(self, restored: int) -> None:
        """Count the first ``restored`` prompt tokens as prefilled: their KV was put into the cache."""
        if not self.fresh or self.cache.length != restored or restored >= len(self.prompt_ids):
            raise ValueError(f"cannot reuse {restored} tokens (cache {self.cache.length}, prompt {len(self.prompt_ids)})")
        self._prefilled = self.cached_tokens = restored

    @property
    def kv_tokens(self) -> int:
        """Tokens whose KV this generation has counted as in its cache: what a failed step rolls back to."""
        if self.phase is Phase.PREFILL:
            return self._prefilled
        return len(self.prompt_ids) + max(0, len(self.generated_ids) - 1)  # the newest token is not fed yet

    def progress(self) -> tuple[str, int, int]:
        """A marker that changes whenever :meth:`advance` ran (phase, prompt tokens in, tokens generated)."""
        return self.phase.value, self._prefilled, len(self.generated_ids)

    def drop_cache(self) -> None:
        """Let go of the KV cache once the generation is over (a prefix cache may still keep it)."""
        c = self.cache
        self.cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, dtype=c.dtype, max_tokens=0)

    def cached_token_ids(self) -> list[int]:
        """The ids of the tokens whose KV the cache holds, in order."""
        return (self.prompt_ids + self.generated_ids)[: self.cache.length]

    def prefill_range(self) -> tuple[int, int]:
        """Prompt rows ``[start, end)`` that :meth:`next_input` returns while prefilling."""
        return self._prefilled, min(self._prefilled + self._chunk, len(self.prompt_ids))

    def next_positions(self) -> np.ndarray:
        """Rotary positions of :meth:`next_input`, int64 [T] (text rows: all three M-RoPE positions equal)."""
        if self.phase is Phase.PREFILL and self.vl_prompt is not None:
            start, end = self.prefill_range()
            return self.vl_prompt.positions[0, start:end]  # [T]
        n = self.next_input().size
        return np.arange(self.cache.length, self.cache.length + n, dtype=np.int64) + self.rope_delta  # [T]

    def next_input(self) -> np.ndarray:
        """The token ids to feed the model next, int64 [T]."""
        if self.phase is Phase.PREFILL:
            start, end = self.prefill_range()
            return np.asarray(self.prompt_ids[start:end], dtype=np.int64)
        if self.phase is Phase.DECODE:
            return np.asarray(self.generated_ids[-1:], dtype=np.int64)
        raise RuntimeError("the generation is finished")

    def advance(self, logits: np.ndarray) -> StepResult:
        """Take the logits [vocab] of the last token fed; sample when the prompt is in.

        With ``contain_memory_errors``, a MemoryError while sampling does not
        escape (so the other generations of a batched step keep their
        results): the step is undone when nothing was emitted yet, and
        :attr:`memory_failure` says so ("retry"; "fatal" when a token had been
        taken already). The driver then cuts the cache back to
        :attr:`kv_tokens` and retries or ends the generation.
        """
        if self.phase is Phase.DONE:
            raise RuntimeError("the generation is finished")
        saved = (self.phase, self._prefilled, self.vl_prompt, len(self.generated_ids))
        try:
            return self._advance(logits)
        except MemoryError:
            if not self._contain_memory_errors:
                raise
            if len(self.generated_ids) != saved[3]:
                self.memory_failure = "fatal"
            else:
                self.phase, self._prefilled, self.vl_prompt = saved[:3]
                self.memory_failure = "retry"
            return StepResult()

    def _advance(self, logits: np.ndarray) -> StepResult:
        if self.phase is Phase.PREFILL:
            self._prefilled += min(self._chunk, len(self.prompt_ids) - self._prefilled)
            if self._prefilled < len(self.prompt_ids):
                return StepResult()
            self.phase = Phase.DECODE
            self.vl_prompt = None  # image features are only needed by prefill
        return self._sample_and_emit(logits)

    def _sample_and_emit(self, logits: np.ndarray) -> StepResult:
        if self._usable_vocab < logits.shape[-1]:
            logits = logits.copy()  # [vocab]
            logits[self._usable_vocab :] = -np.inf  # padding rows of the embedding are not tokens
        token, scored = self._sampler.sample_scored(logits, self.generated_ids, self.prompt_ids)
        self.generated_ids.append(token)
        if token in self._stop_ids:
            return self._finish("stop", token, "", self._detokenizer.flush(), None)
        text, stopped = self._stops.push(self._detokenizer.push(token))
        if stopped:
            return self._finish("stop", token, text, None, scored)
        if len(self.generated_ids) >= self._max_tokens:
            return self._finish("length", token, text, self._detokenizer.flush(), scored)
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
        return StepResult(text=emitted, token_id=token, finish_reason=reason, logprobs=scored)
