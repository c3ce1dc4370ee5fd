"""Which kernel runs for each kind of work on a CPU: a pure function of the CPU's features, printable anywhere.

Theory of operation: every choice of kernel by CPU is made here, once, from
a :class:`Features` record (what the CPU runs, what numba's code may hold):
:func:`plan` is pure (no probing, no numba), so the plan of a Cortex-A53 or
of an AVX-512 Xeon can be computed and tested on any host, as h11's state
machine is tested without sockets. The probing is kestrel_trio._kernels.cpu's
(:func:`kestrel_trio._kernels.cpu.kernel_features`); the dispatch
(kestrel_trio._kernels.portable.products, kestrel_trio._kernels' chunk, attention and
tile glue) reads :func:`this_plan` instead of asking the CPU itself.

Variants are named by capability ("avx512-vnni", "neon-dotprod", "avx2",
"portable"), never by vendor. "portable" is the compiled reference loops
(numba, for whatever CPU it compiles for); "none" is a kind this CPU has no
kernel for at all (the caller keeps its numpy path). Each entry also lists
every variant this CPU can execute (:attr:`Choice.runnable`): the tests run
each of them against the portable reference, not only the chosen one.

Run ``python -m kestrel_trio._kernels.plan`` to print the plans of a few
reference CPUs and of this host.
"""

from __future__ import annotations

import dataclasses

from kestrel_trio._kernels import cpu
from kestrel_trio._kernels.cpu import Features

__all__ = ["Features", "Choice", "KernelPlan", "plan", "this_plan", "INTEGER_FORMS", "X86_AUTO_FORMS",
           "F32_LABELS", "INTEGER_LABELS", "SAMPLE_CPUS"]

# The ggml forms that have integer products (activations quantized per block of 32: _kernels.portable.integer
# and the arm/x86 kernels, whose FORMS tables list the same eight).
INTEGER_FORMS = frozenset(("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"))
# The forms whose x86-64 integer kernel "auto" takes: every form kestrel_trio._kernels.x86 has kernels for, so x86
# runs the same integer math as the board. On Qwen3-0.6B's shapes (benchmarks/compute/bench_integer.py, a loaded Zen 5)
# they beat or tie the exact products except Q8_0 at one activation row (0.85x; 1.40x under AVX2 alone), where
# the exact loop already streams near the memory's rate. load_model(..., products="exact") keeps the exact ones.
X86_AUTO_FORMS = INTEGER_FORMS

# Host CPU names whose code has AVX2 and FMA (NUMBA_CPU_NAME set to one of them still allows the AVX2 block).
_AVX2_CPU_NAMES = frozenset({"haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake", "cooperlake",
                             "icelake-client", "icelake-server", "tigerlake", "sapphirerapids", "alderlake",
                             "raptorlake", "znver1", "znver2", "znver3", "znver4", "znver5", "x86-64-v3", "x86-64-v4"})
# Host CPUs with AVX-512 that take the AVX2 block below WIDE_BLOCK_ROWS rows and the 6x4 zmm block from there
# ("avx2+avx512"), instead of the 3x8 zmm block, which lost to both on Zen 5 and Zen 4 (a 16-row decode step of
# Qwen3-0.6B's shapes on Zen 5: 109-118 tok/s against 97-110; every Zen with AVX-512 is a Zen 4 or later). Intel's
# AVX-512 CPUs keep the 3x8 zmm block below WIDE_BLOCK_ROWS rows, where it is as fast. The measurements:
# docs/notes/performance-log.md. Matched on LLVM's CPU name: the difference is the core's, which no feature bit tells.
_AVX2_FIRST = ("znver",)

# The plan's float32 variants -> the labels /health and the start-up line have always shown (product_kernels).
F32_LABELS = {"avx512": "avx512", "avx2": "avx2", "avx2+avx512": "avx2+avx512", "portable": "portable"}
# The plan's integer variants -> those labels ("int8": the portable reference of the integer products).
INTEGER_LABELS = {"neon-dotprod": "sdot", "neon": "neon", "avx512-vnni": "vnni", "avx-vnni": "vnni", "avx2": "avx2",
                  "portable": "int8"}
# x86 integer kernels: kestrel_trio._kernels.x86.integer.usable_kernel's kinds -> the plan's variants.
_X86_INTEGER = {"vnni512": "avx512-vnni", "vnni256": "avx-vnni", "avx2": "avx2"}


