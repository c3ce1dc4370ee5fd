"""The text of every storage form's compiled product and expansion, with what differs between forms as data
(:data:`FORMS`): kestrel_trio._kernels.portable.forms.generate writes kestrel_trio._kernels.portable.products from it.

Theory of operation: a decode step with packed weights (bf16, int8, int4, a
GGUF's blocks) used to expand cache-sized chunks with numpy and multiply them
with BLAS. numpy has no mixed-precision kernel: its int8-to-float32 cast
alone cost about as much as the whole float32 product it was meant to beat
(0.18-0.21 ns a weight against 0.20). Here each row of weights is expanded
by its form's exact expander (the forms' homes) into a buffer in L1 and
multiplied at once with every activation row (four weight rows by four
activation rows a pass, from four rows up), so the weights are read from
memory once, in their compact form, and expanded once per step whatever the
batch. Below four activation rows (batch-1 decode) the common forms (bf16,
int8, Q8_0, Q4_0, Q4_1, Q4_K, int4) skip the buffer: each weight is expanded
in a register and multiplied at once (the homes' ``_one_pass_*`` loops), so a
step reads the compact rows at close to memory speed instead of the core's pace.

The dot products are compiled with fastmath (reassociation lets LLVM keep
vector accumulators), so they round differently from BLAS in the last bits;
the expanded weights themselves are exact (the expanders).

One product per storage form, each with one explicit signature
(kestrel_trio._kernels.portable.signatures), compiled at its first use
(kestrel_trio._kernels.dispatch.product_for) and cached on disk by numba (a
later process loads it in milliseconds). Any C-contiguous storage, writable
or mapped read-only, converts to the signature's read-only type, so no call
compiles another version.

float32 weights (the fp32 residency's small-batch call) need no expansion:
their rows are multiplied in place. On x86-64 with AVX-512 (Intel's), from
four activation rows up, by a few instructions of assembly (3x8 and 3x4
blocks, and a 6x4 one from 12 rows, product_f32_avx512; with AVX2 a 3x4
block, product_f32_avx2; on AMD's Zen with AVX-512 (Zen 4, Zen 5) that block,
and a 6x4 zmm block from 12 rows, product_f32_avx2_avx512; chosen once by
kestrel_trio._kernels.dispatch.f32_assembly), since LLVM's compiled 3x8 loop
spilled its registers; elsewhere by the compiled loops. bf16 and int8 rows
from four activation rows up take the AVX2 3x4 block too on any of those
CPUs, each weight vector widened in its register (product_bf16_avx2,
product_int8_avx2): no buffer, a half or a quarter of the bytes. Those blocks
are kestrel_trio._kernels.x86.float32.blocks; which kernel runs on a CPU,
kestrel_trio._kernels.plan.

The functions release the GIL (``nogil``): the product threads of
kestrel_trio._model.products.matmul run them on separate cores, each on its own
stretch of rows.

Why a template rather than one function: numba caches only a module-level
function compiled from its own source (not one made by a factory, nor one
that calls an expander handed to it: a "dynamic global"), and a single product
dispatching on the form kept LLVM from fusing the expansion with the dot
product into one pass (measured, 1 row: int8 0.21 ns a weight that way, 0.17
per form; Q8_0 0.27 against 0.23). So each form gets its own product and
expansion, written out in a real file, and this module says once how they read.

What a form's product is made of (:class:`Form`): its row expander
(``row_<suffix>`` in its home, kestrel_trio._kernels.portable.forms.<home>);
below ``small_rows`` activation rows either its one-pass loop (``one_pass``,
where ``one_pass_when`` holds if given) or its rows expanded one at a time
into a buffer; from ``small_rows`` up, four weight rows expanded into buffers
and multiplied four by four (``_multiply``). Two forms differ in shape: F32's
rows are their own buffers (``in_place``), and int8's and bf16's whole loops
are their homes' (``loops``: the x86-64 assembly blocks call them for the rows
they leave). The signature's storage and scales types and how the storage is
viewed are data too; the block forms' weights an item come from their homes'
``BLOCKS``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Form", "FORMS", "DOTS", "DOC", "product_text", "expansion_text"]


@dataclass(frozen=True)
class Form:
    """One storage form's compiled functions, as data.

    Attributes:
        name: the form as FORMS names it ("Q8_0").
        suffix: its functions' suffix (product_<suffix>, expand_<suffix>, row_<suffix>); bf16 and BF16 share one.
        home: the module under kestrel_trio._kernels.portable.forms that holds its loops.
        storage: the numba type of its storage's items in the signatures (a name in numba.types).
        scales: the numba type of its scales, as kestrel_trio._kernels.portable.signatures names it.
        view: how its storage is viewed for the functions (a numpy dtype's text), or "None": as stored.
        columns: weights an item of storage, or None: from its home's BLOCKS (weights a block / bytes a block).
        one_pass: (its one-pass loop, the call's arguments) for fewer than ``small_rows`` activation rows, or None.
        one_pass_when: (a condition, why) the one-pass loop needs, else rows are expanded one at a time; or None.
        loops: its home's whole product loop (the product only calls it), or None.
        in_place: float32 rows multiplied as stored, no buffer (F32).
        small_rows: activation rows from which four weight rows are expanded and multiplied four by four.
    """

    name: str
    suffix: str
    home: str
    storage: str
    scales: str = "_NO_SCALES"
    view: str = "None"
    columns: int | None = None
    one_pass: tuple[str, str] | None = None
    one_pass_when: tuple[str, str] | None = None
    loops: str | None = None
    in_place: bool = False
    small_rows: int = 4


# The generated file's docstring (its theory of operation: this module's).
DOC = """Products with packed weights, one compiled product and one expansion per storage form.

Generated by ``python -m kestrel_trio._kernels.portable.forms.generate`` from
kestrel_trio._kernels.portable.forms.template (the functions' text, each form's
differences as data, and the theory of operation: why a buffer in L1, why
one pass below four activation rows, why one function per form) over the
loops of the forms' homes (kestrel_trio._kernels.portable.forms): edit those
and regenerate, never this file. SOURCES_DIGEST is the sha256 of those
sources (kestrel_trio._kernels.portable.forms.stamp): numba checks a cached
function's own file only, so this file refuses to load (StaleProducts) once
one of them changed without regenerating it.
"""


_ONE_PASS_ARGS = "data, f16, run, x, start, stop, out"
FORMS = (
    Form("int8", "int8", "kestrel", "int8", scales="_FLOATS", columns=1, loops="_int8_rows"),
    Form("int4", "int4", "kestrel", "uint8", scales="_storage(types.uint16)", columns=2,
         one_pass=("_one_pass_int4", "data, scales, f16, x, start, stop, out"),
         one_pass_when=("(x.shape[1] // 2) % (x.shape[1] // scales.shape[1]) == 0", "each half whole groups")),
    Form("bf16", "bf16", "floats", "uint16", columns=1, loops="_bf16_rows"),
    Form("F32", "f32", "floats", "float32", view="np.float32", columns=1, in_place=True),
    Form("F16", "f16", "floats", "uint16", view="np.uint16", columns=1),
    Form("BF16", "bf16", "floats", "uint16", view="np.uint16", columns=1, loops="_bf16_rows"),
    Form("Q8_0", "q8_0", "q8_0", "uint8", one_pass=("_one_pass_q8_0", _ONE_PASS_ARGS)),
    Form("Q4_0", "q4_0", "q4", "uint8", one_pass=("_one_pass_q4_0", _ONE_PASS_ARGS)),
    Form("Q4_1", "q4_1", "q4", "uint8", one_pass=("_one_pass_q4_1", _ONE_PASS_ARGS)),
    Form("Q5_0", "q5_0", "q5", "uint8"),
    Form("Q5_1", "q5_1", "q5", "uint8"),
    Form("Q4_K", "q4_k", "k_quants", "uint8", one_pass=("_one_pass_q4_k", _ONE_PASS_ARGS)),
    Form("Q5_K", "q5_k", "k_quants", "uint8"),
    Form("Q6_K", "q6_k", "k_quants", "uint8"),
)
# The shared dot loops (kestrel_trio._kernels.portable.forms.dots) a product may call.
DOTS = ("_dot_block_3x8", "_dot_rows", "_f32_rest", "_multiply")

_HEAD = "def product_{suffix}(data, scales, f16, run, x, start, stop, out):\n"
_LOOPS = "    {loops}(data, scales, f16, run, x, start, stop, out)\n"
_IN_PLACE = """\
    # already float32: the rows themselves are the buffers
    first = start
    if x.shape[0] >= 8:
        while first + 3 <= stop:
            _dot_block_3x8(data[first : first + 3], x, out, first - start)
            first += 3
    _f32_rest(data, x, first, start, stop, out)
"""
_SMALL = "    if x.shape[0] < {small_rows}:\n"
_ONE_PASS = """\
        {one_pass}({args})
        return
"""
_ONE_PASS_WHEN = """\
        if {when}:  # {why}
            {one_pass}({args})
            return
"""
_ONE_ROW_BUFFER = """\
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            {row}(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
"""
_FOUR_ROW_BUFFERS = """\
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            {row}(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)
"""
_EXPANSION = """\
def expand_{suffix}(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        {row}(data[r], scales[r], f16, run, out[r - start])
"""


def product_text(form: Form) -> str:
    """The source of ``form``'s product: out [N, stop-start] = x [N, cols] @ W[start:stop].T."""
    text = _HEAD.format(suffix=form.suffix)
    if form.loops:
        return text + _LOOPS.format(loops=form.loops)
    if form.in_place:
        return text + _IN_PLACE
    row = f"row_{form.suffix}"
    text += _SMALL.format(small_rows=form.small_rows)
    if form.one_pass and form.one_pass_when:
        text += _ONE_PASS_WHEN.format(when=form.one_pass_when[0], why=form.one_pass_when[1],
                                      one_pass=form.one_pass[0], args=form.one_pass[1])
    elif form.one_pass:
        text += _ONE_PASS.format(one_pass=form.one_pass[0], args=form.one_pass[1])
    if not form.one_pass or form.one_pass_when:
        text += _ONE_ROW_BUFFER.format(row=row)
    return text + _FOUR_ROW_BUFFERS.format(row=row)


def expansion_text(form: Form) -> str:
    """The source of ``form``'s expansion: out [stop-start, cols] = W[start:stop] as float32, exactly."""
    return _EXPANSION.format(suffix=form.suffix, row=f"row_{form.suffix}")
