"""The compiled products of packed weights (kestrel_trio._kernels) against the numpy expansion they replace."""

from __future__ import annotations

import ast
import ctypes
import mmap
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import loaded
from kestrel_trio._model.products import matmul
from kestrel_trio._model.forms.dequant import GGML_TYPE_BY_NAME
from kestrel_trio._model.forms.packed import Bf16Rows, GgmlRows, Int4Rows, Int8Rows, PackedMatrix, expand_part
from kernel_plan_kit import without_compiled_loops
from slow_host import allowance

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GGML_FORMS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
OWN_FORMS = ["int8", "int4", "bf16"]


def random_part(form: str, rows: int, cols: int, seed: int = 0):
    """A part of ``form`` with random storage bytes (finite scales), [rows, cols]."""
    rng = np.random.default_rng(seed)
    if form == "int8":
        return Int8Rows(rng.integers(-127, 128, (rows, cols), dtype=np.int8), rng.random(rows, dtype=np.float32))
    if form == "int4":
        scale = (rng.random((rows, cols // 64)) * 0.1).astype(np.float16)
        return Int4Rows(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), scale, 64)
    floats = rng.standard_normal((rows, cols), dtype=np.float32)
    if form == "bf16":
        return Bf16Rows((floats.view(np.uint32) >> 16).astype(np.uint16))
    kind = GGML_TYPE_BY_NAME[form]
    raw = rng.integers(0, 256, (rows, cols // kind.block_size * kind.type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, kind.type_size)
    if form in ("F32", "F16", "BF16"):
        stored = {"F32": floats, "F16": floats.astype(np.float16),
                  "BF16": (floats.view(np.uint32) >> 16).astype(np.uint16)}[form]
        return GgmlRows(kind, np.ascontiguousarray(stored).view(np.uint8).reshape(rows, -1))
    halves = {"Q6_K": [208]}.get(form, [0, 2] if form in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for at in halves:  # finite fp16 scales; every other byte random
        blocks[:, at : at + 2] = (rng.uniform(0.001, 0.01, (blocks.shape[0], 1))).astype(np.float16).view(np.uint8)
    return GgmlRows(kind, raw)


def numpy_weights(part) -> np.ndarray:
    return expand_part(part, 0, part.rows, np.empty((part.rows, part.cols), dtype=np.float32))


@pytest.mark.parametrize("form", GGML_FORMS + OWN_FORMS)
def test_the_compiled_expansion_equals_the_numpy_one_bit_for_bit(form):
    part = random_part(form, 5, 512)
    got = _kernels.packed_weights(*part.kernel_args(), 1, 4)
    np.testing.assert_array_equal(got.view(np.uint32), numpy_weights(part)[1:4].view(np.uint32))


@pytest.mark.parametrize("form", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_any_block_bytes_expand_as_ggufs_reference_does(form):
    """Random bytes everywhere (the scales too: NaN and infinity included), against gguf's dequantization."""
    kind = GGML_TYPE_BY_NAME[form]
    raw = np.random.default_rng(7).integers(0, 256, (4, 2 * kind.type_size), dtype=np.uint8)  # [4, 2 blocks]
    with np.errstate(all="ignore"):  # NaN and infinite scales, on purpose
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[form]).astype(np.float32)  # [4, 2 * block]
    got = _kernels.packed_weights(form, raw, None, 0, 4)
    np.testing.assert_array_equal(got, want)  # NaNs in the same places compare equal here


@pytest.mark.parametrize("rows_in", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("form", GGML_FORMS + OWN_FORMS)
def test_the_compiled_product_is_the_product_with_the_expanded_weights(form, rows_in):
    part = random_part(form, 9, 512, seed=rows_in)
    x = np.random.default_rng(1).standard_normal((rows_in, 512), dtype=np.float32)  # [N, in]
    weights = numpy_weights(part)[2:8]  # [6, in]
    out = np.full((rows_in, 10), np.nan, dtype=np.float32)  # the product lands in columns 3..8, a strided view
    name, data, scales = part.kernel_args()
    _kernels.packed_product(name, data, scales, x, 2, 8, out[:, 3:9])
    scale = np.abs(x) @ np.abs(weights).T  # [N, 6] the size of each sum's terms
    assert np.all(np.abs(out[:, 3:9] - x @ weights.T) <= 1e-6 * scale + 1e-30)
    assert np.isnan(out[:, :3]).all() and np.isnan(out[:, 9:]).all()


def test_mapped_read_only_storage_is_multiplied_as_it_is():
    part = random_part("Q4_K", 4, 512)
    data = part.data.copy()
    data.flags.writeable = False
    x = np.ones((2, 512), dtype=np.float32)
    out = np.empty((2, 4), dtype=np.float32)
    _kernels.packed_product("Q4_K", data, None, x, 0, 4, out)
    np.testing.assert_allclose(out, x @ numpy_weights(part).T, rtol=1e-5, atol=1e-6)


def _matrix() -> PackedMatrix:
    """A fused q/k/v-like matrix of three parts of different forms, large enough to be shared among threads."""
    return PackedMatrix((random_part("Q8_0", 384, 1024, 1), random_part("Q4_K", 128, 1024, 2),
                         random_part("Q6_K", 256, 1024, 3)))


@pytest.mark.parametrize("rows_in", [1, 4, matmul.FUSED_MAX_ROWS])
def test_linear_packed_runs_the_fused_product_and_threads_do_not_change_it(rows_in):
    weight = _matrix()
    x = np.random.default_rng(2).standard_normal((rows_in, 1024), dtype=np.float32)
    previous = matmul.product_threads() or 1
    try:
        matmul.set_product_threads(1)
        alone = matmul.linear_packed(x, weight)
        matmul.set_product_threads(2)
        shared = matmul.linear_packed(x, weight)
    finally:
        matmul.set_product_threads(previous)
    np.testing.assert_array_equal(shared, alone)  # each output is one row's own sum, whoever computes it
    dense = weight.dense()
    np.testing.assert_allclose(alone, x @ dense.T, rtol=1e-4, atol=1e-4 * float(np.abs(x @ dense.T).max()))


def test_a_matrix_with_a_part_of_a_form_not_compiled_takes_the_numpy_path(monkeypatch):
    weight = PackedMatrix((random_part("Q5_0", 256, 1024, 4), random_part("Q8_0", 128, 1024, 5)))
    monkeypatch.setattr(loaded, "FORMS", loaded.FORMS - {"Q5_0"})  # where compiled() reads it
    forms, compiled, resolved = [], _kernels.packed_product, _kernels.PartProduct.__call__
    monkeypatch.setattr(_kernels, "packed_product", lambda form, *args: forms.append(form) or compiled(form, *args))
    monkeypatch.setattr(_kernels.PartProduct, "__call__", lambda part, *args: forms.append(part.form)
                        or resolved(part, *args))  # a part's product resolved once (matmul._part_products)
    x = np.random.default_rng(5).standard_normal((2, 1024), dtype=np.float32)
    want = x @ weight.dense().T
    np.testing.assert_allclose(matmul.linear_packed(x, weight), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert set(forms) <= {"F32"}  # at most the small-batch call's float32 product of the expanded chunks


@pytest.mark.parametrize("mode", _kernels.PRODUCT_MODES)
def test_each_parts_kernel_is_resolved_once_and_gives_the_bits_of_a_product_by_form(monkeypatch, mode):
    from kestrel_trio._kernels import dispatch
    from kestrel_trio._model import Backend

    weight = _matrix()
    x = np.random.default_rng(6).standard_normal((3, 1024), dtype=np.float32)  # [3, 1024]
    by_form = np.empty((3, weight.shape[0]), dtype=np.float32)  # [3, out]: each part looked up in the dispatch
    quantized, first = _kernels.quantize_activations(x, weight.forms, mode), 0
    for part in weight.parts:
        _kernels.packed_product(*part.kernel_args(), x, 0, part.rows, by_form[:, first : first + part.rows],
                                quantized, mode=mode)
        first += part.rows
    looked_up, real = [], dispatch.product_for
    monkeypatch.setattr(dispatch, "product_for", lambda form, *rest: looked_up.append(form) or real(form, *rest))
    with Backend(products=mode).active():
        once = matmul.linear_packed(x, weight)
        assert sorted(looked_up) == sorted(weight.forms)  # resolved at the matrix's first product in this mode
        again = matmul.linear_packed(x, weight)
    assert len(looked_up) == len(weight.parts)  # the second product asked the dispatch nothing
    np.testing.assert_array_equal(once.view(np.uint32), by_form.view(np.uint32))
    np.testing.assert_array_equal(again.view(np.uint32), by_form.view(np.uint32))
    other = "exact" if mode != "exact" else "integer"
    with Backend(products=other).active():
        matmul.linear_packed(x, weight)
    assert len(looked_up) == 2 * len(weight.parts)  # another mode: the parts resolved again, for it


def test_without_the_kernels_the_numpy_path_gives_the_same_products(monkeypatch):
    weight = _matrix()
    x = np.random.default_rng(3).standard_normal((3, 1024), dtype=np.float32)
    fused = matmul.linear_packed(x, weight)
    without_compiled_loops(monkeypatch)
    plain = matmul.linear_packed(x, weight)
    np.testing.assert_allclose(plain, fused, rtol=1e-4, atol=1e-4 * float(np.abs(fused).max()))


def _llvm_private_kib() -> int:
    """KiB of LLVM's code (libllvmlite) resident in this process and mapped by no other one.

    Those are the pages ``MADV_PAGEOUT`` can hand back; a page another process maps too (another test run beside
    this one) stays, whatever this process advises, so the total resident size depends on the machine's load.
    """
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                inside = "libllvmlite" in line
            elif inside and first == "Private_Clean:":
                total += int(line.split()[1])
    return total


def _pageout_drops_a_files_pages(folder: Path) -> bool:
    """Whether ``madvise(MADV_PAGEOUT)`` hands back the resident pages of a file this process mapped and read.

    Linux 5.4+ does; qemu-user (the aarch64 lane) accepts the call and does nothing, and a file on tmpfs with no
    swap cannot be paged out: there the test below could only fail, whatever the code did.
    """
    path = folder / "pageout-probe"
    with path.open("wb") as f:
        f.write(b"\1" * (8 << 20))  # 8 MiB
        f.flush()
        os.fsync(f.fileno())  # written back: clean pages, which the kernel may drop at once
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    pages = (8 << 20) // mmap.PAGESIZE
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))  # each page read in and mapped
        buffer = ctypes.c_char.from_buffer(mapped)
        address = ctypes.addressof(buffer)
        resident = ctypes.create_string_buffer(pages)

        def resident_pages() -> int:
            assert libc.mincore(address, len(mapped), resident) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in resident.raw)

        before = resident_pages()
        libc.madvise(address, len(mapped), 21)  # MADV_PAGEOUT
        after = resident_pages()
        del buffer  # the mapping closes only once no ctypes object points into it
    return before == pages and after < pages // 2


WARM_AND_MEASURE = """
import llvmlite, numba, numpy as np
from test_packed_kernels import _llvm_private_kib, _matrix
from kestrel_trio._model.products import matmul
assert llvmlite.__file__.startswith(COPY), llvmlite.__file__
numba.njit(lambda n: n + 1)(1)  # a fresh compilation: the compiler's pages are resident
compiled = _llvm_private_kib()
weight = _matrix()
matmul.warm_fused_products([weight], "exact")
warmed = _llvm_private_kib()
x = np.ones((2, 1024), dtype=np.float32)
np.testing.assert_allclose(matmul.linear_packed(x, weight), x @ weight.dense().T, rtol=1e-4, atol=1e-3)
print(compiled, warmed, _llvm_private_kib())
"""


@pytest.mark.host_cpu  # qemu-user's emulated CPU (the aarch64 lane) has no working MADV_PAGEOUT
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and MADV_PAGEOUT are Linux's")
def test_warming_loads_the_products_and_hands_back_the_compilers_pages(tmp_path):
    if not _pageout_drops_a_files_pages(tmp_path):
        pytest.skip(f"madvise(MADV_PAGEOUT) left a mapped file's pages resident here ({platform.machine()}, "
                    f"{tmp_path}): under qemu-user, which ignores it, or on tmpfs without swap")
    # The measure runs in a process of its own with a copy of llvmlite of its own: pages of the installed
    # libllvmlite that another process maps too (a test run beside this one) are not this process's to hand back.
    import llvmlite

    site = tmp_path / "site"
    shutil.copytree(Path(llvmlite.__file__).parent, site / "llvmlite")
    for library in (site / "llvmlite").rglob("libllvmlite*"):
        with library.open("rb") as written:
            os.fsync(written.fileno())  # written back: clean pages, which MADV_PAGEOUT drops at once
    script = (f"import sys; sys.path[1:1] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]; "
              f"COPY = {str(site)!r}\n" + WARM_AND_MEASURE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                             timeout=allowance(300))
    finally:
        shutil.rmtree(site)  # 170 MiB that pytest would keep with the run's other temporary folders
    compiled, warmed, ran = (int(n) for n in out.stdout.split())
    print(f"LLVM's pages: {compiled} KiB after a compilation, {warmed} KiB after warming, {ran} KiB after a product")
    assert warmed < compiled / 4, (compiled, warmed)
    assert ran < compiled / 4, (compiled, ran)  # running the compiled code needs none of the compiler


def test_an_fp32_model_loads_at_most_the_float32_product_and_drops_the_compilers_pages():
    code = ("import sys; from kestrel_trio import load_model, _kernels; from pathlib import Path; "
            f"m = load_model(Path({str(FIXTURES / 'qwen3_fp32')!r})); m.logits([1, 2, 3]); "
            "from kestrel_trio._kernels import dispatch; print(sorted(form for form, _ in dispatch._compiled))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=allowance(120))
    assert out.stdout.strip() in ("[]", "['F32']")


def test_a_qwen3_vl_loads_its_vision_towers_forms_too(tmp_path):
    """int8 quantizes the language model and keeps the tower bf16: both forms are loaded at load, not at the
    first image (which would wait for them, and touch the compiler's pages again)."""
    folder = tmp_path / "vl"
    shutil.copytree(FIXTURES / "qwen3_vl_bf16", folder)
    shutil.copy(FIXTURES / "qwen3_vl" / "preprocessor_config.json", folder)
    code = ("from kestrel_trio import load_model; from kestrel_trio._kernels import dispatch; "
            f"load_model({str(folder)!r}, weights='int8', quantized_cache=False); "
            "print(sorted(form for form, _ in dispatch._compiled))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=allowance(120))
    assert {"int8", "bf16"} <= set(ast.literal_eval(out.stdout.strip()))


def test_int4_rows_whose_halves_straddle_groups_expand_exactly():
    """cols 192 in groups of 64: the high nibbles (weights 96-191) start mid-group."""
    rng = np.random.default_rng(9)
    part = Int4Rows(rng.integers(0, 256, (3, 96), dtype=np.uint8), (rng.random((3, 3)) * 0.1).astype(np.float16), 64)
    got = _kernels.packed_weights(*part.kernel_args(), 0, 3)
    np.testing.assert_array_equal(got, numpy_weights(part))


@pytest.mark.parametrize("rows_in", [1, 3, 4])
def test_int4_rows_whose_halves_straddle_groups_multiply_as_their_weights(rows_in):
    """The one-pass loop of 1-3 rows takes whole groups a half: a straddling row goes weight by weight."""
    rng = np.random.default_rng(10)
    part = Int4Rows(rng.integers(0, 256, (5, 96), dtype=np.uint8), (rng.random((5, 3)) * 0.1).astype(np.float16), 64)
    x = rng.standard_normal((rows_in, 192), dtype=np.float32)  # [N, in]
    out = np.empty((rows_in, 5), dtype=np.float32)
    _kernels.packed_product(*part.kernel_args(), x, 0, 5, out)
    weights = numpy_weights(part)  # [5, in]
    assert np.all(np.abs(out - x @ weights.T) <= 1e-6 * (np.abs(x) @ np.abs(weights).T) + 1e-30)


@pytest.mark.parametrize("call", ["compiled", "row_blocks"])
def test_more_rows_than_the_fused_product_takes_expand_chunks_for_the_small_batch_call(call):
    weight = _matrix()
    x = np.random.default_rng(6).standard_normal((matmul.FUSED_MAX_ROWS + 4, 1024), dtype=np.float32)  # [20, in]
    matmul.set_small_batch_call(call)
    try:
        got = matmul.linear_packed(x, weight)
    finally:
        matmul.set_small_batch_call(None)
    want = x @ weight.dense().T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


# ---------------------------------------------------------------- float32 rows: the assembly blocks (x86-64)


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() in ("x86_64", "AMD64"), reason="x86-64 runs assembly blocks (the test below)")
def test_off_x86_64_every_form_takes_the_portable_loops_whatever_numba_compiles_for():
    from kestrel_trio._kernels import dispatch

    assert dispatch.f32_assembly() is None
    assert set(_kernels.product_kernels(_kernels.FORMS, "exact").values()) == {"portable"}


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64's assembly blocks")
def test_the_float32_assembly_is_the_widest_the_cpu_and_the_compiled_code_both_have():
    import llvmlite.binding as llvm_binding

    from kestrel_trio._kernels import dispatch

    host = llvm_binding.get_host_cpu_features()
    features = os.environ.get("NUMBA_CPU_FEATURES", "")
    listed = set(features.split(",")) if features else None
    name = os.environ.get("NUMBA_CPU_NAME", "host")

    def has(*wanted):
        return all(host.get(f, False) and (listed is None or f"+{f}" in listed) for f in wanted)

    if name not in ("host", "haswell", "znver3"):
        pytest.skip(f"NUMBA_CPU_NAME={name}: the expectation is the subprocess tests' below")
    expected = None
    cpu = llvm_binding.get_host_cpu_name()
    if name == "host" and has("avx512f") and not cpu.startswith("znver"):
        expected = "avx512"
    elif name == "host" and has("avx512f"):  # AMD's Zen 4 and 5: the AVX2 block, the 6x4 zmm one from 12 rows
        expected = "avx2+avx512"
    elif name in ("host", "haswell", "znver3") and has("avx2", "fma"):
        expected = "avx2"
    assert dispatch.f32_assembly() == expected


@pytest.mark.parametrize("rows_in", [4, 5, 7, 8, 9, 12, 15, 16, 24, 31, 32])
@pytest.mark.parametrize("cols", [512, 1040, 40, 36])  # 40: of 8, not 16 (the AVX2 block, not AVX-512's); 36: neither
def test_float32_products_from_four_rows_match_numpy(rows_in, cols):
    _check_float32_product(lambda weights, x, out: _kernels.packed_product("F32", weights, None, x, 1, 22, out),
                           rows_in, cols)


def _check_float32_product(multiply, rows_in: int, cols: int) -> None:
    """``multiply(weights, x, out)``, which must put x @ weights[1:22].T into ``out``, matches numpy."""
    rng = np.random.default_rng(rows_in + cols)
    weights = rng.standard_normal((23, cols), dtype=np.float32)  # [23, in]: blocks of three and two rows left
    x = rng.standard_normal((rows_in, cols), dtype=np.float32)  # [N, in]
    out = np.full((rows_in, 24), np.nan, dtype=np.float32)  # the product lands in columns 2..22, a strided view
    multiply(weights, x, out[:, 2:23])
    scale = np.abs(x) @ np.abs(weights[1:22]).T  # [N, 21] the size of each sum's terms
    assert np.all(np.abs(out[:, 2:23] - x @ weights[1:22].T) <= 1e-6 * scale + 1e-30)
    assert np.isnan(out[:, :2]).all() and np.isnan(out[:, 23:]).all()


@pytest.mark.parametrize("rows_in", [4, 5, 8, 13])
@pytest.mark.parametrize("cols", [512, 40, 36])  # 40: of 8 (the AVX2 block's lanes), 36: not
@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_packed_products_from_four_rows_match_their_weights_whole_blocks_and_rows_left(form, rows_in, cols):
    """On x86-64 with AVX2, bf16 and int8 rows widened in the assembly 3x4 block; the two weight rows of 20 the
    blocks leave in a block of the matrix's own rows, the activation rows past four or twelve (5, 13) and
    columns not of 8 (36) through the loops."""
    part = random_part(form, 23, cols, seed=rows_in * cols)
    weights = numpy_weights(part)[1:21]  # [20, in]
    x = np.random.default_rng(cols).standard_normal((rows_in, cols), dtype=np.float32)  # [N, in]
    out = np.full((rows_in, 22), np.nan, dtype=np.float32)  # the product lands in columns 1..20, a strided view
    _kernels.packed_product(*part.kernel_args(), x, 1, 21, out[:, 1:21])
    assert np.all(np.abs(out[:, 1:21] - x @ weights.T) <= 1e-6 * (np.abs(x) @ np.abs(weights).T) + 1e-30)
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, 21]).all()


@pytest.mark.host_cpu
@pytest.mark.parametrize("rows_in", [1, 4, 5, 8])
@pytest.mark.parametrize("cols", [512, 40])
@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_a_bf16_or_int8_product_cut_anywhere_among_its_weight_rows_has_the_bits_of_the_whole(form, rows_in, cols):
    """What a thread's stretch of rows gets (its first and last rows anywhere, not on a block of three) is what
    the whole product has there: each row's sum does not depend on which rows share its block.

    Where the assembly blocks run (x86-64 with AVX2). The portable loops' 4x4 block and row loop round
    differently, so there a cut may change the last bits of the rows around it (so do the GGUF forms' loops
    from four rows, and the float32 rows the blocks leave: product_f32_avx2's _f32_rest).
    """
    from kestrel_trio._kernels import dispatch

    if not dispatch.f32_assembly():
        pytest.skip("the assembly blocks do not run here (x86-64 with AVX2 and numba compiling for it)")
    part = random_part(form, 23, cols, seed=rows_in + cols)
    x = np.random.default_rng(rows_in).standard_normal((rows_in, cols), dtype=np.float32)  # [N, in]
    whole = np.empty((rows_in, 22), dtype=np.float32)
    _kernels.packed_product(*part.kernel_args(), x, 1, 23, whole)
    cut = np.empty_like(whole)
    for start, stop in ((1, 6), (6, 8), (8, 23)):
        _kernels.packed_product(*part.kernel_args(), x, start, stop, cut[:, start - 1 : stop - 1])
    np.testing.assert_array_equal(cut, whole)


# Each float32 assembly block this host executes, chosen or not, against the portable loops:
# tests/model/test_kernel_plan.py (the plan's runnable variants).


def _f32_product_in_a_process_compiling_for(cpu_name: str) -> str:
    """The float32 assembly a process compiling for ``cpu_name`` uses, after checking its 8-row product."""
    code = ("import numpy as np; from kestrel_trio import _kernels; from kestrel_trio._kernels import dispatch; "
            "assert _kernels.ready(); w = np.arange(96 * 64, dtype=np.float32).reshape(96, 64) % 7; "
            "x = np.ones((8, 64), np.float32); out = np.empty((8, 96), np.float32); "
            "_kernels.packed_product('F32', w, None, x, 0, 96, out); "
            "assert np.array_equal(out, x @ w.T); print(dispatch.f32_assembly())")
    env = {**os.environ, "NUMBA_CPU_NAME": cpu_name, "NUMBA_CPU_FEATURES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allowance(300), env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 CPU names")
def test_compiled_for_a_cpu_without_avx2_the_float32_product_takes_the_portable_loops():
    assert _f32_product_in_a_process_compiling_for("core2") == "None"


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 CPU names")
def test_compiled_for_an_avx2_cpu_the_float32_product_takes_the_avx2_block_where_the_host_has_it():
    import llvmlite.binding as llvm_binding

    host = llvm_binding.get_host_cpu_features()
    expected = "avx2" if host.get("avx2", False) and host.get("fma", False) else "None"
    assert _f32_product_in_a_process_compiling_for("haswell") == expected