@dataclasses.dataclass(frozen=True)
class Choice:
    """One kind of work's kernel on a CPU.

    Attributes:
        variant: the kernel that runs ("avx512", "neon-dotprod", "portable"; "none": no kernel of this kind).
        why: one line, why that one.
        runnable: every variant this CPU can execute for the kind, the chosen one first ("portable" last where
            the kind has a portable reference), for the tests.
    """

    variant: str
    why: str
    runnable: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """For each kind of work, the kernel a CPU takes (:func:`plan`).

    Attributes:
        f32: float32 weight rows' products (from four activation rows; fewer take the portable loops).
        bf16: bf16 weight rows' products (the bf16 residency, BF16 GGUF tensors); int8 weight rows take the same.
        f16: F16 weight rows' products.
        exact: ggml quantized rows expanded to float32 (the "exact" products), every form.
        integer: the integer products of INTEGER_FORMS (activations quantized per block of 32).
        integer_auto: the forms whose own integer kernel the "auto" mode takes (the others: exact).
        chunk_products: float32 prefill chunks' products (kestrel_trio._kernels.x86.float32.chunks).
        chunk_attention: a prefill chunk's causal attention (kestrel_trio._kernels.x86.float32.attention).
        softmax: the chunk attention's softmax numerators (kestrel_trio._kernels.x86.float32.exp, else exp.py's loops).
        tiles: bf16 tile products of prefill chunks (kestrel_trio._kernels.x86.tiles), when asked for.
    """

    f32: Choice
    bf16: Choice
    f16: Choice
    exact: Choice
    integer: Choice
    integer_auto: frozenset[str]
    chunk_products: Choice
    chunk_attention: Choice
    softmax: Choice
    tiles: Choice

    def kinds(self) -> dict[str, Choice]:
        """Each kind's name and Choice, in the order above (integer_auto left out: it is not a Choice)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if isinstance(getattr(self, field.name), Choice)}

    def render(self) -> str:
        """The plan as aligned text lines: kind, variant, the other variants the CPU executes, why."""
        rows = [(kind, choice.variant, ", ".join(v for v in choice.runnable if v != choice.variant), choice.why)
                for kind, choice in self.kinds().items()]
        width = max(len("also runs"), *(len(also) for _, _, also, _ in rows))
        lines = [f"  {'kind':<16} {'runs':<13} {'also runs':<{width}}  why"]
        lines += [f"  {kind:<16} {variant:<13} {also:<{width}}  {why}" for kind, variant, also, why in rows]
        auto = ", ".join(sorted(self.integer_auto)) or "none"
        lines.append(f"  {'integer (auto)':<16} {auto}")
        return "\n".join(lines)


def plan(features: Features) -> KernelPlan:
    """The kernel of each kind of work on the CPU ``features`` describes. Pure: no probing, no numba."""
    assembly, assembly_why = _f32_assembly(features)
    x86 = features.arch == "x86_64"
    f32 = Choice(assembly or "portable", assembly_why, _runnable_f32(features, assembly))
    if assembly:  # every CPU with an assembly block has AVX2's 3x4 block, which widens bf16 and int8 in registers
        bf16 = Choice("avx2", "the AVX2 3x4 block, weights widened in registers", ("avx2", "portable"))
    else:
        bf16 = Choice("portable", "no AVX2 assembly here", ("portable",))
    integer, auto = _integer(features)
    wide = assembly == "avx512"
    zmm = assembly in ("avx512", "avx2+avx512")  # the CPU executes the AVX-512 kernels, chosen or not
    if wide:
        chunks = Choice("avx512", "Intel's AVX-512: the 32x14 register block", ("avx512",))
    else:
        chunks = Choice("none", f"needs the AVX-512 assembly of an Intel CPU (float32 rows here: "
                        f"{assembly or 'portable'})", ("avx512",) if zmm else ())
    if assembly:
        attention = Choice("avx512" if wide else "avx2", "the register block of the float32 assembly",
                           ("avx512", "avx2") if wide else ("avx2", "avx512") if zmm else ("avx2",))
    else:
        attention = Choice("none", "needs the AVX-512 or AVX2 assembly of an x86-64 CPU", ())
    if wide:
        softmax = Choice("avx512", "zmm exponentials, in the AVX-512 chunk attention", ("avx512", "portable"))
    else:
        softmax = Choice("portable", "exp.py's loops", ("portable", "avx512") if zmm else ("portable",))
    return KernelPlan(
        f32=f32, bf16=bf16,
        f16=Choice("portable", "expanded in L1 by the compiled loops", ("portable",)),
        exact=Choice("portable", "expanded in L1 by the compiled loops", ("portable",)),
        integer=integer, integer_auto=auto, chunk_products=chunks, chunk_attention=attention, softmax=softmax,
        tiles=_tiles(features) if x86 else Choice("none", f"AMX needs x86-64 (this is {features.arch})", ()))


def _f32_assembly(f: Features) -> tuple[str | None, str]:
    """The float32 assembly blocks and why: "avx512", "avx2+avx512", "avx2" or None (the compiled loops).

    The code numba compiles must hold the instructions too: "avx512" and "avx2+avx512" only for numba's target
    "host", "avx2" also for a named CPU with AVX2, and ``NUMBA_CPU_FEATURES``, where set, must list them. This
    is the only gate: LLVM reports an instruction it cannot assemble as a fatal error, which ends the process.
    """
    if f.arch != "x86_64":
        return None, f"no float32 assembly for {f.arch}"

    def allowed(*wanted: str) -> bool:
        return all(w in f.runs for w in wanted) and (f.target_features is None or set(wanted) <= f.target_features)

    if f.target == "host" and allowed("avx512f"):
        if f.cpu.startswith(_AVX2_FIRST):
            return "avx2+avx512", f"AVX-512 on {f.cpu}: AVX2's 3x4 block, the 6x4 zmm block from 12 rows"
        return "avx512", "AVX-512: the 3x8 and 3x4 zmm blocks, the 6x4 one from 12 rows"
    if (f.target == "host" or f.target in _AVX2_CPU_NAMES) and allowed("avx2", "fma"):
        return "avx2", "AVX2 and FMA: the 3x4 ymm block"
    return None, f"numba's code for {f.target} on this CPU holds neither AVX-512F nor AVX2+FMA"


def _runnable_f32(f: Features, assembly: str | None) -> tuple[str, ...]:
    """Every float32 variant this CPU executes, the chosen first: each assembly block the chosen one implies."""
    implied = {"avx512": ("avx512", "avx2+avx512", "avx2"), "avx2+avx512": ("avx2+avx512", "avx512", "avx2"),
               "avx2": ("avx2",)}.get(assembly or "", ())
    return implied + ("portable",)


def _integer(f: Features) -> tuple[Choice, frozenset[str]]:
    """The integer products' kernel on this CPU, and the forms "auto" takes it for."""
    if f.arch == "aarch64":
        if "dotprod" in f.runs:
            return Choice("neon-dotprod", "sdot: four int8 products a lane", ("neon-dotprod", "neon", "portable")), \
                INTEGER_FORMS
        return Choice("neon", "widening multiplies (no dotprod)", ("neon", "portable")), INTEGER_FORMS
    if f.arch == "x86_64":
        from kestrel_trio._kernels.x86.integer import usable_kernel  # pure given its arguments

        kind = usable_kernel(lambda feature: feature in f.runs, f.compiled)
        if kind is not None:
            order = ("avx512-vnni", "avx-vnni", "avx2")
            chosen = _X86_INTEGER[kind]
            runnable = order[order.index(chosen):]  # every narrower kernel runs too
            if chosen == "avx512-vnni" and "avxvnni" not in f.runs:  # its 256-bit vpdpbusd is {vex}: AVX-VNNI's
                runnable = ("avx512-vnni", "avx2")
            why = "vpdpbusd" if "vnni" in chosen else "vpmaddubsw (no VNNI)"
            return Choice(chosen, why, runnable + ("portable",)), X86_AUTO_FORMS
        return Choice("portable", "numba's code or this CPU lacks AVX2 and F16C", ("portable",)), frozenset()
    return Choice("portable", f"no integer kernel of its own for {f.arch}", ("portable",)), frozenset()


