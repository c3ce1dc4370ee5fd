"""The kernel plan in tests: the variants this host executes for a kind of work, and the chunk kernel played as
the plan's choice on a host that executes it without choosing it (kestrel_trio._kernels.plan)."""

from __future__ import annotations

import dataclasses

import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import loaded


def runnable(kind: str) -> tuple[str, ...]:
    """This host's runnable variants of ``kind`` (a KernelPlan field); () where the compiled loops cannot run."""
    if not _kernels.ready():
        return ()
    from kestrel_trio._kernels.plan import this_plan

    return getattr(this_plan(), kind).runnable


def enable_chunk_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 chunk kernel enabled as the plan's choice: on a host that executes it without choosing it (AMD's
    Zen with AVX-512), the plan replaced by one that chooses it and the kernel enabled afresh (undone at the test's
    end), so that its tests run it there too."""
    from kestrel_trio._kernels import plan

    planned = plan.this_plan()
    if planned.chunk_products.variant != "avx512":
        chosen = plan.Choice("avx512", "chosen by the test", ("avx512",))
        monkeypatch.setattr(plan, "_found", [dataclasses.replace(planned, chunk_products=chosen)])
        for key in ("chunks", "chunks_error"):  # each restored (or removed again) when the test ends
            monkeypatch.setitem(loaded._state, key, None)
            monkeypatch.delitem(loaded._state, key)
    loaded.dispatch().f32_assembly()  # readies LLVM's assembly parser: the kernel is assembly
    assert _kernels.enable_chunk_products() is None  # compiled (or loaded) and its self-test passed


def without_compiled_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as one where numba cannot be imported, until the test ends: every reader of
    kestrel_trio._kernels.ready (the package's, its modules', kestrel_trio._model's) then takes its numpy path, and
    a model loaded in the test chooses its small-batch call among those that run without the compiled loops."""
    from kestrel_trio._model.products import backend, matmul

    monkeypatch.delitem(loaded._state, "products", raising=False)
    # and no small-batch call timed with them: a model loaded now, or code outside any model (the defaults), times
    # its own among those that run without them (where the compiled call won, e.g. on aarch64)
    monkeypatch.setattr(matmul, "_timed_calls", {})
    choice = backend.defaults().small_batch
    if choice.call == "compiled":  # timed again at its next product; the choice as it was after the test
        for field, value in (("call", None), ("source", "none"), ("timed_bytes", 0)):
            monkeypatch.setattr(choice, field, value)
    monkeypatch.setitem(loaded._state, "error", "numba cannot be imported (played by the test)")
    assert not _kernels.ready() and not _kernels.compiled("Q8_0")
