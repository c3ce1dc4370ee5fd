"""How weights stay in memory (``weights=``), which form "auto" picks, and loading a checkpoint in it.

Residencies (bytes per weight of the matrices; vectors are float32 in all):

* ``fp32`` (4): float32 arrays, q/k/v and gate/up fused by copying. Fastest
  at batch 1 when it fits.
* ``bf16`` (2): bf16 bits, memory-mapped when the checkpoint stores bf16
  (exact for bf16 checkpoints; fp32/fp16 ones are rounded, with a warning).
* ``int8`` (1): a float checkpoint quantized at load, symmetric per output
  channel; ``int4`` (0.53): symmetric per group of 64 (kestrel_trio._model.weights.quantize).
  Cached on disk so the next load maps them (kestrel_trio._model.weights.quant_cache).
* ``gguf``: a GGUF file's tensors as the file stores them (Q4_K, Q8_0, ...),
  memory-mapped, expanded bit for bit as ggml does, a chunk at a time, at use.

``auto`` for a checkpoint folder is the first of fp32, bf16, int8, int4 whose
weights take at most AUTO_FP32_SHARE of the memory available now (the rest
is KV cache and headroom): it shrinks the weights only as far as the machine
needs, since each step down costs speed or exactness. For a GGUF file it is
``gguf``: the file's quantization is the memory its user planned for, and
its values are the same as fp32 expansion's, bit for bit.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Callable, Iterable

from kestrel_trio._model.weights import quant_cache
from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.forms.packed import INT4_GROUP, PackedMatrix
from kestrel_trio._model.weights.quantize import QUANTIZED_FORMS, QuantizingSource
from kestrel_trio._model.weights.resident import reachable
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.checkpoints.shapes import check_tensors
from kestrel_trio._model.weights.assemble import CheckpointReader, Weights, assemble_from, bf16_source, fp32_source
from kestrel_trio.errors import ModelLoadError

log = logging.getLogger(__name__)

__all__ = ["RESIDENCIES", "FOLDER_RESIDENCIES", "GGUF_RESIDENCIES", "AUTO_FP32_SHARE", "resolve_residency",
           "check_folder_residency", "residency_bytes", "load_weights", "assemble_resident", "describe_weights",
           "resident_bytes"]

RESIDENCIES = ("fp32", "bf16", "int8", "int4", "gguf")
FOLDER_RESIDENCIES = ("fp32", "bf16", "int8", "int4")  # auto's ladder for a checkpoint folder, in this order
GGUF_RESIDENCIES = ("fp32", "bf16", "gguf")
# The weights may take this share of available memory under weights=auto; the rest is KV cache and headroom.
AUTO_FP32_SHARE = 0.7
_STORAGE_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def residency_bytes(shapes: Iterable[tuple[int, ...]]) -> dict[str, int]:
    """Bytes the tensors of ``shapes`` take in each folder residency (matrices packed, vectors float32).

    A tensor of two or more dimensions is a matrix of rows of its last dimension.
    """
    total = dict.fromkeys(FOLDER_RESIDENCIES, 0)
    for shape in shapes:
        count = math.prod(shape)
        if len(shape) < 2:
            for form in total:
                total[form] += 4 * count
            continue
        rows, cols = count // shape[-1], shape[-1]
        total["fp32"] += 4 * count
        total["bf16"] += 2 * count
        total["int8"] += count + 4 * rows
        total["int4"] += count // 2 + 2 * rows * -(-cols // INT4_GROUP)
    return total


def check_folder_residency(residency: str) -> None:
    """Raise ModelLoadError unless ``residency`` is one of FOLDER_RESIDENCIES (a checkpoint folder's loaders)."""
    if residency not in FOLDER_RESIDENCIES:
        raise ModelLoadError(f"weights residency must be one of {', '.join(FOLDER_RESIDENCIES)}, got {residency!r}")


def resolve_residency(folder: Path | None, requested: str, available_bytes: int | None = None,
                      fp32_bytes: int | None = None, *, gguf: bool = False) -> str:
    """The residency to load with: ``requested`` unless "auto" (logged with the sizes it compared).

    Args:
        folder: the checkpoint folder (only its headers are read), unless ``fp32_bytes`` is given.
        requested: "auto" or one of RESIDENCIES.
        available_bytes: memory available (default: /proc/meminfo's MemAvailable).
        fp32_bytes: the weights' size in float32 (default: from the folder's headers); the
            other forms' sizes are then scaled from it.
        gguf: the model is a GGUF file (auto: "gguf"; int8/int4 are refused).

    Raises:
        ModelLoadError: an unknown residency, or one that does not apply to this kind of model.
    """
    allowed = GGUF_RESIDENCIES if gguf else FOLDER_RESIDENCIES
    if requested not in ("auto", *RESIDENCIES):
        raise ModelLoadError(f"weights must be one of auto, {', '.join(RESIDENCIES)}, got {requested!r}")
    if requested not in ("auto", *allowed):
        if gguf:
            raise ModelLoadError(f"weights={requested} quantizes a float checkpoint folder; a GGUF file is already "
                                 "quantized: use weights=gguf (its tensors as stored) or auto")
        raise ModelLoadError("weights=gguf keeps a GGUF file's own quantization; for a checkpoint folder use "
                             "int8 or int4 (or auto)")
    if requested != "auto":
        return requested
    if gguf:
        log.info("weights=auto chose gguf: the file's tensors stay as stored, memory-mapped")
        return "gguf"
    sizes = _form_bytes(folder, fp32_bytes)
    available = _mem_available() if available_bytes is None else available_bytes
    budget = None if available is None else AUTO_FP32_SHARE * available
    choice = next((form for form in FOLDER_RESIDENCIES if budget is None or sizes[form] <= budget), "int4")
    listed = ", ".join(f"{form} {sizes[form] / 2**30:.2f} GiB" for form in FOLDER_RESIDENCIES)
    where = "unknown" if available is None else f"{available / 2**30:.2f} GiB"
    if budget is not None and sizes[choice] > budget:
        log.warning("weights=auto chose int4, the smallest form, though it needs more than %.0f%% of the memory "
                    "available (%s; weights %s)", 100 * AUTO_FP32_SHARE, where, listed)
    else:
        log.info("weights=auto chose %s: weights %s; memory available %s", choice, listed, where)
    return choice


def _form_bytes(folder: Path | None, fp32_bytes: int | None) -> dict[str, int]:
    if fp32_bytes is not None:  # only the total is known: scale it by each form's bytes per weight
        return {"fp32": fp32_bytes, "bf16": fp32_bytes // 2, "int8": fp32_bytes // 4,
                "int4": fp32_bytes * 17 // 128}
    infos = SafetensorsCheckpoint(folder).tensors.values()
    return residency_bytes(info.shape for info in infos)


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_weights(folder: Path, config: ModelConfig, progress: Callable[[float], None] | None = None,
                 residency: str = "fp32", quantized_cache: Path | None = None) -> Weights:
    """Check and load every tensor of the checkpoint in ``folder``.

    Args:
        folder: the checkpoint folder.
        config: its configuration.
        progress: called with the fraction of bytes read so far (0 to 1).
        residency: one of FOLDER_RESIDENCIES (see the module docstring).
        quantized_cache: the folder of int8/int4 cache files; None: no cache.

    Raises:
        ModelLoadError: naming the file or tensor at fault.
    """
    check_folder_residency(residency)
    checkpoint = SafetensorsCheckpoint(folder)
    check_tensors(checkpoint, config)
    reader = CheckpointReader(checkpoint, progress)
    return assemble_resident(config, reader, residency, set(checkpoint.tensors), quantized_cache=quantized_cache)


def assemble_resident(config: ModelConfig, reader: CheckpointReader, residency: str, names: set[str],
                      rename: Callable[[str], str] = lambda name: name,
                      quantized_cache: Path | None = None) -> Weights:
    """Build :class:`Weights` held as ``residency`` says from a checked safetensors checkpoint.

    Args:
        config: the decoder's configuration.
        reader: the checkpoint.
        residency: one of FOLDER_RESIDENCIES.
        names: every decoder tensor name present, as Qwen3 spells it.
        rename: a Qwen3 tensor name as this checkpoint spells it.
        quantized_cache: the folder of int8/int4 cache files; None: no cache.
    """
    if residency in QUANTIZED_FORMS:
        return _assemble_quantized(config, reader, residency, names, rename, quantized_cache)
    if residency == "bf16":
        rounded = sorted({i.dtype for i in reader.checkpoint.tensors.values()} - {"BF16"})
        if rounded:
            log.warning("%s: %s weights are rounded to bf16 once at load (weights=bf16)", reader.checkpoint.folder,
                        "/".join(rounded))
        return assemble_from(config, names, bf16_source(reader, rename))
    return assemble_from(config, names, fp32_source(reader, rename, tied_embeddings=config.tie_word_embeddings))


def _assemble_quantized(config: ModelConfig, reader: CheckpointReader, form: str, names: set[str],
                        rename: Callable[[str], str], cache_dir: Path | None) -> Weights:
    """int8/int4 weights: mapped from the cache file when there is one, else quantized now (and cached)."""
    checkpoint = reader.checkpoint
    path = key = None
    if cache_dir is not None:
        files = sorted({info.path for info in checkpoint.tensors.values()})
        path = quant_cache.cache_path(cache_dir, checkpoint.folder, files, form, {"int4_group": INT4_GROUP})
        key = path.stem
        stored = quant_cache.read_arrays(path, key) if path.exists() else None
        if stored is not None:
            weights = assemble_from(config, names, QuantizingSource(reader, form, stored, rename))
            reader.finish()
            log.info("%s: %s weights mapped from the quantized cache %s", checkpoint.folder, form, path)
            return weights
    log.info("%s: quantizing the weights to %s (%s)", checkpoint.folder, form,
             "per output channel, symmetric" if form == "int8" else f"per group of {INT4_GROUP}, symmetric")
    source = QuantizingSource(reader, form, None, rename)
    weights = assemble_from(config, names, source)
    if path is None:
        return weights
    try:
        written = quant_cache.write_arrays(path, source.made, key)
    except OSError as exc:
        log.warning("%s: could not write the quantized cache (%s); the next load quantizes again", path, exc)
        return weights
    log.info("%s: wrote the quantized cache %s (%.2f GiB); the next load maps it", checkpoint.folder, path,
             written / 2**30)
    stored = quant_cache.read_arrays(path, key)
    if stored is None:
        return weights
    # The same weights, now mapped from the file: page cache shared with later loads, not private memory.
    return assemble_from(config, names, QuantizingSource(reader, form, stored, rename))


def _matrices(weights: Weights) -> list:
    """Every matrix of ``weights`` once (a tied lm_head is the embedding)."""
    found = {id(weights.embed_tokens): weights.embed_tokens, id(weights.lm_head): weights.lm_head}
    for layer in weights.layers:
        a = layer.attn
        for m in (a.qkv_proj if a.qkv_proj is not None else None, a.o_proj):
            if m is not None:
                found[id(m)] = m
        if a.qkv_proj is None:
            for m in (a.q_proj, a.k_proj, a.v_proj):
                found[id(m)] = m
        mlps = layer.mlp.experts if hasattr(layer.mlp, "experts") else (layer.mlp,)
        for mlp in mlps:
            fused = mlp.gate_up_proj is not None
            for m in ((mlp.gate_up_proj,) if fused else (mlp.gate_proj, mlp.up_proj)) + (mlp.down_proj,):
                found[id(m)] = m
    return list(found.values())


def packed_matrices(weights) -> list[PackedMatrix]:
    """The matrices of ``weights`` (a decoder's, a vision tower's: attrs classes) held packed, each once."""
    return reachable(weights, PackedMatrix)


def resident_bytes(weights: Weights) -> dict[str, int]:
    """Bytes of the matrices by storage form (``"float32"`` for plain arrays); vectors not counted."""
    forms: dict[str, int] = {}
    for matrix in _matrices(weights):
        if isinstance(matrix, PackedMatrix):
            for part in matrix.parts:
                forms[part.form] = forms.get(part.form, 0) + part.nbytes
        else:
            forms["float32"] = forms.get("float32", 0) + matrix.nbytes
    return forms


def describe_weights(weights: Weights) -> str:
    """One line for the start-up log: the matrices' bytes by storage form, e.g. ``Q4_K 0.31 GiB, Q6_K 0.12 GiB``."""
    forms = resident_bytes(weights)
    listed = ", ".join(f"{form} {_size(size)}" for form, size in sorted(forms.items(), key=lambda f: -f[1]))
    return f"{listed} (matrices {_size(sum(forms.values()))})"


def _size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"
