"""The aarch64 integer kernels' code for the board's CPUs, read on any host: numba's LLVM IR of each kernel compiled
by LLVM's AArch64 back end (tests/aarch64_assembly.py says how). The board's big core (cortex-a76, whose name
brings dotprod) gets ``sdot`` in every form's block sums; a core without dotprod (cortex-a53) gets the widening
kernel, whose code holds no ``sdot`` (that core would stop on it: SIGILL) but widening multiplies.
(On aarch64 itself, test_integer_products reads numba's native assembly too.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llvmlite import binding as ll

from kestrel_trio import _kernels
from slow_host import allowance

SCRIPT = Path(__file__).resolve().parents[1] / "aarch64_assembly.py"


def _aarch64_backend() -> bool:
    ll.initialize_all_targets()
    try:
        ll.Target.from_triple("aarch64-unknown-linux-gnu")
    except RuntimeError:
        return False
    return True


pytestmark = [pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason()),
              pytest.mark.skipif(not _aarch64_backend(), reason="this llvmlite has no AArch64 back end")]


def instructions(kernel: str, cpu: str) -> dict[str, int]:
    """{mnemonic: count} of ``kernel``'s aarch64 assembly for ``cpu``, from a process of its own."""
    done = subprocess.run([sys.executable, str(SCRIPT), kernel, cpu], capture_output=True, text=True,
                          timeout=allowance(900))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_the_sdot_kernel_for_the_boards_big_core_holds_sdot_in_every_forms_block_sums():
    found = instructions("product_sdot", "cortex-a76")
    # two a block of 32 and row, in each form's four-row and one-row kernels (Q8_0's and Q4_0's eight-row ones
    # besides): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 one block a step, Q4_K, Q5_K, Q6_K eight
    assert found.get("sdot", 0) >= 5 * (2 * 4 + 2) + 3 * 8 * (2 * 4 + 2)
    assert found.get("fmla", 0) > 0  # the block's scales applied in float32, four rows' in one vector
    assert not any(name.startswith(("smull", "smlal")) for name in found)  # no widening multiply left


@pytest.mark.slow
def test_the_widening_kernel_for_a_core_without_dotprod_holds_no_sdot():
    found = instructions("product_widening", "cortex-a53")
    assert "sdot" not in found and "udot" not in found
    assert found.get("smull", 0) > 0 and found.get("smlal", 0) > 0  # int8 x int8 -> int16, summed
