"""/health and the start-up log say which product kernel each weight form took and the CPU they were chosen for,
so that a user on a board can see which path runs and a bug report carries it."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import trio

from kestrel_trio import _kernels, load_model
from kestrel_trio._kernels import cpu
from kestrel_trio._model import resident_bytes

from server_kit import fetch, running_server
from slow_host import allowance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QUANT_GGUF = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"


def _expected_kernel(form: str) -> str:
    """The kernel a form must take on this host, from the host's facts (not from the code that chooses)."""
    if not _kernels.ready():
        return "numpy"
    if platform.machine() not in ("x86_64", "AMD64"):
        return "portable"  # no assembly of ours runs off x86-64 (yet)
    from kestrel_trio._kernels import dispatch

    assembly = dispatch.f32_assembly()
    if form == "F32":
        return assembly or "portable"
    return "avx2" if form in ("bf16", "BF16", "int8") and assembly else "portable"


def test_the_start_up_log_names_each_forms_kernel_and_the_cpu(caplog):
    with caplog.at_level(logging.INFO, logger="kestrel_trio.model"):
        model = load_model(QUANT_GGUF)  # nine storage forms, from F16 and BF16 to Q5_K
    line = next(r.getMessage() for r in caplog.records if "product kernels (" in r.getMessage())
    report = model.kernel_report()
    held = {"F32" if form == "float32" else form for form in resident_bytes(model.decoder.weights)}
    assert set(report["products"]) == held and len(held) == 9
    for form, kernel in report["products"].items():
        assert kernel == _expected_kernel(form), form
        assert f"{form} {kernel}" in line
    assert line.endswith(f"CPU: {report['cpu']}")
    features = cpu.this_cpu().features
    assert report["cpu"].split()[1:] == list(features)


async def test_health_names_the_kernels_and_the_cpu_features() -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(QUANT_GGUF) as server:
            body = (await fetch(server.port, "GET", "/health")).json()
    assert body["weights"] == "gguf"
    assert body["products"] and all(kernel == _expected_kernel(form) for form, kernel in body["products"].items())
    name, *features = body["cpu"].split()
    assert features == list(cpu.this_cpu().features)
    if platform.machine() in ("aarch64", "arm64"):
        assert "neon" in features  # every aarch64 CPU has it: the detection read the auxiliary vector
        assert name == cpu.this_cpu().name
