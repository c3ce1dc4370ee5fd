"""Integer products as compiled job tables: shared among the product threads without Python.

Theory of operation: a product of a few activation rows with GGUF rows that
this CPU multiplies with its own integer kernel becomes a table of job rows
(kestrel_trio._kernels.portable.handoff): each a chunk of one matrix part's weight rows
with the addresses of the quantized activations and of the output.
ProductThreads.run_jobs then shares the table with one call: the product
threads take chunks from one counter in compiled code, so a hand-off costs
about a microsecond instead of a thread's wake-up (tens of microseconds), and
a helper that is late costs only the chunks it did not take. Each chunk runs
the kernel the caller's own call would, over the same rows, so the result is
the same bit for bit whoever runs it.

What depends only on the weights (each chunk's kernel entry, form, rows) is
settled once (:class:`JobRows`); a table for given activations and output is
a copy with their addresses filled in (:meth:`JobRows.table_for`). A table
holds raw addresses: whoever runs it keeps its arrays alive meanwhile.
"""

from __future__ import annotations

import numpy as np

from kestrel_trio import _kernels

__all__ = ["JobRows", "job_rows", "matrix_job_rows", "CHUNK_BYTES", "CHUNKS_A_THREAD"]

# Weight bytes a chunk, at most, and at least this many chunks a product thread (a matrix's rows allowing). Few
# long chunks stream faster than many short ones: on the 2-core Zen 5, Qwen3-0.6B Q4_K_M's Q6_K head shared in
# 4 MiB chunks took 2.9-3.0 ms a token, in 256 KiB chunks 3.3-3.5 ms (AVX2: 3.0-3.4 against 5.0 ms), and the
# layers' products likewise. Two a thread still leave a late helper's share to the others but for one chunk.
CHUNK_BYTES = 4 << 20
CHUNKS_A_THREAD = 2
_CHUNK_MULTIPLE = 8  # a chunk's rows: a multiple of the widest kernels' rows a pass (eight), so none is left over
_MIN_CHUNK = 16  # rows


class JobRows:
    """The weight side of a product's job rows: int64 [chunks, FIELDS] with each chunk's entry, form, weight rows
    and row range, and each chunk's first output column (int64 [chunks])."""

    def __init__(self, static: np.ndarray, columns: np.ndarray) -> None:
        self.static, self.columns = static, columns

    def table_for(self, quantized: tuple, out: np.ndarray) -> np.ndarray:
        """A job table (int64 [chunks, FIELDS]) for the activations ``quantized`` = (xq int8 [N, cols], xd, xs
        float32 [N, cols/32], C-contiguous) into ``out`` float32 [N, out columns] (its rows contiguous)."""
        from kestrel_trio._kernels.portable import handoff as h

        xq, xd, xs = quantized
        table = self.static.copy()
        table[:, h.XQ], table[:, h.COLS], table[:, h.XD], table[:, h.XS] = (
            xq.ctypes.data, xq.shape[1], xd.ctypes.data, xs.ctypes.data)
        table[:, h.N] = xq.shape[0]
        self.aim(table, out)
        return table

    def aim(self, table: np.ndarray, out: np.ndarray) -> None:
        """Point ``table``'s chunks at ``out`` (a new array of the shape the table was made for)."""
        from kestrel_trio._kernels.portable import handoff as h

        table[:, h.OUT] = out.ctypes.data + self.columns * out.itemsize
        table[:, h.OUT_STRIDE] = out.strides[0] // out.itemsize


def job_rows(parts: list, mode: str, threads: int) -> JobRows | None:
    """The job rows of GGUF row ``parts`` (each with ``form`` and ``data`` uint8 [rows, row_bytes]) stacked into
    one output, in products ``mode``, chunked for ``threads`` product threads; None where a part has no job entry
    (the exact products, the portable reference) or its rows are not contiguous."""
    from kestrel_trio._kernels.portable import handoff as h

    rows_total = sum(part.data.shape[0] for part in parts)
    static, columns, first = [], [], 0
    for part in parts:
        found = _kernels.integer_job(part.form, mode)
        data = part.data
        if found is None or not data.flags.c_contiguous:
            return None
        rows = data.shape[0]
        chunk = min(CHUNK_BYTES // data.shape[1], rows_total // (threads * CHUNKS_A_THREAD))
        chunk = max(_MIN_CHUNK, chunk // _CHUNK_MULTIPLE * _CHUNK_MULTIPLE)
        for start in range(0, rows, chunk):
            row = np.zeros(h.FIELDS, dtype=np.int64)
            row[[h.ENTRY, h.FORM, h.DATA, h.ROWS, h.ROW_BYTES, h.START, h.STOP_ROW]] = (
                *found, data.ctypes.data, rows, data.shape[1], start, min(start + chunk, rows))
            static.append(row)
            columns.append(first + start)
        first += rows
    return JobRows(np.stack(static), np.array(columns, dtype=np.int64)) if static else None


def matrix_job_rows(matrix, mode: str, threads: int) -> JobRows | None:
    """:func:`job_rows` of a PackedMatrix's parts (None where a part is not GGUF rows), made at the matrix's first
    product in ``mode`` with ``threads`` product threads and kept with it (``matrix.kernels``, beside its parts'
    compiled products: kestrel_trio._model.products.matmul)."""
    key = ("jobs", mode, threads)
    if key not in matrix.kernels:  # two threads may both make it: harmless
        ggml = all(hasattr(part, "ggml_type") for part in matrix.parts)
        matrix.kernels[key] = job_rows(list(matrix.parts), mode, threads) if ggml else None
    return matrix.kernels[key]
