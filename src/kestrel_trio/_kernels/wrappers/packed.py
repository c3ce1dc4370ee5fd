"""Products and expansions of packed weights (a storage form of FORMS: int8, int4, bf16 or a ggml type), by form.

Each call names its weight's form and its model's products mode (one of
PRODUCT_MODES); the compiled function the form takes in that mode here is
kestrel_trio._kernels.dispatch's (by a kernel plan: a model's, or this
host's). A :class:`PartProduct` is that function resolved once for one
weight's storage, so that a model's products call it without asking the
dispatch again; :func:`packed_product` looks it up at each call (tests, tools,
a float32 matrix's small-batch products).
:func:`prepare` loads those a model will call, at its load, so that no
request waits for a compilation.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np

from kestrel_trio._kernels import loaded
from kestrel_trio._kernels.wrappers.layers import decode_attention, qkv_rows, rms_norm, softmax_numerators, swiglu
from kestrel_trio._kernels.loaded import FORMS, RUN
from kestrel_trio._kernels.wrappers.prefill import enable_prefill_attention

__all__ = ["PartProduct", "packed_product", "quantize_activations", "integer_rows", "integer_job", "packed_expand",
           "packed_weights", "prepare"]

log = logging.getLogger("kestrel_trio.kernels")


class PartProduct:
    """One weight's compiled product, resolved once: its form's function in a products mode by a kernel plan, bound
    to its storage (viewed as that function takes it) and the float16 table.

    Call it as :func:`packed_product` without the form, storage and mode: ``(x, start, stop, out, quantized)``.
    The same compiled function on the same arrays as :func:`packed_product`'s, so the same bits.

    Attributes:
        form: the storage form (one of FORMS).
        data: the storage as given (its address names the weight: tests record which weights a step reads).
        mode: the products mode it was resolved in (one of PRODUCT_MODES).
    """

    __slots__ = ("form", "data", "mode", "_call", "_takes_quantized")

    def __init__(self, form: str, data: np.ndarray, scales: np.ndarray | None, mode: str, planned=None) -> None:
        """Resolve ``form``'s product for ``data`` and ``scales`` (as :func:`packed_product` takes them) in
        products ``mode`` by kernel plan ``planned`` (a kestrel_trio._kernels.plan.KernelPlan; None: this host's).

        Raises:
            RuntimeError: the compiled loops cannot run here.
        """
        product, _, typed, typed_scales = _typed(form, data, scales, mode, planned)
        self.form, self.data, self.mode = form, data, mode
        self._call = functools.partial(product, typed, typed_scales, loaded.f16(), RUN)  # no lookup left per call
        self._takes_quantized = getattr(product, "takes_quantized", False)

    def __call__(self, x: np.ndarray, start: int, stop: int, out: np.ndarray, quantized: tuple | None = None) -> None:
        """``out`` [N, stop-start] = ``x`` [N, cols] @ W[start:stop].T (arguments as :func:`packed_product`'s)."""
        if quantized is not None and self._takes_quantized:
            self._call(x, start, stop, out, quantized)
        else:
            self._call(x, start, stop, out)


def packed_product(form: str, data: np.ndarray, scales: np.ndarray | None, x: np.ndarray, start: int, stop: int,
                   out: np.ndarray, quantized: tuple | None = None, *, mode: str = "exact") -> None:
    """``out`` [N, stop-start] = ``x`` [N, cols] @ W[start:stop].T for W stored as ``form`` (one of FORMS).

    Args:
        form: "int8", "int4", "bf16" or a ggml type name.
        data: the rows' storage [rows, ...], C-contiguous: int8 (int8), uint16 (bf16), uint8 (int4's nibbles,
            a GGUF tensor's bytes).
        scales: int8's float32 [rows, 1], int4's float16 [rows, groups], or None.
        x: float32 [N, cols], C-contiguous.
        start, stop: weight rows.
        out: float32 [N, stop-start], any strides.
        quantized: :func:`quantize_activations` of ``x`` for these forms, made once for every product that
            takes ``x`` (None: an integer product quantizes ``x`` itself).
        mode: the products' mode (one of PRODUCT_MODES; the model's): "exact" expands every weight to float32.
    """
    product, _, data, scales = _typed(form, data, scales, mode)
    if quantized is not None and getattr(product, "takes_quantized", False):
        product(data, scales, loaded.f16(), RUN, x, start, stop, out, quantized)
    else:
        product(data, scales, loaded.f16(), RUN, x, start, stop, out)


def quantize_activations(x: np.ndarray, forms, mode: str) -> tuple | None:
    """``x`` float32 [N, cols] (C-contiguous) quantized to int8 per block of 32 for the integer products of
    ``forms`` (names in FORMS) that products ``mode`` (one of PRODUCT_MODES) takes, once for all of them; None
    where none does. Hand it to :func:`packed_product` with the same ``x`` and ``mode``."""
    if not loaded.ready():
        return None
    return loaded.dispatch().quantize(x, forms, mode)


def integer_rows(form: str, data: np.ndarray, mode: str) -> tuple | None:
    """``form``'s integer product bound to its GGUF rows ``data`` (uint8 [rows, row_bytes]) and whether it reads
    the activations' block sums, or None where ``form`` takes the exact products in products ``mode`` (one of
    PRODUCT_MODES) here (or nothing is compiled):
    kestrel_trio._kernels.dispatch.integer_rows. For a decode step's calls without per-call dispatch."""
    if not loaded.ready() or form not in FORMS:
        return None
    return loaded.dispatch().integer_rows(form, data, loaded.f16(), mode)


def integer_job(form: str, mode: str) -> tuple[int, int] | None:
    """(``form``'s integer kernel's job entry address, its form id) in products ``mode`` for a compiled hand-off
    (kestrel_trio._kernels.portable.handoff), or None: kestrel_trio._kernels.dispatch.integer_job."""
    if not loaded.ready() or form not in FORMS:
        return None
    return loaded.dispatch().integer_job(form, mode)


def packed_expand(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int,
                  out: np.ndarray) -> None:
    """``out`` [stop-start, cols] (float32, C-contiguous) = W[start:stop], exactly (arguments as packed_product)."""
    expand, data, scales = _expansion(form, data, scales)
    expand(data, scales, loaded.f16(), RUN, start, stop, out)


def packed_weights(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as the compiled code expands them, float32 [stop-start, cols] (tests, tools)."""
    expand, data, scales = _expansion(form, data, scales)
    cols = round(loaded.dispatch().COLUMNS_PER_ITEM[form] * data.shape[1])  # data: [rows, items] as expanded
    out = np.empty((stop - start, cols), dtype=np.float32)  # [rows, cols]
    expand(data, scales, loaded.f16(), RUN, start, stop, out)
    return out


def prepare(forms, mode: str) -> None:
    """Compile, or load from numba's cache, the products of ``forms`` (names in FORMS) in products ``mode`` (one
    of PRODUCT_MODES), and their expansions, now.

    And the layers' loops every model steps with (exponentials, decode
    attention). Then hand back the compiler's pages
    (kestrel_trio._kernels.release_compiler_pages): loading uses LLVM too, so a
    loop loaded later would touch them again.

    Raises:
        RuntimeError: the compiled loops cannot run here.
    """
    products = loaded.dispatch()
    started = time.perf_counter()
    wanted = sorted(set(forms) & FORMS)
    for form in wanted:
        products.warm(form, loaded.f16(), mode)
    _load_layer_loops()
    seconds = time.perf_counter() - started
    if seconds > 0.5:  # a compilation, not a load from numba's cache: say why the start took longer
        log.info("compiled the products of %s and the layers' loops in %.1f s (cached on disk for later starts)",
                 ", ".join(wanted) or "no packed form", seconds)
    loaded.release_compiler_pages()


def _load_layer_loops() -> None:
    """Run the exponentials' loops and decode attention once on tiny arrays of the types a forward passes them."""
    scores = np.zeros((1, 2, 3), dtype=np.float32)  # [h, rows, seen]
    softmax_numerators(scores)
    swiglu(np.zeros((1, 4), dtype=np.float32))  # [N, 2*inter]
    cache = np.zeros((1, 2, 4), dtype=np.float32)  # [n_kv, capacity, hd]
    decode_attention(np.zeros((2, 4), dtype=np.float32), cache[:, :1], cache[:, :1], 0.5)
    weight = np.ones(4, dtype=np.float32)  # [dim]
    rms_norm(np.zeros((1, 4), dtype=np.float32), weight, 1e-6)  # [T, hidden]; q/k head views take the same loop
    for norm in (weight, None):  # Qwen3's heads, normed; Llama's and Qwen2.5's, not
        qkv_rows(np.zeros((1, 12), dtype=np.float32), 1, 1, 4, norm, norm, 1e-6, weight[None, :2], weight[None, :2],
                 cache, cache, 0, None, None)
    # a decode step's one-call quantization (kestrel_trio._model.decoder.decode_step)
    from kestrel_trio._kernels.portable import integer

    row = np.zeros((1, 32), dtype=np.float32)  # [1, 32]
    integer.quantize_rows(row, RUN, np.empty((1, 32), np.int8), row[:, :1].copy(), row[:, :1].copy(), True)
    enable_prefill_attention()


def _typed(form: str, data: np.ndarray, scales: np.ndarray | None, mode: str, planned=None):
    """(the form's product in ``mode`` by plan ``planned`` and its expansion, its storage and scales as their
    signatures take them)."""
    product, expand, view = loaded.dispatch().product_for(form, mode, planned)
    return (product, expand, *_as_typed(data, scales, view))


def _expansion(form: str, data: np.ndarray, scales: np.ndarray | None):
    """(the form's expansion, its storage and scales as its signature takes them): no product compiled for it."""
    expand, view = loaded.dispatch().expansion_for(form)
    return (expand, *_as_typed(data, scales, view))


def _as_typed(data: np.ndarray, scales: np.ndarray | None, view) -> tuple[np.ndarray, np.ndarray]:
    if scales is None:
        scales = np.empty((data.shape[0], 0), dtype=np.uint8)  # [rows, 0]
    elif scales.dtype == np.float16:
        scales = scales.view(np.uint16)  # numba has no float16: the bits, looked up in the table
    return (data if view is None else data.view(view)), scales
