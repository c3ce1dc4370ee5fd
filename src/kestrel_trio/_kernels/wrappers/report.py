"""What the kernels run on this host, in words: the start-up line, the CPU line, the optional kernel families and
each storage form's kernel (for logs, test reports and bug reports)."""

from __future__ import annotations

from kestrel_trio._kernels import cpu as _cpu
from kestrel_trio._kernels import loaded
from kestrel_trio._kernels.loaded import FORMS
from kestrel_trio._kernels.wrappers.prefill import enable_chunk_products, enable_prefill_attention, enable_tiles

__all__ = ["describe", "describe_cpu", "optional_kernels", "product_kernels"]


def describe() -> str:
    """One line for the start-up log: which products packed weights get."""
    if not loaded.ready():
        return f"numpy expansion and BLAS ({loaded.unavailable_reason()})"
    import numba

    return f"compiled row products (numba {numba.__version__})"


def describe_cpu() -> str:
    """The CPU the compiled code is for and the features the kernels saw, e.g. "cortex-a76 dotprod fp16 neon".

    On x86-64 the name is LLVM's for this host (numba compiles for it) once the kernels are loaded.
    """
    cpu = _cpu.this_cpu()
    if cpu.name == "host" and loaded.ready():
        import llvmlite.binding as llvm_binding

        return " ".join((llvm_binding.get_host_cpu_name(), *cpu.features))
    return cpu.describe()


def optional_kernels() -> dict[str, str | None]:
    """Each kernel family that not every host runs, and None where it runs here, else why not (one line each).

    Loads (or compiles) each family that can run, as a model's load would: for test reports and bug reports.
    """
    assembly = loaded.dispatch().f32_assembly() if loaded.ready() else None
    return {
        "compiled loops (numba)": None if loaded.ready() else loaded.unavailable_reason(),
        "float32 assembly blocks (x86-64 AVX2/AVX-512)": None if assembly else (
            loaded.unavailable_reason() or f"no AVX2 or AVX-512 block for this CPU ({describe_cpu()})"),
        "float32 chunk products (Intel AVX-512)": enable_chunk_products(),
        "chunk attention (AVX2/AVX-512)": enable_prefill_attention(),
        "bf16 tile products (AMX)": enable_tiles(),
    }


def product_kernels(forms, mode: str, planned=None) -> dict[str, str]:
    """For each storage form of ``forms`` (names in FORMS), the kernel its products take in products ``mode``
    (one of PRODUCT_MODES) by kernel plan ``planned`` (a kestrel_trio._kernels.plan.KernelPlan, a model's; None:
    this host's).

    "portable": the compiled reference loops (_kernels.portable.products), compiled for :func:`describe_cpu`;
    "avx512", "avx2", "avx2+avx512": an x86-64 assembly block, from four activation rows; "numpy": numba
    cannot run here (numpy expansion and BLAS). Names outside FORMS are left out.
    """
    wanted = sorted(set(forms) & FORMS)
    if not loaded.ready():
        return {form: "numpy" for form in wanted}
    return {form: loaded.dispatch().kernel_name(form, mode, planned) for form in wanted}
