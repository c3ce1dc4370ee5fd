"""Values that cross the engine's boundary."""

from __future__ import annotations

import attrs

from kestrel_trio.model import KV_DTYPES
from kestrel_trio.text.constraints.constraint import Constraint
from kestrel_trio.text.generation import DEFAULT_PREFILL_CHUNK
from kestrel_trio.text.media.images import ProcessedImage
from kestrel_trio.text.media.videos import ProcessedVideo
from kestrel_trio.text.constraints.reasoning_budget import ReasoningBudget
from kestrel_trio.text.sampling.params import SamplingParams
from kestrel_trio.text.sampling.sampler import TokenLogprobs
from kestrel_trio.text.speculative import MAX_SPECULATIVE_TOKENS, SPECULATIVE_MODES

__all__ = ["EngineLimits", "GenerationRequest", "Delta", "KVUsage"]


@attrs.frozen
class EngineLimits:
    """The engine's bounds.

    Attributes:
        max_queued: generations that may wait for the batch; one more is refused (429).
        max_batch: generations stepped together in one forward pass.
        prefill_chunk: prompt tokens per prefill step (bounds how long other streams wait).
        prefix_cache_bytes: KV kept for reuse by later prompts with the same prefix (bytes; 0: off);
            a share inside ``kv_cache_bytes``, not beside it.
        stall_factor: a step running this many times its usual duration is a stall (/health 503).
        stall_floor: seconds a step may always run before it can count as stalled.
        max_model_len: the longest sequence (prompt plus generated tokens) served, at most the
            model's context (None: the model's context).
        kv_cache_bytes: every live KV byte (running generations and the prefix cache) stays
            within this (bytes; None: derived at start, what ``max_batch`` sequences at the
            context cap and the prefix cache can hold, at most half the memory available; see
            kestrel_trio.engine.memory.kv_budget).
        kv_dtype: KV cache storage, "fp32", "bf16" or "fp16" (half the bytes; compute stays fp32).
        speculative: speculative decoding at batch 1: "off", "ngram" (prompt lookup) or "draft"
            (a draft model, given to the engine beside the model); see kestrel_trio.text.speculative.
        speculative_tokens: tokens drafted per step, 1 to 31 (None: 5 for ngram, 4 for draft).
    """

    max_queued: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    max_batch: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    prefill_chunk: int = attrs.field(default=DEFAULT_PREFILL_CHUNK, validator=attrs.validators.ge(1))
    prefix_cache_bytes: int = attrs.field(default=256 * 2**20, validator=attrs.validators.ge(0))
    stall_factor: float = 50.0
    stall_floor: float = 60.0
    max_model_len: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    kv_cache_bytes: int | None = attrs.field(default=None,
                                             validator=attrs.validators.optional(attrs.validators.ge(1)))
    kv_dtype: str = attrs.field(default="fp32", validator=attrs.validators.in_(KV_DTYPES))
    speculative: str = attrs.field(default="off", validator=attrs.validators.in_(SPECULATIVE_MODES))
    speculative_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(
        [attrs.validators.ge(1), attrs.validators.le(MAX_SPECULATIVE_TOKENS)]))


@attrs.frozen
class GenerationRequest:
    """A tokenized prompt and how to sample its continuation.

    Attributes:
        prompt_ids: the prompt's token ids.
        params: sampling parameters (max_tokens None: as many as the context allows).
        prompt_param: the request field that carried the prompt, for error messages.
        images: the prompt's images, then its videos, each kind in prompt order, preprocessed (Qwen3-VL
            only); ``prompt_ids`` then hold each image's expanded ``<|image_pad|>`` run and each video's
            timestamped ``<|video_pad|>`` runs.
        constraint: the grammar the output must follow (structured outputs), compiled
            for this model; each choice of a request starts its own state from it.
        max_tokens_param: the request field that carried ``params.max_tokens``, for error messages.
        reasoning_budget: tokens the reasoning block may hold before its end token is forced
            (:mod:`kestrel_trio.text.constraints.reasoning_budget`), or None for no budget.
    """

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    prompt_param: str = "prompt"
    images: tuple[ProcessedImage | ProcessedVideo, ...] = ()
    constraint: Constraint | None = None
    max_tokens_param: str = "max_tokens"
    reasoning_budget: ReasoningBudget | None = None


@attrs.frozen
class Delta:
    """One generated token's worth of output.

    Attributes:
        text: new text (may be empty while a character or stop string is held back).
        token_id: the token generated.
        finish_reason: "stop" or "length" on the last delta, else None.
        prompt_tokens: tokens in the prompt.
        completion_tokens: tokens generated so far, this one included.
        cached_tokens: prompt tokens whose KV came from the prefix cache.
        logprobs: the token's logprobs when the request asked for them (None
            otherwise, and for the EOS / stop token id that ended the generation).
        stop_sequence: on a "stop" delta, the stop string that ended the generation (None: an EOS or
            stop token id, or a finished grammar).
    """

    text: str
    token_id: int
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    logprobs: TokenLogprobs | None = None
    stop_sequence: str | None = None


@attrs.frozen
class KVUsage:
    """The KV budget's state after the engine's last admission or step (read by /health and /metrics).

    Attributes:
        budget_bytes: the KV budget.
        reserved_bytes: reserved by the generations in the batch (each its prompt + max_tokens, in blocks).
        used_bytes: really held: the batch's caches plus the prefix cache's idle entries.
        prefix_bytes: held by idle prefix-cache entries (evicted first when a request needs room).
        waiting_for_kv: queued generations the batch had room for but the KV budget had not.
    """

    budget_bytes: int
    reserved_bytes: int = 0
    used_bytes: int = 0
    prefix_bytes: int = 0
    waiting_for_kv: int = 0
