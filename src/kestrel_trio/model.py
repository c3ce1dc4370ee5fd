"""The public model object: load a checkpoint folder, compute logits, generate.

This module joins the numpy model core with the text layer; it never imports trio.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import json
import logging
from pathlib import Path
from typing import Any, Callable, Generator, Literal, Sequence

import attrs
import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model import (
    Decoder, GgufFile, KVCache, ModelConfig, Qwen3VL, assemble_weights, check_folder_files, choose_small_batch_call,
    config_from_dict, config_from_gguf, feed_chunks, forward, gguf_architecture, is_gguf_file, is_qwen3_vl, linear,
    load_gguf_weights, load_qwen3_vl, load_qwen3_vl_gguf, load_weights, mmproj_image_fields,
    product_threads, random_tensors, read_config,
    resolve_residency, set_product_threads, UPCAST_CHUNK, PackedMatrix, default_cache_dir,
    describe_weights, packed_matrices, resident_bytes, warm_fused_products, PREFILL_PRECISIONS,
    defaults, prefill_precision, read_pooling, gguf_pooling, set_default_prefill_precision,
    set_default_products,
)
# What the engine names of the core it steps through this module (kestrel_trio.engine imports no _model module).
from kestrel_trio._model import BLOCK_TOKENS, KV_DTYPES, EmbeddingRun, PrefixCache, VLPrompt, mapped_bytes, normalize
from kestrel_trio.checked_model import CheckedModel, check_model, vl_gguf_pair
from kestrel_trio.text.images import ImageProcessorConfig, require_pillow
from kestrel_trio.text.videos import VideoProcessorConfig
from kestrel_trio.errors import BadRequestError, ContextLengthError, KestrelError, ModelLoadError
from kestrel_trio.hub import named_model_of_file
from kestrel_trio.text import ChatTemplate, Tokenizer, missing_template_error
from kestrel_trio.text.generation import DEFAULT_PREFILL_CHUNK, check_context

__all__ = ["Model", "load_model", "check_model", "CheckedModel", "check_model_folder", "check_context_cap",
           "check_draft_model", "is_qwen3_vl_folder", "is_vl_language_gguf", "set_blas_threads",
           "set_prefill_precision", "prefill_precision", "set_products", "load_demo_model", "DEMO_MODEL_ID",
           "DEFAULT_PREFILL_CHUNK", "ModelConfig", "PrefixCache", "EmbeddingRun", "BLOCK_TOKENS", "KV_DTYPES",
           "normalize"]

log = logging.getLogger(__name__)

WEIGHTS_CHOICES = ("auto", "fp32", "bf16", "int8", "int4", "gguf")  # load_model's weights=, --weights
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
        self.weights_mode = "fp32"  # how the matrices are held: one of WEIGHTS_CHOICES but auto (see load_model)
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
            products = _kernels.product_kernels(forms, self.decoder.backend.products)
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


@functools.cache
def _keep_freed_temporaries() -> None:
    """Have glibc's malloc keep freed multi-MiB temporaries for reuse (process-wide, once).

    A step's activations (a 256-row prefill chunk's are 1-6 MiB each) are
    allocated and freed hundreds of times a second. By default glibc maps
    each anew and unmaps it on free until a first large free raises its
    threshold, so every step pays page faults: a 128-token prefill ran at
    241 tok/s, against 295 once freed memory was reused. Elsewhere (no glibc)
    this does nothing.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # blocks up to 32 MiB come from the heap, and go back to it
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)  # free heap kept at the top before it is returned to the system


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def set_blas_threads(threads: int) -> None:
    """Run numpy's BLAS on ``threads`` threads, process-wide, and kestrel's own product threads on as many in the
    models loaded later without ``blas_threads`` (a model loaded before keeps its own).

    BLAS's threads compute single-row (decode) and many-row (prefill)
    products. A batched decode step's products are instead shared among
    kestrel's threads, each multiplying its own stretch of a weight with
    BLAS set to one thread meanwhile (kestrel_trio._model.products.matmul), which
    avoids the packing OpenBLAS does for a few rows. Needs threadpoolctl.

    Raises:
        ModelLoadError: ``threads`` < 1, or threadpoolctl is not installed.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ModelLoadError(f"blas_threads must be a positive integer, got {threads!r}")
    blas, _ = _blas_at_start()
    setter = _any_thread_setter(blas)
    set_product_threads(threads, setter)
    _threadpoolctl().threadpool_limits(limits=threads, user_api="blas")
    if setter is not None:
        setter(threads)  # from a worker thread threadpoolctl's call alone leaves OpenBLAS's count as it was


def set_products(mode: str) -> None:
    """Which products quantized GGUF weights take in models loaded later without ``load_model(products=...)``.

    A loaded model keeps the mode it was loaded with (its own :class:`kestrel_trio._model.Backend`), whatever
    is set later or given to another model's load.

    "integer": each step's activations quantized to int8 per block of 32 with a
    float32 scale, as llama.cpp's, and multiplied with the weights' int8 blocks
    in integer arithmetic (aarch64's ``sdot``, x86-64's ``vpdpbusd`` or AVX2): a decode step reads the
    weights' bytes instead of expanding every weight to float32, about a
    sixth of the instructions on a Cortex-A76 (docs/performance.md). The logits differ from
    the exact ones by the activations' rounding. "exact": every weight
    expanded to float32 and multiplied in float32 (the reference; what
    ``--exact-products`` asks for). "auto" (the default): integer where this
    CPU has integer kernels of its own (aarch64; x86-64 with AVX2 or better), exact elsewhere. The integer
    products cover Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; other forms stay exact.

    Raises:
        ModelLoadError: an unknown mode.
    """
    try:
        set_default_products(mode)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None


def set_prefill_precision(precision: str) -> None:
    """How prefill chunks multiply float32 weights in models loaded later without their own: "fp32" (the default)
    or "bf16". A loaded model keeps the precision it was loaded with (``load_model(prefill_precision=...)``).

    "bf16" rounds the activations and weights of every product of more than
    32 rows (prefill chunks, and a Qwen3-VL's vision tower) to bf16 and
    multiplies them in AMX tiles, float32 sums (kestrel_trio._kernels.x86.tiles):
    on the 2-core Xeon a 512-token Qwen3-0.6B prefill ran 1.7-1.85x faster
    with fp32 weights and 2.4x with bf16 ones (read in place), its logits
    within about 0.5% of the float32 ones. It needs a CPU with AMX (Intel
    Sapphire Rapids and later) and Linux. Decode steps, speculative verify
    steps (at most 32 rows) and int8, int4 and GGUF weights stay as they are.

    Raises:
        ModelLoadError: an unknown precision, or "bf16" where AMX cannot run (saying why).
    """
    try:
        set_default_prefill_precision(precision)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
    if precision != "fp32":
        log.info("prefill products: %s in AMX tiles (float32 sums)", precision)


def _threadpoolctl():
    try:
        import threadpoolctl
    except ImportError:
        raise ModelLoadError("blas_threads needs the threadpoolctl package (pip install threadpoolctl)") from None
    return threadpoolctl


@functools.cache  # one ctypes handle per controller, not one per call
def _any_thread_setter(blas: Any) -> Callable[[int], None] | None:
    """A setter of numpy's BLAS thread count that works from any thread, or None without one BLAS.

    OpenBLAS's ``openblas_set_num_threads`` (threadpoolctl's setter) changes
    nothing when called from a thread other than the main one (measured with
    OpenBLAS 0.3.31: the count stayed 2 after a call for 1), and the engine
    runs its steps in a worker thread. ``openblas_set_num_threads_local``
    (0.3.27 and later), despite its name, sets the process-wide count from
    any thread, so it is used where it exists.
    """
    if blas is None:
        return None
    if getattr(blas, "internal_api", None) == "openblas":
        try:
            local = ctypes.CDLL(blas.filepath).openblas_set_num_threads_local
        except (OSError, AttributeError):
            local = None
        if local is not None:
            local.argtypes, local.restype = [ctypes.c_int], ctypes.c_int

            def set_count(count: int) -> None:
                local(count)  # returns the count before, which is not needed here

            return set_count
    return blas.set_num_threads


@functools.cache
def _blas_at_start() -> tuple[Any, int]:
    """threadpoolctl's controller of numpy's BLAS (None unless exactly one), and its thread count, read once.

    Read before kestrel first changes the count, so the count is BLAS's own
    default: one per core unless the environment says otherwise.
    """
    blas = [lib for lib in _threadpoolctl().ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    return (blas[0] if len(blas) == 1 else None), max((lib.num_threads for lib in blas), default=1)


def _check_eos_ids(tokenizer: Tokenizer | None, vocab_size: int, where: str) -> None:
    """An end-of-sequence id outside the logits' rows would fail every generation (an IndexError): a load error."""
    bad = sorted(i for i in (tokenizer.eos_token_ids if tokenizer is not None else ()) if not 0 <= i < vocab_size)
    if bad:
        raise ModelLoadError(f"{where}: token id {bad[0]} is outside the vocabulary of {vocab_size} tokens")


