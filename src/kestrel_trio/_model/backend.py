"""One model's kernel settings: which products its quantized weights take and how its prefill multiplies.

A :class:`Backend` is built when a model loads (kestrel_trio.model.load_model's ``products`` and
``prefill_precision``) and held by its :class:`~kestrel_trio._model.forward.Decoder`, so that two models in one
process (a main model and its speculative draft, or two servers) each keep their own: a second load never changes
the first model's products.

How the settings reach the products: :func:`~kestrel_trio._model.forward.forward` (and the other entries that run
a model's weights: its vision tower, the load's warm-up) runs inside ``decoder.backend.active()``, and
kestrel_trio._model.matmul reads :func:`current` once at each product's entry, before any work goes to the
product threads, and hands the values on explicitly. A context variable, not a module global: each thread and
each trio task sees the backend of the model it is running, and a worker thread started for another model sees
that model's.

What stays process-wide, because it is the same for every model: the CPU's features and the kernel plan made
from them (kestrel_trio._kernels.plan.this_plan), the compiled numba module and its float16 table
(kestrel_trio._kernels), and the compiled products themselves, cached by (form, kernel), so that two modes can
coexist. Code that runs outside any model (tools, tests calling ``linear`` directly) takes the defaults that
:func:`set_default_products` and :func:`set_default_prefill_precision` set: also the settings of a model loaded
without its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Generator, Iterator
from typing import TypeVar

import attrs

from kestrel_trio import _kernels

__all__ = ["Backend", "current", "PREFILL_PRECISIONS", "set_default_products", "default_products",
           "set_default_prefill_precision", "prefill_precision"]

T = TypeVar("T")

# How products of more than 32 rows (prefill chunks) multiply float32 weights: "fp32" (BLAS), or "bf16": both
# operands rounded to bf16 and multiplied in AMX tiles (kestrel_trio._kernels.x86.tiles), on CPUs that have them.
# Decode steps and speculative verify steps (at most 32 rows) stay float32 either way.
PREFILL_PRECISIONS = ("fp32", "bf16")


def _check_products(_instance, _attribute, mode: str) -> None:
    if mode not in _kernels.PRODUCT_MODES:
        raise ValueError(f"products must be one of {', '.join(_kernels.PRODUCT_MODES)}, got {mode!r}")


def _check_precision(_instance, _attribute, precision: str) -> None:
    if precision not in PREFILL_PRECISIONS:
        raise ValueError(f"unknown prefill precision {precision!r}; one of {', '.join(PREFILL_PRECISIONS)}")
    if precision == "bf16":
        reason = _kernels.enable_tiles()
        if reason is not None:
            raise ValueError(f"bf16 prefill needs AMX tiles: {reason}")


@attrs.frozen
class Backend:
    """The kernel settings of one loaded model (immutable: a model's settings are fixed at its load).

    Attributes:
        products: which products quantized weights take, one of kestrel_trio._kernels.PRODUCT_MODES: "exact"
            (expanded to float32, multiplied in float32), "integer" (activations quantized to int8 per block of
            32, integer block sums) or "auto" (integer where this CPU's kernel plan says it wins, else exact).
        prefill_precision: how products of more than 32 rows multiply float32 weights, one of
            PREFILL_PRECISIONS ("bf16" only where AMX tiles run).

    Raises:
        ValueError: an unknown mode or precision, or "bf16" where the tiles cannot run (the reason, in one line).
    """

    products: str = attrs.field(default="auto", validator=_check_products)
    prefill_precision: str = attrs.field(default="fp32", validator=_check_precision)

    @contextlib.contextmanager
    def active(self) -> Iterator[Backend]:
        """This backend as :func:`current` inside (in this thread or task only), the one before after."""
        token = _active.set(self)
        try:
            yield self
        finally:
            _active.reset(token)

    def run_steps(self, steps: Generator[None, None, T]) -> Generator[None, None, T]:
        """``steps`` (a generator a driver advances, e.g. the vision tower's blocks) with each step run in this
        backend: entered and left around every ``next``, never held across a yield, since the driver may
        resume it in another thread or task (whose context is not the one it was entered in)."""
        while True:
            with self.active():
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
            yield


_active: contextvars.ContextVar[Backend | None] = contextvars.ContextVar("kestrel_backend", default=None)
# The defaults: what code outside any model runs with, and what a model loaded without its own settings takes.
# Replaced whole (a Backend is immutable), never changed in place: a model keeps the one it was built with.
_defaults = [Backend()]


def current() -> Backend:
    """The backend of the model running in this thread or task, or the defaults outside any model."""
    found = _active.get()
    return found if found is not None else _defaults[0]


def set_default_products(mode: str) -> None:
    """The products of code outside any model and of models loaded later without their own (see :class:`Backend`).

    Raises:
        ValueError: an unknown mode.
    """
    _defaults[0] = attrs.evolve(_defaults[0], products=mode)


def default_products() -> str:
    """The mode :func:`set_default_products` set ("auto" at first)."""
    return _defaults[0].products


def set_default_prefill_precision(precision: str) -> None:
    """The prefill precision of code outside any model and of models loaded later without their own.

    Raises:
        ValueError: an unknown precision, or "bf16" where the tiles cannot run (the reason, in one line).
    """
    _defaults[0] = attrs.evolve(_defaults[0], prefill_precision=precision)


def prefill_precision() -> str:
    """The precision :func:`set_default_prefill_precision` set ("fp32" until then)."""
    return _defaults[0].prefill_precision
