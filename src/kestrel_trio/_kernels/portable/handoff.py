"""Handing an integer product's share to another thread in compiled code: a spinning hand-off, no wake-up.

Theory of operation: a one-sequence decode step of a Qwen3-0.6B shares about
a hundred products a token between two threads. Through Python (a queue, a
thread's wake-up, the GIL) one hand-off costs tens of microseconds, several
milliseconds a token; here it costs about a microsecond. A product is cut
into chunks of weight rows (the job rows of a table, int64 [chunks,
FIELDS]); the caller and the helpers take chunks from one counter until none
is left, so a helper that is late (asleep, or kept off its core by another
process) costs nothing but its share: the caller runs what it has not taken.

Each helper waits in compiled code, without the GIL (:func:`serve`), reading
``ctrl`` (int64 [(1 + helpers) * LINE], 128-byte lines, so that the threads'
writes do not share a cache line). Line 0 is the pool's: ``LOCK`` (1 while a
caller uses the pool), the table's address, its chunk count, ``NEXT`` (the
next chunk to take), ``ALONE`` (tables to run alone). Line ``1 + h`` is helper ``h``'s: ``STATE`` (``IDLE``:
spinning, ready; ``POSTED``: a table to help with; ``RUNNING``; ``DONE``: out
of it, not yet seen; ``ASLEEP``: back in Python, blocked on its queue;
``STOP``), ``WAKE`` (1 once a caller found it asleep and owes it a wake-up),
``YIELD`` (1 when Python work waits in its queue).

:func:`run_shared` takes the pool (compare-and-swap ``LOCK`` 0 -> 1; a caller
that finds it taken runs its table alone), posts the table to each idle
helper (``IDLE`` -> ``POSTED``), takes chunks itself, then for each helper
either takes the post back (``POSTED`` -> ``IDLE``: it never started) or
waits for its ``DONE`` (``RUNNING`` helpers finish their chunk and leave).
A helper starts only by ``POSTED`` -> ``RUNNING``, so exactly one of the two
swaps wins. A helper that has spun ``spins`` rounds with nothing to do goes to
sleep (``IDLE`` -> ``ASLEEP``), so an idle server does not burn a core; the
caller that next finds it asleep reports it, and the Python side wakes it
(kestrel_trio._model.products.product_threads).

A helper that started a chunk and then was kept off its core (another
process took it) makes the caller wait for that chunk, so the caller reports
how long it waited, and the Python side, where such waits are most of a
call, sets ``ALONE``: that many next tables run on the caller alone, then the
helpers are tried again (kestrel_trio._model.products.product_threads).

The stores before ``POSTED`` and ``DONE`` are published by those atomic
operations (release; the reads after them acquire), so a helper sees the
table and the caller sees the helper's results.

A job is one integer kernel call on N activation rows: a table row of
FIELDS int64 (the kernel's job entry's address: a ``cfunc`` each integer
kernel module defines beside its kernel, taking the row's address; the
form; the addresses and sizes of the weight rows, the quantized activations
and the output). :func:`job_arrays` turns a row back into the kernel's
arguments. The job entries live in the kernel modules (numba invalidates a
cached function only when its own file changes): the row's layout is
:data:`LAYOUT`, which each of them names (:func:`entry` checks it), so a change
here must be made there too, which refreshes their caches.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["LAYOUT", "FIELDS", "LINE", "JOB_SIGNATURE", "job_arrays", "run_shared", "serve", "nudge", "wake_up",
           "stop", "spin_rounds", "entry", "SLEPT", "YIELDED", "STOPPED"]

LAYOUT = "job-2"  # the job row's layout below; the kernel modules' job entries check it
# A job row: the entry's address, the form, weight rows (address, rows, bytes a row), activations (int8 address,
# columns, scales' address, block sums' address, rows), the rows [start, stop) of the weight, the output's
# address (of its row 0's first column) and its rows' stride (float32 values).
(ENTRY, FORM, DATA, ROWS, ROW_BYTES, XQ, COLS, XD, XS, N, START, STOP_ROW, OUT, OUT_STRIDE) = range(14)
FIELDS = 16
LINE = 16  # int64 a control line: 128 bytes
LOCK, TABLE, TOTAL, NEXT, ALONE = range(5)  # the pool's line (line 0)
STATE, WAKE, YIELD = range(3)  # a helper's line
IDLE, POSTED, RUNNING, DONE, ASLEEP, STOP = range(6)
# What serve() returns: asleep for want of work, asked back to Python (YIELD), stopped.
SLEPT, YIELDED, STOPPED = range(3)

JOB_SIGNATURE = types.void(types.CPointer(types.int64))  # a job entry: the address of its row


def _address(context, builder, array_type, array, index):
    """An LLVM pointer to element ``index`` of a one-dimensional int64 array."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def _load(typingctx, array, index):
    """``array[index]`` read atomically, acquiring what its writer released before."""
    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)
    return types.int64(array, index), codegen


