"""The x86-64 prefill kernels' glue: AMX tile products, the AVX-512 chunk products, the chunk attention.

Each kind is enabled once a process where the plan (kestrel_trio._kernels.plan)
takes it: compiled (or loaded from numba's cache) and checked against numpy
on a small case, so that no prompt waits for a compilation and a kernel that
disagrees stays off with the reason. The compiled modules live beside this one
(tiles, f32_chunks, f32_attention); their state is kestrel_trio._kernels.loaded's
(``_state``: the same for every model in the process). Re-exported
by kestrel_trio._kernels, where kestrel_trio._model calls them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kestrel_trio._kernels import loaded
from kestrel_trio._kernels.portable.spans import run_spans

__all__ = ["enable_tiles", "tile_product", "tile_pack", "tile_multiply", "TILE_BLOCK_ROWS", "TILE_K_STEP",
           "enable_chunk_products", "chunk_product", "CHUNK_WEIGHT_ROWS", "CHUNK_K_STEP", "enable_prefill_attention",
           "prefill_attention"]


# ---------------------------------------------------------------- bf16 tile products (AMX)

TILE_BLOCK_ROWS = 32  # weight rows a tile product takes at a time (kestrel_trio._kernels.x86.tiles.BLOCK_ROWS)
TILE_K_STEP = 32  # the product's K must be a multiple of this (tiles.K_STEP)


def enable_tiles() -> str | None:
    """Make the bf16 tile products (AMX) usable in this process: None if they are, else why not (one line)."""
    return _enable_once("tiles", _load_tiles)


def _load_tiles() -> tuple[object, str | None]:
    from kestrel_trio._kernels.plan import this_plan

    try:
        planned = this_plan().tiles
    except Exception as error:  # numba or llvmlite missing or unusable (the plan reads LLVM's host features)
        return None, f"numba cannot be imported ({type(error).__name__}: {error})"
    if planned.variant == "none":
        return None, planned.why
    try:
        from kestrel_trio._kernels.x86 import tiles
    except Exception as error:  # numba or llvmlite missing or unusable
        return None, f"numba cannot be imported ({type(error).__name__}: {error})"
    try:
        return tiles, tiles.enable() or _tiles_self_test(tiles)
    except Exception as error:  # e.g. numba told to compile for a CPU without AMX (NUMBA_CPU_NAME)
        return None, f"the AMX tile product cannot be compiled here ({type(error).__name__}: {error})"


def _enable_once(key: str, load: Callable[[], tuple[object, str | None]]) -> str | None:
    """None if the kernels' state holds a usable module at ``key``, else why not: ``load`` (module, reason) runs once
    a process.

    Under the state lock, so ``load`` must not call :func:`kestrel_trio._kernels.ready` (which takes it too). The
    module is kept only when its reason is None.
    """

    error_key = f"{key}_error"
    if key not in loaded._state and error_key not in loaded._state:
        with loaded._state_lock:
            if key not in loaded._state and error_key not in loaded._state:
                module, reason = load()
                if reason is None:
                    loaded._state[key] = module
                else:
                    loaded._state[error_key] = reason
    return loaded._state.get(error_key)


def _tiles_self_test(tiles) -> str | None:
    """Compile (or load) both tile products and check them on 33 x 64 times 64 x 64 against numpy; None if they agree.

    Both now, at start-up, so that no prompt waits for a compilation (float32 weights' and bf16 weights').
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 64)).astype(np.float32)  # [33, 64]
    w = _bf16_values(rng.standard_normal((64, 64)).astype(np.float32))  # [64, 64], values bf16 holds exactly
    packed = np.empty((4, 2, 16, 16, 2), dtype=np.uint16)  # [m_tiles, K/32, 16, 16, 2]
    tiles.pack_rows(x, packed)
    expected = _bf16_values(x) @ w.T  # [33, 64]
    for kernel, weights in ((tiles.product, w), (tiles.product_bits, (w.view(np.uint32) >> 16).astype(np.uint16))):
        got = np.empty((33, 64), dtype=np.float32)  # [33, 64]
        kernel(packed, 33, weights, 0, 64, got, tiles.CONFIG)
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-4):
            return f"the AMX tile product ({kernel.__name__}) disagreed with numpy in its self-test"
    return None


