"""Loading a model: a checkpoint folder, a GGUF file (with a Qwen3-VL mmproj file), or the built-in demo.

:func:`load_model` builds the model's backend (its products and prefill precision) before anything is read, so a
bad value fails fast; then reads the configuration, tokenizer and weights in the form asked for (``weights``),
checks that they fit one another, and warms the products (:meth:`Model.prepare_products`). This module never
imports trio.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Literal

from kestrel_trio import _kernels
from kestrel_trio._model import (
    Decoder, GgufFile, assemble_weights, check_folder_files, config_from_dict, config_from_gguf, default_cache_dir,
    defaults, describe_weights, gguf_architecture, gguf_pooling, load_gguf_weights, load_qwen3_vl,
    load_qwen3_vl_gguf, load_weights, mmproj_image_fields, product_threads, random_tensors, read_config,
    read_pooling, resolve_residency,
)
from kestrel_trio.model.checked import CheckedModel, vl_gguf_pair
from kestrel_trio.errors import KestrelError, ModelLoadError
from kestrel_trio.hub import named_model_of_file
from kestrel_trio.model.loaded import DEMO_CONFIG, DEMO_MODEL_ID, Model
from kestrel_trio.model.checks import is_qwen3_vl_folder
from kestrel_trio.model.settings import _blas_at_start, set_blas_threads
from kestrel_trio.text import Tokenizer
from kestrel_trio.text.media.images import ImageProcessorConfig, require_pillow
from kestrel_trio.text.media.videos import VideoProcessorConfig

__all__ = ["load_model", "load_demo_model", "WEIGHTS_CHOICES"]

# The public model's one logger, whichever of its modules speaks: a logging set-up (or a test) that names
# "kestrel_trio.model" sees all of it, as before the module was split.
log = logging.getLogger("kestrel_trio.model")

WEIGHTS_CHOICES = ("auto", "fp32", "bf16", "int8", "int4", "gguf")  # load_model's weights=, --weights


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