def load_model(
    path: str | Path | CheckedModel,
    *,
    progress: Callable[[float], None] | None = None,
    blas_threads: int | None = None,
    weights: Literal["auto", "fp32", "bf16", "int8", "int4", "gguf"] = "auto",
    quantized_cache: str | Path | bool = True,
    prefill_precision: str | None = None,
    products: str | None = None,
    mmproj: str | Path | None = None,
) -> Model:
    """Load a Hugging Face checkpoint folder or a GGUF file.

    Args:
        path: a folder with config.json and safetensors weights (one file or
            shards with model.safetensors.index.json), and optionally
            tokenizer.json, tokenizer_config.json, generation_config.json and
            chat_template.jinja; or a GGUF file (llama.cpp's format, version 3;
            architectures llama, qwen2, qwen3, qwen3moe, qwen3vl; tensors F32, F16, BF16,
            Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), whose metadata
            carries the config, tokenizer and chat template; or either as
            :func:`check_model` checked it (not parsed again).
        progress: called with the fraction of weight bytes read (0 to 1).
        blas_threads: threads that share each of this model's weight products (None: the count
            already set, at first one per core), and numpy's BLAS count, process-wide (see
            :func:`set_blas_threads`). A model loaded before keeps its own product threads.
        weights: how weights stay in memory (docs/memory.md).
            "fp32": float32 copies (4 bytes a weight; the fastest decode at batch 1).
            "bf16": bf16 bits memory-mapped from the checkpoint (2 bytes; shared page
            cache, near-instant load), each matrix upcast a chunk at a time at use;
            fp32/fp16 checkpoints are rounded to bf16 once, with a logged warning.
            "int8" (1 byte; symmetric per output channel) and "int4" (0.53 bytes;
            symmetric per group of 64): a checkpoint folder quantized at load, and
            cached (``quantized_cache``). "gguf": a GGUF file's tensors as stored,
            memory-mapped, expanded bit for bit as ggml does, a chunk at a time, at use.
            "auto": for a folder, the first of fp32, bf16, int8, int4 whose weights
            fit 70% of the memory available; for a GGUF file, gguf. The choice is
            ``Model.weights_mode``, and logged.
        quantized_cache: where int8/int4 weights are cached, so that the next load
            maps them instead of quantizing: True for ``~/.cache/kestrel-trio/quantized``
            (``$XDG_CACHE_HOME`` if set), a folder, or False for no cache.
        prefill_precision: "fp32" or "bf16", this model's (see :func:`set_prefill_precision`;
            None: what that set, at first "fp32"). Another model's load never changes it.
        products: "auto", "exact" or "integer", this model's (see :func:`set_products`; None:
            what that set, at first "auto"). Another model's load never changes it.
        mmproj: the vision tower of a Qwen3-VL language-model GGUF (``path``, architecture
            ``qwen3vl``): llama.cpp's ``mmproj`` GGUF file (projector ``qwen3vl_merger``; tensors
            F32, F16, BF16 or Q8_0, as stored, under ``weights`` as the language model's). Without
            it such a file serves text only.

    Raises:
        ModelLoadError: naming the file, field or tensor at fault; ``mmproj`` with a folder, or an
            mmproj file that does not fit the language model.
        KestrelError: ``path`` was checked for other ``weights``.
    """
    checked = path if isinstance(path, CheckedModel) else None
    residency = checked.residency_for(weights) if checked is not None else None  # None: resolved below
    if blas_threads is not None:
        set_blas_threads(blas_threads)  # before reading: a bad value fails fast
    elif product_threads() is None:
        set_blas_threads(_blas_at_start()[1])  # the first load: BLAS's own count (one per core), before it changes
    backend = _backend(products, prefill_precision)  # before reading: a bad value fails fast
    with backend.active():  # the decoder built below holds it; the load's warm-up runs in it
        return _load(path, checked, residency, progress, weights, quantized_cache, mmproj)


