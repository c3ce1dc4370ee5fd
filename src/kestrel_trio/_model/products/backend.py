"""One model's kernel settings and state: its products mode, prefill precision, product threads, small-batch call.

A :class:`Backend` is built when a model loads (kestrel_trio.model.load_model's ``products``,
``prefill_precision`` and ``blas_threads``) and held by its
:class:`~kestrel_trio._model.decoder.forward.Decoder`, so that two models in one process (a main model and its
speculative draft, or two servers) each keep their own: a second load never changes the first model's products,
its product threads, or the small-batch call timed on its weights and the share choices timed on its steps.

How the settings reach the products: :func:`~kestrel_trio._model.decoder.forward.forward` (and the other entries
that run a model's weights: its vision tower, the load's warm-up) runs inside ``decoder.backend.active()``, and
kestrel_trio._model.products.matmul reads :func:`current` once at each product's entry, before any work goes to the
product threads, and hands the values on explicitly. A context variable, not a module global: each thread and
each trio task sees the backend of the model it is running, and a worker thread started for another model sees
that model's.

Each model's backend carries the kernel plan it was built with (:attr:`Backend.plan`, this host's at its load:
kestrel_trio._kernels.plan.this_plan), which chooses the kernel of each of its weights' forms. What stays
process-wide, because it is the same for every model: the CPU's features, the compiled numba module and its
float16 table (kestrel_trio._kernels.loaded), and the compiled products themselves, cached by (form, kernel), so
that two modes can coexist; and numpy's BLAS thread count, one per process (the product threads of each model
switch it to one thread while they share a product and back to their own count after). Code that runs outside any model (tools,
tests calling ``linear`` directly) takes the defaults that :func:`set_default_products`,
:func:`set_default_prefill_precision` and :func:`set_product_threads` set: also the settings of a model loaded
without its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, TypeVar

import attrs

from kestrel_trio import _kernels
from kestrel_trio._model.products.product_threads import ProductThreads
from kestrel_trio._model.products.share_choice import ShareChooser

if TYPE_CHECKING:
    from kestrel_trio._kernels.plan import KernelPlan

__all__ = ["Backend", "SmallBatchChoice", "current", "defaults", "PREFILL_PRECISIONS", "set_default_products",
           "default_products", "set_default_prefill_precision", "prefill_precision", "set_product_threads",
           "product_threads"]

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


@attrs.define(eq=False)
class SmallBatchChoice:
    """How one model's 2-32-row float32 products run (kestrel_trio._model.products.matmul.small_batch_call), once
    chosen.

    Attributes:
        call: one of matmul.SMALL_BATCH_CALLS, or None until chosen.
        source: how it was chosen: "none", "synthetic" (stand-in weights), "sample" (the model's), "forced".
        timed_bytes: the bytes of the sample it was timed on ("sample").
        lock: held while timing (the first products may come from several threads at once).
    """

    call: str | None = None
    source: str = "none"
    timed_bytes: int = 0
    lock: threading.Lock = attrs.field(factory=threading.Lock)


def _share_choosers() -> dict[str, ShareChooser]:
    """Per kind of plain product (one row, a batched decode step's few, a prefill chunk's many): the way it runs."""
    return {kind: ShareChooser() for kind in ("one", "few", "many")}


@attrs.frozen
class Backend:
    """The kernel settings of one loaded model (fixed at its load), and the timings its products keep.

    Attributes:
        products: which products quantized weights take, one of kestrel_trio._kernels.PRODUCT_MODES: "exact"
            (expanded to float32, multiplied in float32), "integer" (activations quantized to int8 per block of
            32, integer block sums) or "auto" (integer where this CPU's kernel plan says it wins, else exact).
        prefill_precision: how products of more than 32 rows multiply float32 weights, one of
            PREFILL_PRECISIONS ("bf16" only where AMX tiles run).
        threads: the product threads that share its large products, or None: the caller alone.
        thread_count: the threads a product is shared among, the caller included (None: never set).
        small_batch: its 2-32-row call, timed on its own weights at load (mutable: chosen once).
        share_choosers: per kind of plain product, whether sharing has cost less lately on its steps (mutable).
        plan: the kernel plan its products take (kestrel_trio._kernels.plan.KernelPlan: this host's, made at its
            load), or None: the host's, read at each product (the defaults, code outside any model, and where the
            compiled loops cannot run).

    Two backends are equal when their settings are: the threads, the small-batch call, the share choices and the
    plan (the host's, the same for every model) are left out.

    Raises:
        ValueError: an unknown mode or precision, or "bf16" where the tiles cannot run (the reason, in one line).
    """

    products: str = attrs.field(default="auto", validator=_check_products)
    prefill_precision: str = attrs.field(default="fp32", validator=_check_precision)
    threads: ProductThreads | None = attrs.field(default=None, eq=False, repr=False)
    thread_count: int | None = attrs.field(default=None, eq=False)
    small_batch: SmallBatchChoice = attrs.field(factory=SmallBatchChoice, eq=False, repr=False)
    share_choosers: dict[str, ShareChooser] = attrs.field(factory=_share_choosers, eq=False, repr=False)
    plan: KernelPlan | None = attrs.field(default=None, eq=False, repr=False)

    def for_model(self, products: str | None, prefill_precision: str | None) -> Backend:
        """A new model's backend: these settings (the defaults') but the ones given, these product threads, a
        small-batch call and share choices of its own, and this host's kernel plan (None where the compiled loops
        cannot run: its products take numpy's path).

        Raises:
            ValueError: an unknown mode or precision, or "bf16" where the tiles cannot run.
        """
        return Backend(products=products if products is not None else self.products,
                       prefill_precision=prefill_precision if prefill_precision is not None else self.prefill_precision,
                       threads=self.threads, thread_count=self.thread_count, plan=_host_plan())

    def product_kernels(self, forms) -> dict[str, str]:
        """For each storage form of ``forms`` (names in kestrel_trio._kernels.FORMS), the kernel its products take
        in this backend's mode by its plan: kestrel_trio._kernels.product_kernels (the start-up log, /health)."""
        return _kernels.product_kernels(forms, self.products, self.plan)

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


def _host_plan() -> KernelPlan | None:
    """This host's kernel plan, or None where the compiled loops cannot run (loads them: a model's load does)."""
    if not _kernels.ready():
        return None
    from kestrel_trio._kernels.plan import this_plan

    return this_plan()


_active: contextvars.ContextVar[Backend | None] = contextvars.ContextVar("kestrel_backend", default=None)
# The defaults: what code outside any model runs with, and what a model loaded without its own settings takes.
# Replaced whole (a Backend is immutable), never changed in place: a model keeps the one it was built with.
_defaults = [Backend()]


def defaults() -> Backend:
    """The defaults: what a model loaded without its own settings takes (:meth:`Backend.for_model`)."""
    return _defaults[0]


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


_threads_lock = threading.Lock()


def set_product_threads(count: int, set_blas_threads: Callable[[int], None] | None = None) -> None:
    """Share each large weight product among ``count`` threads (1: the caller alone), in the models loaded later
    and in products run outside any model. A model loaded before keeps its own threads.

    numpy's BLAS and its upcast ufuncs release the GIL, so the threads run on
    separate cores. BLAS should run ``count`` threads of its own for the
    products not shared (1 row, prefill) and one while these threads share
    one; ``set_blas_threads`` lets them switch it.

    Args:
        count: threads per product, the caller included.
        set_blas_threads: sets numpy's BLAS thread count, process-wide (None:
            BLAS is left as it is, which oversubscribes the cores unless it
            runs one thread).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"product threads must be a positive integer, got {count!r}")
    with _threads_lock:  # the pool replaced stops once no model holds it (ProductThreads)
        threads = ProductThreads(count, set_blas_threads) if count > 1 else None
        _defaults[0] = attrs.evolve(_defaults[0], threads=threads, thread_count=count)


def product_threads() -> int | None:
    """The count last given to :func:`set_product_threads`, or None if it was never called."""
    return _defaults[0].thread_count