def _bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return (rounded << np.uint32(16)).astype(np.uint32).view(np.float32)


def tile_product(x: np.ndarray, matrices: list[np.ndarray], run: Callable[[list[Callable[[], None]]], None],
                 shares: Callable[[int], list[tuple[int, int]]]) -> np.ndarray:
    """``x`` [M, K] @ the matrices stacked by rows, transposed, through bf16 tiles: float32 [M, sum of their rows].

    ``x`` is rounded and packed once (:func:`tile_pack`) for all of them. Each matrix [N_i, K], float32 or
    bf16 bits (uint16), C-contiguous, K and N_i multiples of 32, its rows split into ``shares(N_i // 32)``
    ranges of 32-row blocks, run by ``run`` (a list of tasks, each on its own thread). :func:`enable_tiles` first.
    """
    m = x.shape[0]
    packed = tile_pack(np.ascontiguousarray(x, dtype=np.float32))
    out = np.empty((m, sum(w.shape[0] for w in matrices)), dtype=np.float32)  # [M, sum N_i]
    first = 0
    for w in matrices:
        tile_multiply(packed, m, w, out[:, first : first + w.shape[0]], run, shares)
        first += w.shape[0]
    return out


def tile_pack(x: np.ndarray) -> np.ndarray:
    """``x`` float32 [M, K], C-contiguous, rounded to bf16 and packed as the tile products take it."""

    m, k = x.shape
    m_tiles = -(-m // 32) * 2  # the kernel takes activation tiles two at a time
    packed = np.empty((m_tiles, k // TILE_K_STEP, 16, 16, 2), dtype=np.uint16)  # [m_tiles, K/32, 16, 16, 2]
    loaded._state["tiles"].pack_rows(x, packed)
    return packed


def tile_multiply(packed: np.ndarray, m: int, w: np.ndarray, out: np.ndarray,
                  run: Callable[[list[Callable[[], None]]], None],
                  shares: Callable[[int], list[tuple[int, int]]]) -> None:
    """``out`` [m, N] (any row stride, unit column stride) = the rows :func:`tile_pack` packed @ ``w``.T."""

    tiles = loaded._state["tiles"]
    kernel = tiles.product_bits if w.dtype == np.uint16 else tiles.product
    run([(lambda a=a, b=b: kernel(packed, m, w, a * TILE_BLOCK_ROWS, b * TILE_BLOCK_ROWS, out, tiles.CONFIG))
         for a, b in shares(w.shape[0] // TILE_BLOCK_ROWS) if b > a])


# ---------------------------------------------------------------- float32 prefill chunks (AVX-512)
# The shapes _kernels.x86.float32.chunks blocks (known without numba): chunk_product takes any shape whose K
# is a multiple of CHUNK_K_STEP, and multiplies with numpy the weight rows past whole blocks of CHUNK_WEIGHT_ROWS.
CHUNK_WEIGHT_ROWS = 14
CHUNK_K_STEP = 4


def enable_chunk_products() -> str | None:
    """Make the float32 chunk products (_kernels.x86.float32.chunks) usable: None if they are, else why not.

    They run on CPUs whose float32 rows take the "avx512" assembly (Intel's AVX-512 CPUs); compiled (or loaded
    from numba's cache) and checked against numpy here, so that no prompt waits for a compilation.
    """

    if "chunks" in loaded._state or "chunks_error" in loaded._state:
        return loaded._state.get("chunks_error")
    unusable = _chunks_unusable()  # outside the state lock: ready() takes it
    return _enable_once("chunks", lambda: (None, unusable) if unusable else _load_chunks())


def _load_chunks() -> tuple[object, str | None]:
    try:
        from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks

        if (f32_chunks.WEIGHT_ROWS, f32_chunks.K_STEP) != (CHUNK_WEIGHT_ROWS, CHUNK_K_STEP):
            raise AssertionError("kestrel_trio._kernels' CHUNK_ shapes and f32_chunks' disagree")
        return f32_chunks, _chunks_self_test(f32_chunks)
    except Exception as error:  # e.g. numba told to compile for another CPU (NUMBA_CPU_NAME)
        return None, f"the float32 chunk product cannot be compiled here ({type(error).__name__}: {error})"


def _chunks_unusable() -> str | None:

    if not loaded.ready():
        return loaded.unavailable_reason()
    from kestrel_trio._kernels.plan import this_plan

    planned = this_plan().chunk_products
    return None if planned.variant == "avx512" else planned.why


def _chunks_self_test(chunks) -> str | None:
    """The kernels, gathered and packed, on 64 x 1028 times 28 x 1028 (two K chunks, two weight blocks) against
    float64; None if they agree. The packed layers' norm compiles (or loads) here too: no prompt waits for it."""
    from kestrel_trio._kernels.x86.float32 import packed_rows

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1028)).astype(np.float32)  # [64, K]
    w = rng.standard_normal((28, 1028)).astype(np.float32)  # [28, K]
    out = np.empty((64, 28), dtype=np.float32)  # [64, 28]
    packed = chunks.pack(x, 64)  # [2, K, 32]
    chunks.product(w, packed, out, 0, 28)
    packed_out = np.empty((2, 28, chunks.ACTIVATION_ROWS), dtype=np.float32)  # [2, 28, 32]
    chunks.packed_product(w, packed, packed_out, 0, 2)
    packed_rows.rms_norm(packed, np.ones(1028, dtype=np.float32), 1e-6)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)  # [64, 28]
    for name, got in (("chunk", out), ("packed", packed_rows.unpack(packed_out, 64))):
        error = np.abs(got - exact).max() / np.abs(exact).max()
        if not error < 1e-5:
            return f"the float32 {name} product disagrees with numpy here (relative error {error:.1e})"
    return None


def chunk_product(x: np.ndarray, w: np.ndarray, run: Callable[[list[Callable[[], None]]], None],
                  shares: Callable[[int], list[tuple[int, int]]]) -> np.ndarray:
    """``x`` [M, K] @ ``w`` [N, K].T in float32: [M, N]. :func:`enable_chunk_products` first.

    ``w`` float32 with unit column stride, K a multiple of 4. The kernel takes ``x``'s rows in blocks of 32,
    the last block filled out with zero rows, but for one row past whole blocks, which numpy multiplies (one
    pass over the weights, as a decode step's), and the weight rows in blocks of 14, numpy multiplying those
    past whole blocks. Rows past whole blocks given to BLAS instead cost more: a few rows make OpenBLAS pack
    every weight on one thread (a 100-token prefill took 593 ms that way against 455 with BLAS alone, 2-core
    Xeon). ``run`` runs a list of tasks, each on its own thread; ``shares(items)`` splits items among them.

    Where the blocks of activation rows split evenly, at least f32_chunks.GROUP a thread, each thread packs
    and multiplies its own rows by every weight (:func:`_chunk_product_by_rows`); else the activations are
    packed once and the weight rows shared (:func:`_chunk_product_by_weight_rows`).
    """

    chunks = loaded._state["chunks"]
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, n = x.shape[0], w.shape[0]
    block = chunks.ACTIVATION_ROWS
    kernel_rows = (m // block if m % block == 1 else -(-m // block)) * block
    blocked_cols = n - n % chunks.WEIGHT_ROWS if kernel_rows else 0
    out = np.empty((max(m, kernel_rows), n), dtype=np.float32)  # [M rounded up to whole blocks, N]
    by_rows = shares(kernel_rows // block) if blocked_cols else []
    if len(by_rows) > 1 and len({b - a for a, b in by_rows}) == 1 and by_rows[0][1] >= chunks.GROUP:
        _chunk_product_by_rows(x, w, out, [(a * block, b * block) for a, b in by_rows], blocked_cols, run)
    else:
        _chunk_product_by_weight_rows(x, w, out, kernel_rows, blocked_cols, run, shares)
    return out[:m]


def _numpy_part(x: np.ndarray, w: np.ndarray, out: np.ndarray, rows: tuple[int, int], kernel_rows: int,
                blocked_cols: int) -> None:
    """What the kernel leaves of ``out``'s ``rows`` [start, stop): the weight rows past whole blocks of 14, and
    the row past whole blocks of 32 (when it is among them). In a task, under run's one-thread BLAS: BLAS's own
    threads would spin beside ours."""
    start, stop = rows
    top = min(stop, kernel_rows)
    if blocked_cols < w.shape[0] and top > start:
        out[start:top, blocked_cols:] = x[start:top] @ w[blocked_cols:].T  # [rows, N % 14]
    if start <= kernel_rows < stop:
        np.matmul(x[kernel_rows:stop], w.T, out=out[kernel_rows:stop])  # [1, N]


def _chunk_product_by_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, row_shares: list[tuple[int, int]],
                           blocked_cols: int, run: Callable[[list[Callable[[], None]]], None]) -> None:
    """Each thread packs its own share of whole blocks of activation rows and multiplies it by every weight row.

    Against sharing the weight rows, the packing runs on every thread at once instead of on the caller before
    the others start, and each thread writes whole rows of ``out``. 2-core Xeon, alternated in one process,
    faster in 6 rounds of 6 at each length: 128-token prefill 411-433 ms against 440-452, 512 tokens 1735-1793
    against 1833-1922, 100 tokens 404-424 against 407-433. Each thread reads every weight, so a share has at
    least GROUP blocks: a pass over the weights for as many activation rows as when the weight rows are shared.
    """

    chunks = loaded._state["chunks"]
    m = x.shape[0]
    kernel_rows = row_shares[-1][1]

    def task(start: int, stop: int) -> None:
        packed = chunks.pack(x[start : min(stop, m)], stop - start)  # [blocks, K, 32]
        chunks.product(w, packed, out[start:], 0, blocked_cols)
        _numpy_part(x, w, out, (start, m if stop == kernel_rows else stop), kernel_rows, blocked_cols)

    tasks = [(lambda a=a, b=b: task(a, b)) for a, b in row_shares]
    run([tasks[-1]] + tasks[:-1])  # the caller takes the last share, which has the row past whole blocks if any


def _chunk_product_by_weight_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, kernel_rows: int,
                                  blocked_cols: int, run: Callable[[list[Callable[[], None]]], None],
                                  shares: Callable[[int], list[tuple[int, int]]]) -> None:
    """The activations packed once; the weight rows, in blocks of 14, split into ``shares(N // 14)`` ranges."""

    chunks = loaded._state["chunks"]
    tasks = []
    if blocked_cols:
        packed = chunks.pack(x, kernel_rows)  # [blocks, K, 32]
        tasks = [(lambda a=a, b=b: chunks.product(w, packed, out, a * chunks.WEIGHT_ROWS, b * chunks.WEIGHT_ROWS))
                 for a, b in shares(blocked_cols // chunks.WEIGHT_ROWS) if b > a]
    # The calling thread takes the last share (the larger where they differ) and the numpy part: it starts at
    # once, the others after a wake-up. With them on the other thread, that thread finished 140 us after the
    # caller a product on average, and a 128-token prefill took 438-454 ms against 427-438 (2-core Xeon).
    last = tasks.pop() if tasks else (lambda: None)
    run([lambda: (last(), _numpy_part(x, w, out, (0, x.shape[0]), kernel_rows, blocked_cols))] + tasks)


# ---------------------------------------------------------------- prefill attention (AVX-512, AVX2)


def enable_prefill_attention() -> str | None:
    """Make the chunk attention (kestrel_trio._kernels.x86.float32.attention) usable: None if it is, else why not.

    Its register block by the float32 assembly this CPU takes: AVX-512's on Intel's AVX-512 CPUs, AVX2's on the
    others with AVX2 (Zen 4 and Zen 5 included: not measured there with zmm). Compiled (or loaded from numba's
    cache) and checked against numpy here: a model's load calls this (:func:`prepare`), so that no prompt waits.
    """

    if "attention" in loaded._state or "attention_error" in loaded._state:
        return loaded._state.get("attention_error")
    if not loaded.ready():  # outside the state lock: ready() takes it
        reason = loaded.unavailable_reason()
        return _enable_once("attention", lambda: (None, reason))
    from kestrel_trio._kernels.plan import this_plan

    planned = this_plan().chunk_attention
    loaded.dispatch().f32_assembly()  # readies LLVM's assembly parser where the plan has a block (assembly)
    if planned.variant == "none":
        return _enable_once("attention", lambda: (None, planned.why))
    return _enable_once("attention", lambda: _load_attention(planned.variant == "avx512"))


def _load_attention(wide: bool) -> tuple[object, str | None]:
    try:
        from kestrel_trio._kernels.x86.float32 import attention as f32_attention

        lanes = f32_attention.LANES[0 if wide else 1]
        return lanes, _attention_self_test(f32_attention, lanes)
    except Exception as error:  # e.g. numba told to compile for another CPU (NUMBA_CPU_NAME)
        return None, f"the chunk attention cannot be compiled here ({type(error).__name__}: {error})"


def _attend(attention, lanes: int) -> Callable:
    """f32_attention's entry point for the register block of ``lanes``."""
    return attention.attend_heads_avx512 if lanes == attention.LANES[0] else attention.attend_heads_avx2


def _attention_self_test(attention, lanes: int) -> str | None:
    """The chunk attention of 20 queries (4 heads over 2) after 17 keys against numpy; None if they agree."""
    rng = np.random.default_rng(0)
    t, past = 20, 17
    q = rng.standard_normal((t, 4, 32)).astype(np.float32)  # [T, n_heads, head_dim]
    keys, values = rng.standard_normal((2, 2, past + t, 32)).astype(np.float32)  # [n_kv, past + T, head_dim] each
    got = np.empty((t, 4 * 32), dtype=np.float32)  # [T, n_heads*head_dim]
    _attend(attention, lanes)(q, keys, values, past, np.float32(0.25), got, 0, 2)
    scores = np.einsum("thd,hsd->hts", q.astype(np.float64), np.repeat(keys, 2, axis=0)) * 0.25  # [n_heads, T, S]
    scores[:, np.arange(past + t)[None, :] > past + np.arange(t)[:, None]] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # [n_heads, T, S]
    exact = np.einsum("hts,hsd->thd", weights / weights.sum(axis=-1, keepdims=True), np.repeat(values, 2, axis=0))
    error = np.abs(got - exact.reshape(t, -1)).max()
    return None if error < 1e-5 else f"the chunk attention disagrees with numpy here (error {error:.1e})"


def prefill_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float,
                      run: Callable[[list[Callable[[], None]]], None] | None,
                      shares: Callable[[int], list[tuple[int, int]]] | None) -> np.ndarray | None:
    """Causal attention of T >= 2 new float32 queries in kestrel_trio._kernels.x86.float32.attention, or None.

    Args:
        q: [T, n_heads, head_dim], the newest tokens' queries.
        keys: [n_kv, past + T, head_dim], every key so far; ``values`` as ``keys``.
        past: keys before the new tokens'.
        scale: the score multiplier.
        run, shares: as :func:`chunk_product`'s, the kv heads shared among the threads; None: on this thread.

    Returns:
        [T, n_heads * head_dim]; None where the kernel is not enabled (:func:`enable_prefill_attention`: a
        model's load does it where it runs), an array is not float32, head_dim is not a multiple of 32, or the
        shapes disagree (the kernel reads ``past + T`` keys without bounds checks).
    """

    t, n_heads, head_dim = q.shape
    lanes = loaded._state.get("attention")
    shaped = keys.shape == values.shape == (keys.shape[0], past + t, head_dim) and n_heads % keys.shape[0] == 0
    if lanes is None or t < 2 or head_dim % 32 or not shaped or not q.dtype == keys.dtype == values.dtype == np.float32:
        return None
    from kestrel_trio._kernels.x86.float32 import attention  # loaded by enable_prefill_attention

    out = np.empty((t, n_heads * head_dim), dtype=np.float32)  # [T, n_heads*head_dim]
    attend = _attend(attention, lanes)
    run_spans(lambda first, stop: attend(q, keys, values, past, np.float32(scale), out, first, stop), keys.shape[0],
               run, shares)
    return out
