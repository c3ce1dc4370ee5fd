"""Compiled loops over numpy arrays (numba): the products of packed weights that numpy cannot fuse.

numba compiles these plain-Python loops with LLVM and caches the machine code
on disk, so a later process loads them in milliseconds. Nothing here knows a
model: each function takes arrays and row ranges. kestrel_trio._model
decides when to call them and keeps its numpy path for what they do not
cover, and for a Python that numba does not support: :func:`ready` is then
False and :func:`unavailable_reason` says why.

This module only re-exports; each name lives in a module named for its concern.
The package's own modules choose: ``cpu`` (a CPU's features, read once),
``plan`` (which kernel each kind of work takes on any CPU: a pure function of
the features, printed by ``python -m kestrel_trio._kernels.plan``), ``dispatch``
(which compiled function each storage form takes, as the plan says)
and ``loaded`` (whether the compiled loops run in this process, and what
loading them made).

Its rooms: ``wrappers`` (the calls the model makes, over arrays as a forward
pass holds them: the layers' loops, the packed-weight products, the x86-64
prefill kernels; and ``report``, what runs here in words), and below the choosing modules ``portable`` (the numba
reference loops every kernel is tested against, and what a CPU without its own
kernel runs), ``x86`` (integer products, AMX tiles; ``x86.float32``: the
assembly blocks over float32 activations) and ``arm`` (NEON and dotprod integer
products). A room imports only the rooms below it (tests/test_architecture.py
ranks them).
"""

from __future__ import annotations

# loaded first: it readies numba's CPU settings before any of this package's modules imports numba.
from kestrel_trio._kernels.loaded import (FORMS, PRODUCT_MODES, compiled, decode_loops, ready,  # noqa: I001
                                          release_compiler_pages, unavailable_reason)
from kestrel_trio._kernels.wrappers.layers import (decode_attention, decode_attentions, decode_buffers, norm_span,
                                                   qkv_rows, rms_norm, rotate_half, softmax_numerators, swiglu)
from kestrel_trio._kernels.wrappers.packed import (PartProduct, integer_job, integer_rows, packed_expand,
                                                   packed_product, packed_weights, prepare, quantize_activations)
from kestrel_trio._kernels.wrappers.report import describe, describe_cpu, optional_kernels, product_kernels
from kestrel_trio._kernels.wrappers.prefill import (
    CHUNK_K_STEP, CHUNK_WEIGHT_ROWS, TILE_BLOCK_ROWS, TILE_K_STEP, chunk_product,
    enable_chunk_products, enable_prefill_attention, enable_tiles, prefill_attention, tile_multiply, tile_pack,
    tile_product)

__all__ = ["FORMS", "ready", "compiled", "unavailable_reason", "describe", "describe_cpu", "product_kernels",
           "optional_kernels", "PRODUCT_MODES", "prepare", "packed_product", "PartProduct",
           "quantize_activations", "packed_expand", "packed_weights", "release_compiler_pages", "enable_tiles",
           "tile_product", "tile_pack", "tile_multiply", "enable_chunk_products", "chunk_product",
           "CHUNK_WEIGHT_ROWS", "CHUNK_K_STEP", "enable_prefill_attention", "prefill_attention", "qkv_rows",
           "TILE_BLOCK_ROWS", "TILE_K_STEP", "rotate_half", "rms_norm", "softmax_numerators", "swiglu",
           "decode_attention", "decode_buffers", "decode_attentions", "norm_span", "integer_rows", "integer_job",
           "decode_loops"]