def _backend(products: str | None, precision: str | None):
    """The kernel settings of a model being loaded: its arguments', else the defaults set (product threads too)."""
    try:
        backend = defaults().for_model(products, precision)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
    if backend.prefill_precision != "fp32":
        log.info("prefill products: %s in AMX tiles (float32 sums)", backend.prefill_precision)
    return backend


def _load(path: str | Path | CheckedModel, checked: CheckedModel | None, residency: str | None,
          progress: Callable[[float], None] | None, weights: str, quantized_cache: str | Path | bool,
          mmproj: str | Path | None) -> Model:
    folder = checked.path if checked is not None else Path(path)
    cache = _cache_dir(quantized_cache)
    mmproj = mmproj if mmproj is not None else (checked.mmproj if checked is not None else None)
    if mmproj is not None:
        return _load_qwen3_vl_gguf_model(folder, Path(mmproj), progress, weights)
    if (checked is not None and checked.gguf is not None) or (checked is None and folder.is_file()):
        return _load_gguf_model(folder, progress, weights, residency, checked)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: not a checkpoint folder or GGUF file")
    check_folder_files(folder)  # before any file is read: none may be a symlink out of the folder
    if checked.vision if checked is not None else is_qwen3_vl_folder(folder):
        return _load_qwen3_vl_model(folder, progress, weights, residency, cache)
    config = checked.config if checked is not None else read_config(folder)
    residency = residency or resolve_residency(folder, weights)
    decoder = Decoder.build(config, load_weights(folder, config, progress, residency, quantized_cache=cache))
    tokenizer = Tokenizer.from_folder(folder) if (folder / "tokenizer.json").is_file() else None
    if tokenizer is not None and tokenizer.vocab_size > decoder.config.vocab_size:
        raise ModelLoadError(
            f"{folder}: tokenizer.json has {tokenizer.vocab_size} tokens but config.json's vocab_size is "
            f"{decoder.config.vocab_size}"
        )
    _check_eos_ids(tokenizer, decoder.config.vocab_size, f"{folder}: generation_config.json's eos_token_id")
    model = Model(decoder, name=folder.resolve().name, path=folder, tokenizer=tokenizer)
    model.pooling = read_pooling(folder)
    model.embedding_checkpoint = (folder / "modules.json").is_file()
    return _ready(model, residency)