def _tiles(f: Features) -> Choice:
    if f.os != "linux":
        return Choice("none", f"AMX needs Linux on x86_64 (this is {f.os})", ())
    missing = [name for name in ("amx-tile", "amx-bf16") if name not in f.runs]
    if missing:
        return Choice("none", f"this CPU has no {' or '.join(missing)} ({f.cpu})", ())
    return Choice("amx", "bf16 tiles (Linux grants the tile state at enable time)", ("amx",))


# Reference CPUs for the printout and the tests: the board's big core, its little one, an AVX2-only x86 and an
# AVX-512 one with VNNI, as their features would be read (numba compiling for the host).
_ARM = dict(arch="aarch64", os="linux")
_AVX2 = frozenset(("avx2", "fma", "f16c"))
_AVX512 = _AVX2 | {"avx512f", "avx512vnni", "avx512vl", "avx512bw"}
SAMPLE_CPUS = {
    "cortex-a76 (RK3588 big core)": Features(cpu="cortex-a76", runs=frozenset(("neon", "fp16", "dotprod")), **_ARM),
    "cortex-a53 (no dotprod)": Features(cpu="cortex-a53", runs=frozenset(("neon",)), **_ARM),
    "x86-64 with AVX2 only (haswell)": Features(arch="x86_64", os="linux", cpu="haswell", runs=_AVX2,
                                                compiled=_AVX2),
    "x86-64 with AVX-512 and VNNI (icelake-server)": Features(arch="x86_64", os="linux", cpu="icelake-server",
                                                              runs=_AVX512, compiled=_AVX512),
}

_found: list[KernelPlan] = []


def this_plan() -> KernelPlan:
    """This host's plan, made on the first call from kestrel_trio._kernels.cpu.kernel_features (imports numba)."""
    if not _found:
        _found.append(plan(cpu.kernel_features()))
    return _found[0]


def main() -> None:
    """Print the plans of SAMPLE_CPUS and of this host."""
    for name, features in SAMPLE_CPUS.items():
        print(f"{name}:\n{plan(features).render()}\n")
    host = cpu.kernel_features()
    print(f"this host ({host.arch}, {host.cpu}: {' '.join(sorted(host.runs)) or 'no listed features'}):")
    print(plan(host).render())


if __name__ == "__main__":
    main()