@intrinsic
def _store(typingctx, array, index, value):
    """``array[index] = value`` atomically, releasing the stores before it."""
    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


@intrinsic
def _swap(typingctx, array, index, expected, new):
    """Compare-and-swap ``array[index]`` from ``expected`` to ``new`` (sequentially consistent): whether it did."""
    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.zext(builder.extract_value(pair, 1), ir.IntType(8))
    return types.uint8(array, index, expected, new), codegen


@intrinsic
def _take(typingctx, array, index):
    """``array[index]`` before adding one to it, atomically (sequentially consistent): the next chunk."""
    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, ir.Constant(ir.IntType(64), 1), "seq_cst")
    return types.int64(array, index), codegen


_MACHINE = platform.machine()


@intrinsic
def _pause(typingctx):
    """A spin-wait hint (``pause`` on x86-64, ``yield`` on aarch64, as LLVM intrinsics: no assembly parser
    needed): the core eases off while it waits."""
    def codegen(context, builder, signature, args):
        if _MACHINE in ("x86_64", "AMD64"):
            hint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                  "llvm.x86.sse2.pause")
            builder.call(hint, [])
        elif _MACHINE in ("aarch64", "arm64"):
            hint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(32)]),
                                                  "llvm.aarch64.hint")
            builder.call(hint, [ir.Constant(ir.IntType(32), 1)])  # 1: YIELD
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _call_entry(typingctx, entry, row):
    """Call the job entry at address ``entry`` with the address ``row`` of its job row."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        function = ir.FunctionType(ir.VoidType(), [i64.as_pointer()])
        target = builder.inttoptr(args[0], function.as_pointer())
        builder.call(target, [builder.inttoptr(args[1], i64.as_pointer())])
        return context.get_dummy_value()
    return types.void(entry, row), codegen


@intrinsic
def _voidptr(typingctx, address):
    """The address ``address`` (int64) as a pointer, for carray."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(address), codegen