def _cache_dir(quantized_cache: str | Path | bool) -> Path | None:
    if quantized_cache is True:
        return default_cache_dir()
    if quantized_cache is False or quantized_cache is None:
        return None
    return Path(quantized_cache)


def _ready(model: Model, residency: str) -> Model:
    """Record and log how the weights are held, and choose the small-batch call."""
    model.weights_mode = residency
    log.info("%s: weights in memory as %s: %s", model.name, residency, describe_weights(model.decoder.weights))
    model.prepare_products()
    report = model.kernel_report()
    log.info("%s: product kernels (%s): %s; CPU: %s", model.name, _kernels.describe(),
             ", ".join(f"{form} {kernel}" for form, kernel in report["products"].items()), report["cpu"])
    return model


def _load_gguf_model(path: Path, progress: Callable[[float], None] | None, weights: str, residency: str | None,
                     checked: CheckedModel | None) -> Model:
    """A GGUF file: config, tokenizer and chat template from its metadata; its tensors mapped (or expanded).

    ``checked``: the file as :func:`check_model` parsed it (None: parsed here); ``residency``: ``weights`` as the
    check resolved it (None: resolved here)."""
    gguf = checked.gguf if checked is not None else GgufFile(path)
    architecture = gguf_architecture(gguf)
    config = checked.config if checked is not None else config_from_gguf(gguf)
    residency = residency or resolve_residency(None, weights, gguf=True)
    # The tokenizer first: a file it cannot serve fails before the weights are assembled.
    if architecture == "qwen3vl":
        log.warning("%s: a Qwen3-VL language model without its mmproj file serves text only (images need "
                    "load_model's mmproj, --mmproj)", path.name)
    tokenizer = Tokenizer.from_gguf(gguf.metadata, path.name) if "tokenizer.ggml.tokens" in gguf.metadata else None
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(f"{path.name}: the GGUF tokenizer has {tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {config.vocab_size}")
    _check_eos_ids(tokenizer, config.vocab_size, f"{path.name}: tokenizer.ggml.eos_token_id")
    decoder = Decoder.build(config, load_gguf_weights(gguf, config, architecture, progress, residency))
    named = named_model_of_file(path)
    model = Model(decoder, name=path.name.removesuffix(".gguf"), path=path, tokenizer=tokenizer,
                  sampling_defaults=named.sampling_defaults if named is not None else None)
    model.pooling = gguf_pooling(gguf.metadata, architecture)
    model.embedding_checkpoint = bool(gguf.metadata.get(f"{architecture}.pooling_type"))
    return _ready(model, residency)


