"""The public Model: a loaded checkpoint's decoder joined with its tokenizer, chat template and vision tower.

What callers ask of a loaded model lives here: tokens in and out, logits, generation steps (the engine's seam:
batched steps, image prompts, embeddings, KV sizes), and the warm-up of its products. How a model is loaded is
:mod:`kestrel_trio.model.loading`'s; the process-wide settings it is built with, :mod:`kestrel_trio.model.settings`'s.
This module never imports trio.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Generator, Sequence

import attrs
import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model import (
    Decoder, EmbeddingRun, KVCache, ModelConfig, PackedMatrix, Qwen3VL, UPCAST_CHUNK, VLPrompt, choose_small_batch_call,
    defaults, feed_chunks, forward, linear, mapped_bytes, packed_matrices, product_threads, resident_bytes,
    warm_fused_products,
)
from kestrel_trio.errors import BadRequestError, ContextLengthError, KestrelError
from kestrel_trio.model.settings import _blas_at_start, _keep_freed_temporaries, set_blas_threads
from kestrel_trio.text import ChatTemplate, Tokenizer, missing_template_error
from kestrel_trio.text.context_length import check_context
from kestrel_trio.text.generation import DEFAULT_PREFILL_CHUNK
from kestrel_trio.text.media.images import ImageProcessorConfig
from kestrel_trio.text.media.videos import VideoProcessorConfig

__all__ = ["Model", "DEMO_MODEL_ID", "DEMO_CONFIG"]

DEMO_MODEL_ID = "kestrel-demo-random"
# A tiny Qwen3 with the real Qwen3 vocabulary: big enough to exercise every code path, small enough to build in
# well under a second. Its weights are seeded noise, so its text is meaningless.
DEMO_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000.0,
}


_SAMPLE_LAYERS = 4  # decoder layers whose products time the small-batch calls (prepare_products)


class Model:
    """A loaded Qwen model.

    Args:
        decoder: the numpy decoder (config, weights, rotary tables).
        name: the model id reported to clients.
        path: the checkpoint folder, if any.
        tokenizer: the checkpoint's tokenizer, if any.
        blas_threads: threads that share each of this model's weight products, and numpy's BLAS count,
            process-wide (see :func:`set_blas_threads`); None keeps the decoder's own, and at first sets BLAS's
            own default (one per core) for the models loaded later.
        sampling_defaults: sampling defaults for a checkpoint that carries none in its files
            (a named model's publisher's, see :attr:`generation_defaults`).
    """

    def __init__(
        self, decoder: Decoder, *, name: str, path: Path | None = None, tokenizer: Tokenizer | None = None,
        blas_threads: int | None = None, sampling_defaults: dict[str, Any] | None = None,
    ) -> None:
        if blas_threads is not None or product_threads() is None:  # given, or the process's first model
            set_blas_threads(blas_threads if blas_threads is not None else _blas_at_start()[1])
            given = defaults()  # the pool just made: this model's own product threads
            decoder = attrs.evolve(decoder, backend=attrs.evolve(decoder.backend, threads=given.threads,
                                                                 thread_count=given.thread_count))
        _keep_freed_temporaries()
        self.decoder = decoder
        self.weights_mode = "fp32"  # how the matrices are held: one of loading.WEIGHTS_CHOICES but auto
        self.name = name
        self.path = path
        self.tokenizer = tokenizer
        self._sampling_defaults = dict(sampling_defaults or {})
        self.vision: Qwen3VL | None = None  # a Qwen3-VL's whole model; None for text-only checkpoints
        self.image_config: ImageProcessorConfig | None = None  # its preprocessor_config.json
        self.video_config: VideoProcessorConfig | None = None  # its video_preprocessor_config.json (or the above)
        self._template: ChatTemplate | None = None
        self._max_model_len: int | None = None  # a serving cap below the checkpoint's context (with_context_length)
        self._kernels: dict | None = None  # kernel_report's, made once
        self.pooling = "last"  # how an embedding pools the final hidden states (read_pooling; set at load)
        self.embedding_checkpoint = False  # its files declare a pooling (an embedding model such as Qwen3-Embedding)
        if tokenizer is not None and tokenizer.chat_template is not None:
            self._template = ChatTemplate(tokenizer.chat_template, special_tokens=tokenizer.special_tokens_map)

    def kernel_report(self) -> dict:
        """Which kernel each storage form of this model's matrices takes in this process, and the CPU they were
        chosen for: ``{"cpu": "cortex-a76 dotprod fp16 neon", "products": {"Q8_0": "portable", ...}}`` (the
        start-up log, /health; kestrel_trio._kernels.product_kernels names the kernels). float32 matrices are "F32"."""
        if self._kernels is None:
            forms = set(resident_bytes(self.decoder.weights))
            if self.vision is not None:
                forms |= {part.form for matrix in packed_matrices(self.vision.vision) for part in matrix.parts}
            forms = {"F32" if form == "float32" else form for form in forms}
            products = self.decoder.backend.product_kernels(forms)  # by the model's own plan
            self._kernels = {"cpu": _kernels.describe_cpu(), "products": products}
        return self._kernels

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """The model's own sampling defaults, for ``SamplingParams.with_defaults``.

        A checkpoint folder's generation_config.json (``temperature``, ``top_p``, ``top_k``, ``min_p``,
        ``repetition_penalty``, ``do_sample``); for a named model's GGUF, which has none, its
        publisher's recommendation (``kestrel_trio.hub.NAMED_MODELS``); else none.
        """
        own = self.tokenizer.generation_defaults if self.tokenizer is not None else {}
        return {**self._sampling_defaults, **own}

    @property
    def is_demo(self) -> bool:
        """Whether this is the built-in random-weight demo model."""
        return self.name == DEMO_MODEL_ID

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or KestrelError when the checkpoint has none."""
        if self.tokenizer is None:
            where = "tokenizer metadata in its GGUF file" if self.path is not None and self.path.is_file() else "tokenizer.json"
            raise KestrelError(f"model {self.name!r} has no {where}, so it only takes token ids")
        return self.tokenizer

    def require_vision(self, param: str) -> Qwen3VL:
        """The vision model, or the one refusal of images sent to a model that takes none (400 naming ``param``)."""
        if self.vision is None or self.image_config is None:
            raise BadRequestError(f"'{param}': model {self.name!r} does not accept images", param=param)
        return self.vision

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.require_tokenizer().encode(text)

    def encode_prompt(self, text: str, *, param: str) -> list[int]:
        """Token ids of a prompt, or ContextLengthError (naming ``param``) when it has more tokens than the context.

        A prompt that fits is checked with its max_tokens where the generation is admitted (the engine).
        """
        ids, total = self.require_tokenizer().encode_bounded(text, self.context_length)
        if ids is None:  # too long for any max_tokens: refused before a list of its ids is built
            check_context(total, None, self.context_length, param=param)  # raises
        return ids

    def encode_for_embedding(self, text: str, *, param: str) -> list[int]:
        """Token ids of a text to embed (the tokenizer's special tokens added, as sentence-transformers does).

        Raises:
            BadRequestError: ``text`` encodes to no tokens.
            ContextLengthError: more tokens than the context (naming ``param``).
        """
        ids = self.require_tokenizer().encode_with_specials(text)
        if not ids:
            raise BadRequestError(f"'{param}' encodes to no tokens (an empty string cannot be embedded)", param=param)
        if len(ids) > self.context_length:
            raise ContextLengthError(f"'{param}' is {len(ids)} tokens, more than the {self.context_name} of "
                                     f"{self.context_length} tokens", param=param)
        return ids

    def encode_within_context(self, text: str, *, param: str) -> list[int]:
        """Token ids of ``text`` (``/tokenize``), or ContextLengthError when it has more than the context's tokens.

        The cap bounds the work and memory of one call: a text far over it is refused from its length, or
        after a few pieces, before all its tokens exist (:meth:`Tokenizer.encode_bounded`).
        """
        ids, total = self.require_tokenizer().encode_bounded(text, self.context_length)
        if ids is None:
            raise ContextLengthError(f"'{param}' is at least {total} tokens, more than the {self.context_name} of "
                                     f"{self.context_length} tokens that /tokenize counts", param=param)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.require_tokenizer().decode(ids)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def check_chat_template_kwargs(self, names: Sequence[str], param: str = "chat_template_kwargs") -> None:
        """Refuse extra template variables the chat template never reads (BadRequestError naming the first).

        Raises:
            BadRequestError: no template, or a variable it does not read.
        """
        if names:
            if self._template is None:
                raise missing_template_error()
            self._template.check_kwargs(names, param)

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None,
        **template_kwargs: object,
    ) -> str:
        """Render ``messages`` with the checkpoint's own chat template, as transformers does.

        Args:
            messages: OpenAI-style chat messages.
            add_generation_prompt: open an assistant turn at the end.
            tools: OpenAI-style tool schemas.
            **template_kwargs: template variables, e.g. ``enable_thinking=False``.

        Raises:
            BadRequestError: no template, or the template rejects the messages.
        """
        if self._template is None:
            raise missing_template_error()
        return self._template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **template_kwargs)

    @property
    def config(self) -> ModelConfig:
        """The checkpoint's configuration."""
        return self.decoder.config

    @property
    def context_length(self) -> int:
        """The longest sequence (prompt plus generated tokens) the model accepts, or is served with."""
        if self._max_model_len is not None:
            return self._max_model_len
        return self.decoder.config.max_position_embeddings

    @property
    def context_name(self) -> str:
        """How error messages name ``context_length``: the model's own, or the server's cap."""
        return "model's context length" if self._max_model_len is None else "server's context cap (max_model_len)"

    def with_context_length(self, max_model_len: int) -> "Model":
        """This model served with a context cap: a view sharing everything but ``context_length``.

        Every context check (``encode_prompt``, ``check_token_ids``, ``greedy``,
        the engine's admission) then uses the cap. The model itself is unchanged.

        Raises:
            KestrelError: ``max_model_len`` is below 1 or above the checkpoint's context.
        """
        _check_context_cap(max_model_len, self.decoder.config.max_position_embeddings, self.name)
        view = copy.copy(self)
        view._max_model_len = max_model_len
        return view

    def new_cache(self, dtype: str = "fp32", max_tokens: int | None = None) -> KVCache:
        """An empty KV cache for one sequence.

        Args:
            dtype: storage, "fp32", "bf16" or "fp16" (half the bytes; attention computes in float32).
            max_tokens: the most tokens it may hold; it grows as needed up to it (None: no cap).
        """
        return self.decoder.new_cache(dtype, max_tokens)

    def check_token_ids(self, token_ids: Sequence[int], *, param: str = "token_ids") -> np.ndarray:
        """``token_ids`` as an int64 array, or BadRequestError naming what is wrong."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        if ids.ndim != 1 or ids.size == 0:
            raise BadRequestError(f"'{param}' must be a non-empty list of token ids", param=param)
        self._in_vocabulary(ids, param)
        if ids.size > self.context_length:
            raise ContextLengthError(
                f"{ids.size} tokens exceed the {self.context_name} of {self.context_length}", param=param
            )
        return ids

    def _in_vocabulary(self, token_ids: Sequence[int] | np.ndarray, param: str = "token_ids") -> np.ndarray:
        """``token_ids`` as an int64 array [T], or BadRequestError where one is outside the vocabulary (a step or a
        prefill takes ids from a caller that may not have checked them: check_token_ids also bounds the count)."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        vocab = self.config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise BadRequestError(f"'{param}' has token ids outside 0..{vocab - 1}", param=param)
        return ids

    def step(self, cache: KVCache, token_ids: Sequence[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Feed new tokens of one sequence through the model, extending ``cache``.

        Args:
            cache: the sequence's KV cache (its length is the position of the first new token).
            token_ids: [T] the new tokens.
            all_logits: return logits for every new token, not only the last.

        Returns:
            float32 logits, [T, vocab] if ``all_logits`` else [vocab].
        """
        ids = self._in_vocabulary(token_ids)  # [T]
        positions = np.arange(cache.length, cache.length + ids.size, dtype=np.int64)  # [T]
        logits = forward(self.decoder, ids, positions, [cache], [ids.size], all_logits=all_logits)
        return logits if all_logits else logits[0]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Full-sequence logits, float32 [len(token_ids), vocab_size], in one forward pass."""
        ids = self.check_token_ids(token_ids)
        return self.step(self.new_cache(), ids, all_logits=True)

    # The engine's seam: what its batched step, its embeddings and its KV budget ask of the model.

    def step_batch(self, token_ids: np.ndarray, positions: np.ndarray, caches: Sequence[KVCache],
                   lengths: Sequence[int], *, wanted: Sequence[bool] | None = None,
                   all_logits: bool = False) -> np.ndarray:
        """Feed new tokens of several sequences in one forward pass, extending each sequence's cache.

        Args:
            token_ids: [N] int64, every sequence's new tokens end to end.
            positions: [N] int64, each token's position in its own sequence.
            caches: one KV cache per sequence, each extended by its tokens.
            lengths: new tokens per sequence, in order; they sum to N.
            wanted: per sequence, whether its last row's logits are returned (a prompt chunk before the
                last needs none); None: every sequence's. Ignored with ``all_logits``.
            all_logits: return the logits of every row.

        Returns:
            float32 logits, [N, vocab] with ``all_logits``, else one row per wanted sequence.
        """
        return forward(self.decoder, token_ids, positions, caches, lengths, all_logits=all_logits, wanted=wanted)

    def image_prompt_steps(self, token_ids: np.ndarray, pixel_values: np.ndarray | None, grid_thw: np.ndarray | None,
                           pixel_values_videos: np.ndarray | None = None,
                           video_grid_thw: np.ndarray | None = None) -> Generator[None, None, VLPrompt]:
        """Encode a prompt's images and videos one vision block per ``next()``; the generator returns its rows.

        Args:
            token_ids: [T] int64, the prompt with each image's ``<|image_pad|>`` (each video's ``<|video_pad|>``)
                run expanded.
            pixel_values: [n_patches, C*T*P*P] float32, every image's patches in order (None: no images).
            grid_thw: [n_images, 3] int64, each image's (temporal, height, width) patch grid (None: no images).
            pixel_values_videos: [n_patches, C*T*P*P] float32, every video's patches in order (None: no videos).
            video_grid_thw: [n_videos, 3] int64, each video's (temporal, height, width) patch grid.

        Raises:
            ValueError: the model has no vision tower.
        """
        return self._vision_tower().prepare_steps(token_ids, pixel_values, grid_thw, pixel_values_videos, video_grid_thw)

    def prefill_image_rows(self, cache: KVCache, prompt: VLPrompt, start: int, end: int) -> np.ndarray:
        """Feed rows ``start:end`` of an image prompt (the cache holds exactly ``start`` tokens).

        Returns:
            float32 logits of the last row, [vocab].
        """
        return self._vision_tower().prefill(cache, prompt, start, end)

    def _vision_tower(self) -> Qwen3VL:
        """The vision tower, or ValueError where a generation with images met a model without one."""
        if self.vision is None:
            raise ValueError("a generation has images but the model has no vision tower")
        return self.vision

    def embedding_run(self, inputs: Sequence[Sequence[int]], chunk: int,
                      new_cache: Callable[[int], KVCache]) -> EmbeddingRun:
        """The embeddings of ``inputs`` (token ids each), pooled as this model pools, ``chunk`` tokens a step.

        Args:
            inputs: each text's token ids (non-empty, within the context).
            chunk: tokens per forward pass.
            new_cache: makes one input's KV cache of at most the given number of tokens.
        """
        return EmbeddingRun(inputs, self.pooling, chunk, new_cache)

    def step_embeddings(self, run: EmbeddingRun) -> bool:
        """Feed ``run``'s next chunk; True once every input has its vector."""
        return run.step(self.decoder)

    def kv_token_bytes(self, dtype: str = "fp32") -> int:
        """Bytes one token's keys and values take in a KV cache of ``dtype`` (all layers)."""
        return self.decoder.kv_token_bytes(dtype)

    def mapped_weight_bytes(self) -> int:
        """Bytes of the weights read from the checkpoint file through a memory map (not copied into memory)."""
        return mapped_bytes(self.decoder.weights)

    def prepare_products(self) -> None:
        """Choose how products of 2-32 rows run, now rather than in the first batched step.

        Timed once per process (a few tenths of a second) on a sample of this
        model's own float32 projections in a decode step's proportions: the
        first four layers' and the same share of lm_head's rows. A model whose
        matrices are packed (bf16, int8, int4, a GGUF's blocks) multiplies
        chunks just expanded, hot in cache: the sample is then such chunks,
        one of each of the first layer's matrices (milliseconds, a few MiB). Then one
        prefill-sized product in BLAS, so BLAS's threads have their work buffers, and one
        through ``linear``, which compiles or loads the float32 chunk kernel where it runs.

        Packed matrices' fused products are compiled first (or loaded from
        numba's cache: milliseconds; a first compilation takes seconds), so
        that no request waits for one.
        """
        with self.decoder.backend.active():  # the small-batch call is this model's own, timed on its threads
            self._prepare_products()

    def _prepare_products(self) -> None:
        w = self.decoder.weights
        matrices = packed_matrices(w) + (packed_matrices(self.vision.vision) if self.vision else [])
        warm_fused_products(matrices, self.decoder.backend.products)
        layers = w.layers[:_SAMPLE_LAYERS]
        sample = [m for layer in layers for m in (layer.attn.qkv_proj, layer.attn.o_proj,
                                                 getattr(layer.mlp, "gate_up_proj", None),
                                                 getattr(layer.mlp, "down_proj", None))]
        if isinstance(w.lm_head, np.ndarray):
            sample.append(w.lm_head[: -(-w.lm_head.shape[0] * len(layers) // len(w.layers))])  # [rows, hidden]
        floats = [m for m in sample if isinstance(m, np.ndarray)]
        if not floats:
            packed = [m for m in sample[:4] if isinstance(m, PackedMatrix)]
            floats = [m.rows(np.arange(min(m.shape[0], max(1, UPCAST_CHUNK // m.shape[1])))) for m in packed]
        choose_small_batch_call(floats)
        if floats:
            # One prefill-sized product, so every BLAS thread takes its work buffer now: OpenBLAS ends the
            # process when it cannot get one later (under an address-space limit), where numpy's own arrays
            # raise a MemoryError the engine contains.
            weight = floats[0]  # [out, in]
            x = np.zeros((DEFAULT_PREFILL_CHUNK, weight.shape[1]), dtype=np.float32)  # [chunk, in]
            np.matmul(x, weight.T)  # [chunk, out]: BLAS itself, where linear may take kestrel's chunk kernel
            linear(x, weight)  # [chunk, out]: the chunk kernel compiled or loaded now where it runs
        self.kernel_report()  # made here, off the event loop (engines run this in a thread): /health only reads it

    def prefill(self, cache: KVCache, token_ids: Sequence[int], chunk: int = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
        """Feed a prompt in chunks of ``chunk`` tokens; the last position's logits [vocab].

        The chunks before the last return no logits, so their last layer runs for their keys and values only.
        """
        return feed_chunks(self.decoder, cache, self._in_vocabulary(token_ids), chunk)  # [vocab]

    def greedy(self, token_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation: prefill, then one decode step per token, through the KV cache.

        Stops only at ``max_new_tokens`` (end-of-sequence tokens are not special here).
        """
        ids = self.check_token_ids(token_ids)
        if ids.size + max_new_tokens > self.context_length:
            raise ContextLengthError(
                f"{ids.size} prompt tokens + {max_new_tokens} new tokens exceed the context length {self.context_length}",
                param="max_new_tokens",
            )
        cache = self.new_cache()
        logits = self.prefill(cache, ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) < max_new_tokens:
                logits = self.step(cache, [token])
        return out


def _check_context_cap(max_model_len: int, context: int, name: str) -> None:
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise KestrelError(f"max_model_len must be a positive number of tokens, got {max_model_len!r}")
    if max_model_len > context:
        raise KestrelError(f"max_model_len {max_model_len} exceeds the model's context length of {context} "
                           f"tokens (max_position_embeddings of {name})")
