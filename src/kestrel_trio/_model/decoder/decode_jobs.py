"""A decode step's integer products as compiled job tables: shared among the product threads without Python.

Theory of operation: a one-sequence decode step's products of one input
(q, k and v; gate and up; o; down; the head) become one table of job rows
(kestrel_trio._kernels.handoff), each a chunk of one matrix part's weight rows
with the addresses of the step's fixed buffers: the quantized input, the
output. The step then shares them with one call,
ProductThreads.run_jobs: the product threads take chunks from one counter in
compiled code, so a hand-off costs about a microsecond instead of a thread's
wake-up, and a helper that is late costs only the chunks it did not take.
Each chunk runs the same compiled kernel over the same rows as the caller's
own calls would, so the logits are the same bit for bit whoever runs it.

The tables hold raw addresses: they live with the buffers they point into
(the step's per-thread buffers hold both) and the weights (held by the plan).
"""

from __future__ import annotations

import numpy as np

from kestrel_trio import _kernels

__all__ = ["job_table", "output_offsets", "aim", "CHUNKS_A_THREAD"]

CHUNK_BYTES = 256 * 1024  # weight bytes a chunk: a few microseconds' streaming, so a late helper's last chunk is
# a short wait for the others, and thousands of chunks' calls and counter updates cost far less than the product
CHUNKS_A_THREAD = 4  # at least this many chunks a product thread (a matrix's rows allowing)
_CHUNK_MULTIPLE = 8  # a chunk's rows: a multiple of the widest kernels' rows a pass (eight), so none is left over
_MIN_CHUNK = 16  # rows


def job_table(products: list[tuple[object, np.ndarray]], quantized: tuple, mode: str,
              threads: int) -> np.ndarray | None:
    """The job rows (int64 [chunks, FIELDS]) of ``products``: (the step's _Matrix, its output float32 [1, rows],
    a view of a step buffer) for the quantized input ``quantized`` = (xq int8 [1, cols], xd, xs float32
    [1, cols/32]), in products ``mode``, cut for ``threads`` product threads; None where a part has no job
    entry (an exact or portable product) or a buffer is not contiguous."""
    from kestrel_trio._kernels import handoff

    xq, xd, xs = quantized
    rows_total = sum(matrix.rows for matrix, _ in products)
    table = []
    for matrix, out in products:
        if matrix.parts is None or matrix.bias is not None:
            return None
        for part, (_, first, rows) in zip(matrix.matrix.parts, matrix.parts):
            found = _kernels.integer_job(part.form, mode)
            data = part.data
            view = out[:, first : first + rows]  # [1, rows], this part's stretch of the output
            if found is None or not data.flags.c_contiguous or not view.flags.c_contiguous:
                return None
            entry, form_id = found
            chunk = min(CHUNK_BYTES // data.shape[1], rows_total // (threads * CHUNKS_A_THREAD))
            chunk = max(_MIN_CHUNK, chunk // _CHUNK_MULTIPLE * _CHUNK_MULTIPLE)
            for start in range(0, rows, chunk):
                stop = min(start + chunk, rows)
                row = np.zeros(handoff.FIELDS, dtype=np.int64)
                row[[handoff.ENTRY, handoff.FORM, handoff.DATA, handoff.ROWS, handoff.ROW_BYTES]] = (
                    entry, form_id, data.ctypes.data, data.shape[0], data.shape[1])
                row[[handoff.XQ, handoff.COLS, handoff.XD, handoff.XS]] = (
                    xq.ctypes.data, xq.shape[1], xd.ctypes.data, xs.ctypes.data)
                row[[handoff.START, handoff.STOP_ROW, handoff.OUT]] = (start, stop, view[:, start:].ctypes.data)
                table.append(row)
    return np.stack(table) if table else None


def output_offsets(table: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Each job row's output address in ``table`` as an offset (bytes, int64 [chunks]) from ``out``'s start."""
    from kestrel_trio._kernels import handoff

    return table[:, handoff.OUT] - out.ctypes.data


def aim(table: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    """Point ``table``'s job rows at ``out`` (a new array of the shape it was built for), ``offsets`` from
    :func:`output_offsets`."""
    from kestrel_trio._kernels import handoff

    table[:, handoff.OUT] = offsets + out.ctypes.data