def check_model_folder(path: str | Path, *, weights: str | None = None, mmproj: str | Path | None = None
                       ) -> ModelConfig:
    """Check, in milliseconds, what :func:`load_model` would refuse first: the folder and its config.json.

    Reads config.json with the loader's own readers (so a field the loader
    refuses is refused here with the same message) and no weights; run it
    before anything slow or visible, e.g. binding a port. A ``.gguf`` file gets
    the same check of its header, metadata and tensor table (memory-mapped,
    nothing expanded).

    Args:
        path: the checkpoint folder or GGUF file.
        weights: load_model's ``weights``, checked against the kind of model
            (int8/int4 need a folder, gguf a GGUF file); None: not checked.
        mmproj: load_model's ``mmproj``: both headers are read and checked to fit
            each other (no tensor is read).

    Returns:
        The configuration of the language model the loader would build (of a
        Qwen3-VL checkpoint: its text model), for further checks against it.

    Raises:
        ModelLoadError: ``path`` is neither a folder nor a GGUF file, or its
            config.json is missing, unreadable, not JSON, or names a field or
            architecture the loader refuses (for a GGUF file: its header or
            metadata), or ``weights`` does not apply to it.

    :func:`check_model` checks the same and keeps what it parsed, for the load.
    """
    return check_model(path, weights=weights, mmproj=mmproj).config


def check_context_cap(model: Model | CheckedModel | str | Path | None, max_model_len: int | None, *,
                      config: ModelConfig | None = None) -> None:
    """Refuse a context cap (``max_model_len``, tokens) longer than the model's context, from its config alone.

    What :meth:`Model.with_context_length` would refuse once the weights are
    loaded, checked in milliseconds before (no weights read), so a server
    fails before it binds, loads or compiles anything.

    Args:
        model: a loaded Model, a checked model, a checkpoint folder or GGUF file, or None for the built-in demo
            model.
        max_model_len: the cap; None: none asked for, nothing to check.
        config: the configuration :func:`check_model_folder` returned for ``model``
            (None: read it again).

    Raises:
        KestrelError: ``max_model_len`` is below 1 or above the model's context.
    """
    if max_model_len is None:
        return
    if isinstance(model, Model):
        model.with_context_length(max_model_len)
        return
    if model is None:
        context, name = DEMO_CONFIG["max_position_embeddings"], DEMO_MODEL_ID
    elif isinstance(model, CheckedModel):
        context, name = model.config.max_position_embeddings, model.name
    else:
        path = Path(model)
        context = (config or check_model_folder(path)).max_position_embeddings
        name = path.name.removesuffix(".gguf") if path.is_file() else path.resolve().name  # as load_model names it
    _check_context_cap(max_model_len, context, name)


