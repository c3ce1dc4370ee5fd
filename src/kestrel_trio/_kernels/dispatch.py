"""Which compiled product each storage form takes in this process, compiled (or loaded from numba's cache) on
first use: the dispatch over kestrel_trio._kernels.portable.products' loops, the x86-64 assembly blocks
(_kernels.x86.float32.blocks) and the integer kernels (kestrel_trio._kernels.portable.integer, .arm.integer,
.x86.integer), as a kernel plan says (kestrel_trio._kernels.plan: the model's, Backend.plan in
kestrel_trio._model.products.backend, or this host's) and the products' mode, both given to each call (a model's
own). What is cached here is the same for every model: the compiled functions, by form and kernel label, so that
products of two modes live side by side.

Plain Python (nothing here is compiled itself). FORMS, COLUMNS_PER_ITEM and f16_table are products.py's (a file
generated from kestrel_trio._kernels.portable.forms.template), re-exported: this module is what kestrel_trio._kernels
loads as "the products".
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from numba import njit, types

from kestrel_trio._kernels import plan as _plan
from kestrel_trio._kernels.portable.products import _PRODUCTS, COLUMNS_PER_ITEM, FORMS, f16_table
from kestrel_trio._kernels.portable.signatures import _COMPILE, _RESULT, _TABLE, _expand_signature, _signature, _storage

__all__ = ["FORMS", "INTEGER_FORMS", "COLUMNS_PER_ITEM", "f16_table", "f32_assembly", "product_for", "expansion_for",
           "kernel_name",
           "warm", "quantize", "integer_rows", "integer_job"]

_assembler: list = []  # [True] once LLVM's assembly parser is initialized in this process


def f32_assembly() -> str | None:
    """The assembly blocks this process multiplies float32 weights with: "avx512", "avx2", "avx2+avx512" or None.

    None: the compiled loops. The choice of this host's plan (kestrel_trio._kernels.plan: which CPUs, and why AMD's
    Zen with AVX-512 takes "avx2+avx512"); LLVM's assembly parser is readied here for it.
    """
    return _assembly_of(_plan.this_plan())


def _assembly_of(planned: _plan.KernelPlan) -> str | None:
    """The assembly blocks ``planned`` multiplies float32 weights with (as :func:`f32_assembly`), LLVM's assembly
    parser initialized for them (once a process: the blocks are assembly that LLVM assembles)."""
    variant = planned.f32.variant
    if variant == "portable":
        return None
    if not _assembler:
        import llvmlite.binding as llvm_binding

        llvm_binding.initialize_native_asmparser()
        _assembler.append(True)
    return variant


_compiled: dict = {}  # (form, kernel label) -> its compiled product
_expansions: dict = {}  # form -> its compiled expansion (the same in every mode)
_compile_lock = threading.Lock()

# Integer products (activations quantized per block; kestrel_trio._kernels.portable.integer): the forms that have them.
# The mode that chooses them is each call's (kestrel_trio._kernels.PRODUCT_MODES).
INTEGER_FORMS = _plan.INTEGER_FORMS


def product_for(form: str, mode: str, planned: _plan.KernelPlan | None = None):
    """(form's compiled product in products ``mode`` by kernel plan ``planned`` (None: this host's), its compiled
    expansion, how to view its storage), on first use.

    Compiled, or loaded from numba's cache. Only the forms a process uses are
    loaded: each costs about 1-3 MiB of resident memory, loaded or compiled
    (a compilation: about a second).
    """
    planned = planned or _plan.this_plan()
    product, name = _chosen(form, mode, planned)
    found = _compiled.get((form, name))
    if found is None:
        with _compile_lock:
            found = _compiled.get((form, name))
            if found is None:
                _, _, storage, scales, _ = _PRODUCTS[form]
                if product is None:  # an integer kernel (its label "avx2" is also bf16's float32 block's)
                    found = _integer_product(_integer_kernel(form, mode, planned), form)
                else:
                    found = njit(_signature(storage, scales), **_COMPILE)(product)
                _compiled[(form, name)] = found
    return (found, *expansion_for(form))


def expansion_for(form: str):
    """(form's compiled expansion, how to view its storage), on first use: the same in every mode."""
    found = _expansions.get(form)
    if found is None:
        with _compile_lock:
            found = _expansions.get(form)
            if found is None:
                _, expand, storage, scales, view = _PRODUCTS[form]
                found = _expansions[form] = (njit(_expand_signature(storage, scales), **_COMPILE)(expand), view)
    return found


def _chosen(form: str, mode: str, planned: _plan.KernelPlan):
    """(the Python function of ``form``'s product in products ``mode`` by kernel plan ``planned``, the label of its
    kernel).

    The label says what runs from four activation rows up: "portable" (the compiled loops above, for whatever
    CPU numba compiles for) or an assembly block's (:func:`f32_assembly`; bf16 and int8 rows take AVX2's 3x4
    block on every CPU that has one: the plan's). Below four rows every form runs the portable loops. A form of
    INTEGER_FORMS in the integer mode names its integer kernel at every row
    count (:func:`_integer_kernel`; labels kestrel_trio._kernels.plan.INTEGER_LABELS: "sdot" and "neon" on
    aarch64 with and without dotprod, "vnni" and "avx2" on x86-64, "int8" the portable reference).
    """
    if form in INTEGER_FORMS:
        integer = _integer_kernel(form, mode, planned)
        if integer is not None:
            return None, _plan.INTEGER_LABELS[integer]
    assembly = _assembly_of(planned)
    if form == "F32" and assembly:  # the assembly blocks where they apply
        from kestrel_trio._kernels.x86.float32 import blocks as f32_blocks

        products = {"avx512": f32_blocks.product_f32_avx512, "avx2": f32_blocks.product_f32_avx2,
                    "avx2+avx512": f32_blocks.product_f32_avx2_avx512}
        return products[assembly], _plan.F32_LABELS[assembly]
    if form in ("bf16", "BF16", "int8") and planned.bf16.variant == "avx2":
        from kestrel_trio._kernels.x86.float32 import blocks as f32_blocks

        return (f32_blocks.product_int8_avx2 if form == "int8" else f32_blocks.product_bf16_avx2), "avx2"
    return _PRODUCTS[form][0], "portable"


def _own_integer(form: str, chosen: _plan.KernelPlan) -> tuple[str, bool] | None:
    """(the CPU's own integer kernel for ``form`` in plan ``chosen``, the plan's variant; whether "auto" takes it),
    or None where it has none. The plan chooses the kernel (kestrel_trio._kernels.plan); the arm or x86 module's
    FORMS says which forms it has kernels for."""
    variant = chosen.integer.variant
    if variant == "portable":
        return None
    if variant.startswith("neon"):
        from kestrel_trio._kernels.arm import integer as arm

        forms = arm.FORMS
    else:
        from kestrel_trio._kernels.x86 import integer as x86

        forms = x86.FORMS
    return (variant, form in chosen.integer_auto) if form in forms else None


def _integer_kernel(form: str, mode: str, planned: _plan.KernelPlan | None = None) -> str | None:
    """The integer kernel (the plan's variant name) of ``form`` in products ``mode`` by kernel plan ``planned``
    (None: this host's), or None for the exact products: "auto" takes the CPU's own kernel where the plan says it
    wins (:func:`_own_integer`), "integer" that or else the portable reference."""
    if mode == "exact" or form not in INTEGER_FORMS:
        return None
    own = _own_integer(form, planned or _plan.this_plan())
    if own is not None and (mode == "integer" or own[1]):
        return own[0]
    return "portable" if mode == "integer" else None


def _integer_product(variant: str, form: str):
    """``form``'s integer product by kernel ``variant`` (the plan's name), with the products' arguments: the
    activations quantized (kestrel_trio._kernels.portable.integer; the block sums too where the form has minimums), then
    the kernel's block sums. Composed here in Python, not compiled as one function: numba would not see a change
    to either file in a cached caller."""
    form_id, kernel, reference = _typed_kernel_of(variant, form)

    def product(data, scales, f16, run, x, start, stop, out, quantized=None):
        if quantized is None:
            quantized = quantize(x, (form,), "integer")  # this product is an integer one, whatever mode chose it
        xq, xd, xs = quantized
        xs = xd if xs is None else xs  # read by the forms with minimums only
        if reference:
            kernel(form_id, data, f16, run, xq, xd, xs, start, stop, out)
        else:
            kernel(form_id, data, xq, xd, xs, start, stop, out)

    product.takes_quantized = True  # kestrel_trio._kernels.packed_product hands it quantize()'s activations
    return product


_QUANTS = types.Array(types.int8, 2, "C")  # xq [N, cols]
_BLOCK_SCALES = types.Array(types.float32, 2, "C")  # xd, xs [N, cols / 32]
_typed_kernels: dict = {}


def _typed_kernel(kernel, reference: bool):
    """``kernel`` (an integer kernel's dispatcher) compiled, or loaded from numba's cache, now, at the one
    signature every product call converts to (read-only storage, ``out`` of any strides, as the exact products'),
    with compilation then closed: a GGUF's read-only mapped rows or a column range of a larger result would
    otherwise each compile another version at their first call, after warming handed back the compiler's pages.
    One dispatcher a kernel, over its own Python function, so numba's cache of that function serves it."""
    found = _typed_kernels.get(kernel)
    if found is None:
        if reference:  # (form, data, f16, run, xq, xd, xs, start, stop, out)
            signature = types.void(types.int64, _storage(types.uint8), _TABLE, types.int64, _QUANTS, _BLOCK_SCALES,
                                   _BLOCK_SCALES, types.int64, types.int64, _RESULT)
        else:  # (form, data, xq, xd, xs, start, stop, out)
            signature = types.void(types.int64, _storage(types.uint8), _QUANTS, _BLOCK_SCALES, _BLOCK_SCALES,
                                   types.int64, types.int64, _RESULT)
        found = _typed_kernels[kernel] = njit(signature, **_COMPILE)(kernel.py_func)
    return found


# The plan's integer variants -> (the module under kestrel_trio._kernels, its kernel's name).
_INTEGER_KERNELS = {"avx512-vnni": ("x86.integer", "product_vnni512"), "avx-vnni": ("x86.integer", "product_vnni256"),
                    "avx2": ("x86.integer", "product_avx2"), "neon-dotprod": ("arm.integer", "product_sdot"),
                    "neon": ("arm.integer", "product_widening"), "portable": ("integer", "product_blocks")}


def _integer_module(variant: str):
    """(the module of integer kernel ``variant``, the plan's name; its kernel's name there; the module whose
    ``form_id`` numbers its forms: its own on x86-64, arm's for the aarch64 kernels and the portable reference)."""
    import importlib

    module, name = _INTEGER_KERNELS[variant]
    kernels = importlib.import_module(f"kestrel_trio._kernels.{module}")
    ids = kernels if module.startswith("x86") else importlib.import_module("kestrel_trio._kernels.arm.integer")
    return kernels, name, ids


def _typed_kernel_of(variant: str, form: str):
    """(the form's id in integer kernel ``variant``'s numbering, that kernel as :func:`_typed_kernel` compiles it,
    whether it is the portable reference, which also takes the float16 table and the run after the rows)."""
    kernels, name, ids = _integer_module(variant)
    reference = variant == "portable"
    return ids.form_id(form), _typed_kernel(getattr(kernels, name), reference), reference


def integer_rows(form: str, data: np.ndarray, f16: np.ndarray, mode: str) -> tuple | None:
    """``form``'s integer product over the GGUF rows ``data`` (uint8 [rows, row_bytes]) in products ``mode``,
    bound to them, and whether it reads the activations' block sums (a form with minimums): the callable takes
    ``(xq, xd, xs, start, stop, out)``, :func:`quantize`'s activations (``xs`` any float32 array where the form
    has no minimums), into ``out`` [N, stop-start]. None where ``form`` takes the exact products. The compiled
    kernel is called directly (a ``functools.partial``, no Python frame): a decode step makes a dozen such calls
    a layer (kestrel_trio._model.decoder.decode_step)."""
    variant = _integer_kernel(form, mode)
    if variant is None:
        return None
    from kestrel_trio._kernels.arm import integer as arm

    form_id, kernel, reference = _typed_kernel_of(variant, form)
    minimums = bool(arm.FORMS[form][2])
    if reference:
        return functools.partial(kernel, form_id, data, f16, 32), minimums
    return functools.partial(kernel, form_id, data), minimums


def integer_job(form: str, mode: str) -> tuple[int, int] | None:
    """(the address of ``form``'s integer kernel's job entry in products ``mode`` here, the form's id in it):
    what a job row of kestrel_trio._kernels.portable.handoff names, for a helper thread to run the product in compiled
    code. None where ``form`` takes the exact products or the portable reference (which has no job entry)."""
    variant = _integer_kernel(form, mode)
    if variant is None or variant == "portable":
        return None
    kernels, name, ids = _integer_module(variant)
    return kernels.job_entry(name), ids.form_id(form)


def quantize(x: np.ndarray, forms, mode: str) -> tuple | None:
    """``x`` float32 [N, cols] quantized for the integer products of ``forms`` (names in FORMS), once for all:
    (int8 [N, cols], float32 scales [N, cols / 32], the blocks' sums [N, cols / 32] or None where no form
    needs them); None where none of ``forms`` takes an integer product in products ``mode``."""
    integer_forms = [form for form in forms if _integer_kernel(form, mode) is not None]
    if not integer_forms:
        return None
    from kestrel_trio._kernels.portable import integer
    from kestrel_trio._kernels.arm import integer as arm

    xq = np.empty(x.shape, dtype=np.int8)  # [N, cols]
    xd = np.empty((x.shape[0], x.shape[1] // 32), dtype=np.float32)  # [N, cols / 32]
    integer.quantize_q8_rows(x, 32, xq, xd)
    xs = None
    if any(arm.FORMS[form][2] for form in integer_forms):  # a form with minimums
        xs = np.empty_like(xd)  # [N, cols / 32]
        integer.block_sums(xq, xd, 32, xs)
    return xq, xd, xs


def kernel_name(form: str, mode: str, planned: _plan.KernelPlan | None = None) -> str:
    """The label of the kernel ``form``'s products take in products ``mode`` by kernel plan ``planned`` (None: this
    host's): "portable", "avx512", "avx2", "avx2+avx512"; "sdot", "neon", "vnni", "avx2", "int8" for the integer
    products (:func:`_chosen`)."""
    return _chosen(form, mode, planned or _plan.this_plan())[1]


def warm(form: str, f16: np.ndarray, mode: str) -> None:
    """Compile, or load from numba's cache, ``form``'s product in ``mode`` and its expansion now: for an integer
    product, by running it once on one zero block (its kernels compile at their first call), and its job entry.
    ``f16``: :func:`f16_table`'s table, made once by the caller."""
    product, _, view = product_for(form, mode)
    if _chosen(form, mode, _plan.this_plan())[0] is None:  # an integer kernel
        from kestrel_trio._kernels.arm import integer as arm

        size, _, _, subs = arm.FORMS[form]  # ggml's block: its bytes, its sub-blocks of 32 weights
        cols = 32 * subs
        product(np.zeros((1, size), dtype=np.uint8), np.empty((1, 0), dtype=np.uint8), f16, 32,
                np.zeros((1, cols), dtype=np.float32), 0, 1, np.empty((1, 1), dtype=np.float32))  # one block
        integer_job(form, mode)  # and its job entry, which the product threads run (_kernels.portable.handoff)
