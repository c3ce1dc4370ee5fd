"""Fixtures shared by the engine, server and reliability suites (the two models, the step gate), and the CI skip rule."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from step_gate import StepGate

import kestrel_trio.engine.engine as engine_module
from kestrel_trio.model import Model, load_demo_model, load_model

FIXTURE_CHECKPOINT = Path(__file__).resolve().parent / "fixtures" / "qwen3_bf16_tied"


@pytest.fixture(scope="session", autouse=True)
def _the_default_port_is_taken():
    """The suite runs as if the quick start's server held 127.0.0.1:8000 (the README runs the tests beside it):
    a test that binds the default port instead of port 0 fails here, wherever it runs."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8000))
        holder.listen(1)
    except OSError:
        pass  # taken already, perhaps by that very server: the same condition
    try:
        yield
    finally:
        holder.close()


@pytest.fixture(scope="session", autouse=True)
def _exact_products():
    """The exact products of quantized weights on every host (not the default "auto"): the suites compare
    logits with transformers' goldens within 1e-4 and greedy tokens exactly, which the integer products
    (the default on aarch64 and on x86-64 with AVX2) approach only within the activations' rounding. Their own
    tests set them (tests/gguf_in/test_integer_fidelity.py, tests/model/test_integer_products.py). The default
    of models loaded without their own products, and of products run outside any model."""
    from kestrel_trio.model import set_products

    set_products("exact")
    yield
    set_products("auto")


@pytest.fixture(scope="module")
def tiny_model() -> Model:
    """The fixture checkpoint: context 512, vocab 512, a tokenizer and the Qwen3 chat template."""
    return load_model(FIXTURE_CHECKPOINT)


@pytest.fixture(scope="module")
def other_tiny_model() -> Model:
    """Another fixture Qwen3 with the same 512-row vocabulary (no tokenizer) and other weights: a draft model
    whose drafts are mostly wrong (speculative decoding)."""
    return load_model(FIXTURE_CHECKPOINT.parent / "qwen3_fp32")


@pytest.fixture(scope="module")
def demo_model() -> Model:
    """The built-in demo model: the real Qwen3 tokenizer, random weights, context 8192."""
    return load_demo_model()


@pytest.fixture(scope="module", params=["tiny_model", "demo_model"])
def model(request: pytest.FixtureRequest) -> Model:
    """Each of the two models in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> StepGate:
    """A :class:`StepGate` installed as the engine's model step for this test."""
    step_gate = StepGate(engine_module.step_generations)
    monkeypatch.setattr(engine_module, "step_generations", step_gate)
    return step_gate


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Once, plainly, after the results (``-q`` too): the CPU the kernels are compiled for, and which kernels this
    host runs and which it cannot (their tests skip, marked host_cpu). Only after a run that loaded the kernels:
    asking would load them (numba, and a compilation where its cache is cold) for runs that never use them."""
    import sys

    if "kestrel_trio._kernels.portable.products" not in sys.modules:
        return
    from kestrel_trio import _kernels

    terminalreporter.write_sep("-", f"kernels: CPU {_kernels.describe_cpu()}")
    for family, reason in _kernels.optional_kernels().items():
        terminalreporter.write_line(f"{family}: {'runs here' if reason is None else 'not here: ' + reason}")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under CI=true a skip is a failure: CI has every tool and download a test can ask for.

    On a user's machine a test whose tool (haproxy, chromium) or download (the
    package registry) is missing skips with the reason; CI installs all of them,
    so a skip there means the run proved less than it claims. The one exception is
    a test marked ``host_cpu``: it needs an instruction set (AVX-512, x86-64) that
    CI's machine, drawn anew each session, may lack, and no install supplies a CPU.
    """
    outcome = yield
    report = outcome.get_result()
    if (_in_ci() and report.skipped and not hasattr(report, "wasxfail")
            and item.get_closest_marker("host_cpu") is None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"