def _check_context_cap(max_model_len: int, context: int, name: str) -> None:
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise KestrelError(f"max_model_len must be a positive number of tokens, got {max_model_len!r}")
    if max_model_len > context:
        raise KestrelError(f"max_model_len {max_model_len} exceeds the model's context length of {context} "
                           f"tokens (max_position_embeddings of {name})")


def check_draft_model(target: Model | CheckedModel | str | Path | None, draft: Model | CheckedModel | str | Path
                      ) -> None:
    """Check that ``draft`` can draft for ``target`` (speculative decoding): the same vocabulary, id for id.

    Reads only the tokenizers (a folder's tokenizer.json, a GGUF file's metadata: a checked GGUF file's as
    parsed), so it runs before any weights load.

    Args:
        target: the served model, its checked model or checkpoint path, or None for the built-in demo model.
        draft: the draft model, its checked model or its checkpoint path.

    Raises:
        ModelLoadError: either has no tokenizer, or their vocabularies differ (the message says where).
    """
    ours, theirs = _vocabulary_of(target), _vocabulary_of(draft)
    name = draft.name if isinstance(draft, Model) else _path_of(draft).name
    if len(ours) != len(theirs):
        raise ModelLoadError(f"draft model {name}: its tokenizer has {len(theirs)} tokens, the served model's "
                             f"{len(ours)}: a draft model must share the served model's vocabulary")
    differ = sorted(token_id for token, token_id in theirs.items() if ours.get(token) != token_id)
    if differ:
        first = differ[0]
        raise ModelLoadError(f"draft model {name}: {len(differ)} token ids differ from the served model's "
                             f"vocabulary (the first: id {first}): a draft model must share its tokenizer")


def _path_of(model: CheckedModel | str | Path) -> Path:
    return model.path if isinstance(model, CheckedModel) else Path(model)


def _vocabulary_of(model: Model | CheckedModel | str | Path | None) -> dict[str, int]:
    """A model's vocabulary (entry -> id) from its tokenizer alone; ModelLoadError when it has none."""
    if model is None:
        return Tokenizer.from_demo().vocabulary()
    if isinstance(model, Model):
        tokenizer = model.tokenizer
    else:
        path = _path_of(model)
        if path.is_file():
            gguf = model.gguf if isinstance(model, CheckedModel) and model.gguf is not None else GgufFile(path)
            metadata = gguf.metadata
            tokenizer = Tokenizer.from_gguf(metadata, path.name) if "tokenizer.ggml.tokens" in metadata else None
        else:
            tokenizer = Tokenizer.from_folder(path) if (path / "tokenizer.json").is_file() else None
    if tokenizer is None:
        name = model.name if isinstance(model, Model) else _path_of(model).name
        raise ModelLoadError(f"{name} has no tokenizer: a draft model and the served model must both have one, "
                             "to check that they share a vocabulary")
    return tokenizer.vocabulary()