@njit(nogil=True, cache=True, inline="always")
def job_arrays(row):
    """A job row (a CPointer(int64) to FIELDS int64) as its kernel's arguments: (form, data uint8 [rows,
    row_bytes], xq int8 [N, cols], xd, xs float32 [N, cols/32], start, stop, out float32 [N, stop-start] (rows
    OUT_STRIDE apart))."""
    job = carray(row, (FIELDS,))
    cols, n = job[COLS], job[N]
    data = carray(_voidptr(job[DATA]), (job[ROWS], job[ROW_BYTES]), np.uint8)  # [rows, row_bytes]
    xq = carray(_voidptr(job[XQ]), (n, cols), np.int8)  # [N, cols]
    xd = carray(_voidptr(job[XD]), (n, cols // 32), np.float32)  # [N, cols/32]
    xs = carray(_voidptr(job[XS]), (n, cols // 32), np.float32)  # [N, cols/32]
    # [N, stride] from this job's first column; only its [N, stop-start] are touched
    out = carray(_voidptr(job[OUT]), (n, job[OUT_STRIDE]), np.float32)[:, : job[STOP_ROW] - job[START]]
    return job[FORM], data, xq, xd, xs, job[START], job[STOP_ROW], out


@njit(nogil=True, cache=True)
def _take_chunks(ctrl, table, total):
    """Run chunks of ``table`` (the address of int64 [total, FIELDS]) while any is left to take."""
    while True:
        j = _take(ctrl, NEXT)
        if j >= total:
            return
        row = table + j * FIELDS * 8
        _call_entry(carray(_voidptr(row), (FIELDS,), np.int64)[ENTRY], row)


@njit(nogil=True, cache=True)
def run_shared(ctrl, jobs):
    """Run the job rows of ``jobs`` (int64 [chunks, FIELDS]), the helpers of ``ctrl`` (int64 [(1 + helpers) *
    LINE]) taking chunks too; return once all are done. Returns (a bit mask of the helpers found asleep and owed
    a wake-up, the rounds of :func:`spin_rounds`' kind spent waiting for helpers after the last chunk). While
    ``ALONE`` is above zero the table runs here alone and it counts down."""
    helpers = ctrl.shape[0] // LINE - 1
    total = jobs.shape[0]
    if not _swap(ctrl, LOCK, 0, 1):  # another caller has the pool
        _take_all(jobs)
        return 0, 0
    if ctrl[ALONE] > 0:  # backing off: a helper was late lately
        ctrl[ALONE] -= 1
        _take_all(jobs)
        _store(ctrl, LOCK, 0)
        return 0, 0
    ctrl[TABLE] = jobs.ctypes.data
    ctrl[TOTAL] = total
    _store(ctrl, NEXT, 0)
    posted = np.zeros(helpers, dtype=np.uint8)
    asleep = 0
    for h in range(helpers):
        line = (1 + h) * LINE
        if _swap(ctrl, line + STATE, IDLE, POSTED):
            posted[h] = 1
        elif _load(ctrl, line + STATE) == ASLEEP and _swap(ctrl, line + WAKE, 0, 1):
            asleep |= 1 << h
    _take_chunks(ctrl, jobs.ctypes.data, total)
    waited = 0
    for h in range(helpers):
        line = (1 + h) * LINE
        if posted[h] and not _swap(ctrl, line + STATE, POSTED, IDLE):  # it started: wait until it is out
            while _load(ctrl, line + STATE) != DONE:
                _pause()
                waited += 1
            _store(ctrl, line + STATE, IDLE)
    _store(ctrl, LOCK, 0)
    return asleep, waited


@njit(nogil=True, cache=True)
def _take_all(jobs):
    for j in range(jobs.shape[0]):
        _call_entry(jobs[j, ENTRY], jobs.ctypes.data + j * FIELDS * 8)


@njit(nogil=True, cache=True)
def serve(ctrl, h, spins):
    """Helper ``h``'s wait in compiled code: help with what is posted to it; return SLEPT after ``spins`` idle
    rounds (its state then ASLEEP), YIELDED when Python work waits for it (ASLEEP too), STOPPED on STOP."""
    line = (1 + h) * LINE
    idle = 0
    while True:
        state = _load(ctrl, line + STATE)
        if state == POSTED:
            if _swap(ctrl, line + STATE, POSTED, RUNNING):
                _take_chunks(ctrl, ctrl[TABLE], ctrl[TOTAL])
                _store(ctrl, line + STATE, DONE)
            idle = 0
        elif state == STOP:
            return STOPPED
        elif state == IDLE:
            if _load(ctrl, line + YIELD) == 1 and _swap(ctrl, line + STATE, IDLE, ASLEEP):
                _store(ctrl, line + YIELD, 0)
                return YIELDED
            idle += 1
            if idle > spins and _swap(ctrl, line + STATE, IDLE, ASLEEP):
                return SLEPT
            _pause()
        else:  # DONE: its caller has not seen it yet
            _pause()


@njit(nogil=True, cache=True)
def nudge(ctrl, h):
    """Ask helper ``h`` back to Python (work waits in its queue): it returns from :func:`serve` when idle."""
    _store(ctrl, (1 + h) * LINE + YIELD, 1)


@njit(nogil=True, cache=True)
def wake_up(ctrl, h):
    """Helper ``h``, back from its queue: ready again (IDLE), owed nothing."""
    _swap(ctrl, (1 + h) * LINE + STATE, ASLEEP, IDLE)
    _store(ctrl, (1 + h) * LINE + WAKE, 0)


@njit(nogil=True, cache=True)
def stop(ctrl, h):
    """Stop helper ``h``: :func:`serve` returns STOPPED."""
    _store(ctrl, (1 + h) * LINE + STATE, STOP)


@njit(nogil=True, cache=True)
def spin_rounds(rounds):
    """``rounds`` idle rounds of :func:`serve`'s wait (a load and a pause), to time them."""
    flag = np.zeros(1, dtype=np.int64)
    seen = 0
    for _ in range(rounds):
        seen += _load(flag, 0)
        _pause()
    return seen


_entries: dict = {}  # a kernel module's job function -> its cfunc (kept: its machine code must stay loaded)


def entry(job_function, layout: str) -> int:
    """The address of ``job_function``'s (a kernel module's job entry: ``(row) -> None``, written for job rows of
    ``layout``) compiled ``cfunc``, compiled or loaded from numba's cache on first use; its own module is the
    cache's key."""
    if layout != LAYOUT:
        raise RuntimeError(f"{job_function.__module__}'s job entries read job rows of layout {layout!r}, "
                           f"kestrel_trio._kernels.portable.handoff writes {LAYOUT!r}: update them together")
    found = _entries.get(job_function)
    if found is None:
        from numba import cfunc

        found = _entries[job_function] = cfunc(JOB_SIGNATURE, nogil=True, cache=True)(job_function)
    return found.address
