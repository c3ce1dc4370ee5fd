"""Everything per storage form of weights: one home per form (its block constants, its exact row expander and
its one-pass loops), the dot loops every form's product shares (``dots``), and the template the per-form
products are generated from.

The homes: ``kestrel`` (int8, int4: kestrel_trio's own copies), ``floats``
(F32, F16, bf16 and BF16), ``q8_0`` (Q8_0), ``q4`` (Q4_0, Q4_1), ``q5``
(Q5_0, Q5_1), ``k_quants`` (Q4_K, Q5_K, Q6_K); ``bits`` reads the stored bits
they share (the float16 table, a block's float16 and uint32). Each block form's
home names its bytes and weights a block (``BLOCKS``); the ggml byte layouts
in full are kestrel_trio._model.forms.dequant's.

Nothing here is cached by numba itself: the per-form products and expansions
that call these loops are kestrel_trio._kernels.portable.products, written by
``generate`` from ``template`` (the functions' text, each form's differences
as data, the products' theory of operation). numba checks a cached function's
own file only, so products.py carries a digest of every file here (``stamp``)
and refuses to load when one changed: after editing one, regenerate it with
``python -m kestrel_trio._kernels.portable.forms.generate``.

Row expanders: each ``row_<form>(row, scales, f16, run, buf)`` writes one
row of a packed matrix into ``buf`` (float32 [cols]) with the same float32
operations, in the same order, as the numpy expansion
(kestrel_trio._model.forms.dequant, kestrel_trio._model.forms.packed), so the
weights equal ggml's and ``gguf``'s bit for bit. That is why they are compiled
without fastmath (``bits._EXACT``): a contracted ``d * q + m`` (one fused
multiply-add) would round differently. They share one signature:

* ``row``: the row's storage, contiguous (so that LLVM sees unit strides and
  vectorizes): int8 (int8), uint16 bits (bf16, F16, BF16), float32 (F32) or
  the ggml blocks' bytes, uint8.
* ``scales``: the row's scales: int8's float32 [1], int4's float16 bits
  [groups], else empty (unused).
* ``f16``: float32 [65536], every float16 bit pattern's value (numba has no
  float16 type; a table lookup is exact).
* ``run``: 32, the length of a block's inner loops, passed at run time: with
  a constant trip count LLVM unrolls those loops into scalar code before it
  can vectorize them (measured on Q8_0: 0.33 ns a weight unrolled, 0.17
  vectorized).
* ``buf``: float32 [cols], the row's weights out.

A weight's value from its stored bits is written once per form, for its
expander and its one-pass loop alike, in int32 arithmetic: in 64-bit lanes
LLVM vectorized int4's at a third of the speed.

One-pass loops (``_one_pass_<form>``: bf16, int8, int4, Q8_0, Q4_0, Q4_1 and
Q4_K), for one to three activation rows: each weight is expanded in a register
and multiplied at once. Expanding a row into a buffer and then taking the
buffer's dot product (the other forms' way below four rows) stores and reloads
every weight, which bounded those products by the core rather than by memory.
The weight each multiplies is the expander's (bf16's bits shifted; int8's
q * scale; Q4_1's and Q4_K's d * q + m), up to a fused multiply-add; Q8_0 and
Q4_0 multiply a block's sum of q * x by d once. fastmath reorders the sums, as
in the dot loops. Measured, one thread, a row at a time, 6144 x 1024 weights
from memory (2-core Zen 4), G weights/s: bf16 9.1-11.2 against 5.3-5.4, int8
22.2-22.4 against 9.5-9.6, Q8_0 11.3 against 7.5, Q4_1 6.4 against 5.1, Q4_K
6.3 against 4.8, int4 (groups of 128) 5.0-6.1 against 4.2-4.7. The block forms
are bound by reducing each block's vector sum, not by memory.
"""