def is_qwen3_vl_folder(folder: Path) -> bool:
    """Whether ``folder/config.json`` names Qwen3-VL (False when it is missing or unreadable)."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # read_config reports what is wrong with the file
    return isinstance(raw, dict) and is_qwen3_vl(raw)


def _load_qwen3_vl_model(folder: Path, progress: Callable[[float], None] | None, weights: str,
                         residency: str | None, cache: Path | None) -> Model:
    """A Qwen3-VL checkpoint: its language model serves text as Qwen3 does; ``vision`` adds images."""
    try:
        require_pillow()  # now, not at the first image request
    except KestrelError as exc:
        raise ModelLoadError(f"{folder}: a Qwen3-VL checkpoint needs Pillow: {exc.message}") from None
    image_config = ImageProcessorConfig.read(folder)
    video_config = VideoProcessorConfig.read(folder)
    residency = residency or resolve_residency(folder, weights)  # None: not resolved by a check
    vl = load_qwen3_vl(folder, progress, residency, quantized_cache=cache)
    v = vl.config.vision
    for name, ours, theirs in (("patch_size", image_config.patch_size, v.patch_size),
                               ("merge_size", image_config.merge_size, v.spatial_merge_size),
                               ("temporal_patch_size", image_config.temporal_patch_size, v.temporal_patch_size),
                               ("video patch_size", video_config.pixels.patch_size, v.patch_size),
                               ("video merge_size", video_config.pixels.merge_size, v.spatial_merge_size),
                               ("video temporal_patch_size", video_config.pixels.temporal_patch_size,
                                v.temporal_patch_size)):
        if ours != theirs:
            raise ModelLoadError(
                f"{folder}: preprocessor_config.json {name} {ours} differs from config.json's {theirs}")
    tokenizer = Tokenizer.from_folder(folder) if (folder / "tokenizer.json").is_file() else None
    if tokenizer is not None and tokenizer.vocab_size > vl.config.text.vocab_size:
        raise ModelLoadError(f"{folder}: tokenizer.json has {tokenizer.vocab_size} tokens but text_config's "
                             f"vocab_size is {vl.config.text.vocab_size}")
    model = Model(vl.decoder, name=folder.resolve().name, path=folder, tokenizer=tokenizer)
    model.vision, model.image_config, model.video_config = vl, image_config, video_config
    return _ready(model, residency)


def is_vl_language_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF file of a Qwen3-VL language model (architecture ``qwen3vl``), which an
    mmproj file completes; reads the header only."""
    path = Path(path)
    return path.is_file() and is_gguf_file(path) and GgufFile(path).metadata.get("general.architecture") == "qwen3vl"


def _load_qwen3_vl_gguf_model(path: Path, mmproj: Path, progress: Callable[[float], None] | None,
                              weights: str) -> Model:
    """A Qwen3-VL language-model GGUF with its mmproj GGUF: tokenizer and template from the former."""
    try:
        require_pillow()  # now, not at the first image request
    except KestrelError as exc:
        raise ModelLoadError(f"{path.name}: Qwen3-VL needs Pillow: {exc.message}") from None
    lm, tower = vl_gguf_pair(path, mmproj)
    image_config = ImageProcessorConfig.from_dict(mmproj_image_fields(tower),
                                                  source=f"{mmproj.name} (mmproj metadata)")
    # The file holds no video settings: the image fields over Qwen3VLVideoProcessor's defaults, as transformers
    # reads a folder without video_preprocessor_config.json.
    video_config = VideoProcessorConfig.from_dict(mmproj_image_fields(tower),
                                                  source=f"{mmproj.name} (mmproj metadata)")
    residency = resolve_residency(None, weights, gguf=True)
    tokenizer = Tokenizer.from_gguf(lm.metadata, path.name) if "tokenizer.ggml.tokens" in lm.metadata else None
    vl = load_qwen3_vl_gguf(path, mmproj, progress, residency)
    if tokenizer is not None and tokenizer.vocab_size > vl.config.text.vocab_size:
        raise ModelLoadError(f"{path.name}: the GGUF tokenizer has {tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {vl.config.text.vocab_size}")
    _check_eos_ids(tokenizer, vl.config.text.vocab_size, f"{path.name}: tokenizer.ggml.eos_token_id")
    named = named_model_of_file(path)
    model = Model(vl.decoder, name=path.name.removesuffix(".gguf"), path=path, tokenizer=tokenizer,
                  sampling_defaults=named.sampling_defaults if named is not None else None)
    model.vision, model.image_config, model.video_config = vl, image_config, video_config
    return _ready(model, residency)


def load_demo_model(seed: int = 0) -> Model:
    """The built-in demo: a tiny Qwen3 with seeded random weights and the real Qwen3 tokenizer.

    Its text is meaningless; it exists so that every command works on a fresh
    machine with no checkpoint, through the whole real code path.
    """
    config = config_from_dict(DEMO_CONFIG, source="built-in demo config")
    tensors = random_tensors(config, seed)
    for array in tensors.values():
        array.flags.writeable = False
    weights = assemble_weights(config, tensors.__getitem__, set(tensors))
    return Model(Decoder.build(config, weights), name=DEMO_MODEL_ID, tokenizer=Tokenizer.from_demo())
