"""A per-request key/value cache that grows in blocks, optionally capped at a reservation.

Each request owns one. Storage is preallocated per layer as
[n_kv, capacity, head_dim] so that one head's keys are contiguous for the
attention matmul, and grows by whole blocks (never per token), so appending a
decode step's key is a slice assignment, not a concatenation. Growth is by a
quarter of the capacity at least, so that copies stay linear in the length,
while the memory held stays within a quarter (plus a block) of what is used:
on a board, KV bytes are the budget that limits context and the prefix cache.

A cache given ``max_tokens`` (the engine's reservation for its request)
grows the same way but never past it: its bytes never exceed what was
reserved. It is not allocated at the whole reservation up front: numpy asks
for transparent huge pages on large arrays, and with the [n_kv, capacity,
head_dim] layout the first tokens of every head then fault in every 2 MiB
page of the array. Measured with SmolLM2-135M, three chats without
max_tokens (8,192-token reservations, 360 MiB each) held 850 MiB of anonymous
memory after 300 tokens each; grown with their tokens they hold what they use.
Storage is float32, bf16 bits or float16
(:mod:`kestrel_trio._model.cache.kv_storage`); the values handed to attention are
float32 either way.
"""

from __future__ import annotations

import numpy as np

from kestrel_trio._model.cache.kv_storage import KV_DTYPES, storage_dtype, to_storage

__all__ = ["KVCache", "KVCacheFull", "BLOCK_TOKENS", "KV_DTYPES", "kv_token_bytes"]

BLOCK_TOKENS = 64


class KVCacheFull(RuntimeError):
    """A cache was asked to hold more tokens than its ``max_tokens`` (a reservation that was too small: a bug)."""


def kv_token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str = "fp32") -> int:
    """Bytes one token's keys and values take in every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * storage_dtype(dtype).itemsize


class KVCache:
    """Keys and values of every layer for one sequence.

    Args:
        num_layers: decoder layers.
        num_kv_heads: key/value heads per layer.
        head_dim: channels per head.
        block_tokens: growth granularity (tokens).
        dtype: storage, "fp32", "bf16" or "fp16".
        max_tokens: the most tokens it may hold (None: unbounded); growth stops there.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_tokens: int = BLOCK_TOKENS, *,
                 dtype: str = "fp32", max_tokens: int | None = None) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_tokens = block_tokens
        self.dtype = dtype
        self._storage = storage_dtype(dtype)
        self.max_tokens = max_tokens
        self.length = 0  # tokens committed to the cache
        self.capacity = 0
        self.keys: list[np.ndarray] = []  # num_layers of [n_kv, capacity, head_dim]
        self.values: list[np.ndarray] = []  # num_layers of [n_kv, capacity, head_dim]

    @property
    def stores_float32(self) -> bool:
        """Whether keys and values are held as float32 (:meth:`float32_buffers` gives them once reserved)."""
        return self._storage == np.float32

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's keys and values, all layers."""
        return kv_token_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated storage."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))

    def reserve(self, new_tokens: int) -> None:
        """Make room for ``new_tokens`` more tokens: whole blocks, a quarter more at least, never past ``max_tokens``.

        Raises:
            KVCacheFull: the tokens would exceed ``max_tokens``.
            MemoryError: the allocation was refused; the cache is unchanged
                but for layers already grown, and a later call resumes.
        """
        needed = self.length + new_tokens
        if self.max_tokens is not None and needed > self.max_tokens:
            raise KVCacheFull(f"{needed} tokens exceed this cache's reservation of {self.max_tokens}")
        if needed <= self.capacity:
            return
        capacity = self._round_up(max(needed, self.capacity + self.capacity // 4))
        if self.max_tokens is not None:
            capacity = min(capacity, self.max_tokens)
        shape = (self.num_kv_heads, capacity, self.head_dim)
        for store in (self.keys, self.values):
            for layer in range(self.num_layers):
                if layer < len(store) and store[layer].shape[1] >= capacity:
                    continue  # grown by an earlier call that ran out of memory part way
                grown = np.empty(shape, dtype=self._storage)  # [n_kv, capacity, head_dim]
                if layer < len(store):
                    grown[:, : self.length] = store[layer][:, : self.length]
                    store[layer] = grown
                else:
                    store.append(grown)
        self.capacity = capacity

    def _round_up(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens) * self.block_tokens

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store one layer's new float32 ``k``, ``v`` [T, n_kv, head_dim] after the committed tokens.

        Returns:
            The layer's stored keys and values up to and including the new
            tokens, each [n_kv, length + T, head_dim] (views, no copy; float32,
            or bf16 bits / float16 that attention widens as it reads).
        """
        t = k.shape[0]
        end = self.length + t
        self.keys[layer][:, self.length : end] = to_storage(k.transpose(1, 0, 2), self._storage)  # [n_kv, T, head_dim]
        self.values[layer][:, self.length : end] = to_storage(v.transpose(1, 0, 2), self._storage)  # [n_kv, T, head_dim]
        return self.stored(layer, t)

    def float32_buffers(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The layer's key and value buffers [n_kv, capacity, head_dim] where they are float32, else None.

        For a kernel that writes the next tokens in place (kestrel_trio._kernels.qkv_rows), after
        :meth:`reserve`; :meth:`stored` then gives them as :meth:`write` does.
        """
        return (self.keys[layer], self.values[layer]) if self._storage == np.float32 else None

    def stored(self, layer: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The layer's keys and values up to and including ``t`` tokens after the committed ones (views)."""
        end = self.length + t
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def commit(self, new_tokens: int) -> None:
        """Count ``new_tokens`` written to every layer as part of the sequence."""
        self.length += new_tokens

    def truncate(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens."""
        self.length = min(self.length, length)

    def shrink_to_fit(self) -> None:
        """Let go of the room past the committed tokens, keeping whole blocks (a copy of what is kept).

        A finished request's cache was allocated at its whole reservation
        (prompt + max_tokens, up to the context); kept as is for reuse, a
        short answer would hold the bytes of the longest one.

        Raises:
            MemoryError: the smaller copy could not be allocated; the cache is unchanged.
        """
        capacity = self._round_up(self.length)
        if capacity >= self.capacity:
            return
        keys = [np.ascontiguousarray(k[:, :capacity]) for k in self.keys]  # each [n_kv, capacity, head_dim]
        values = [np.ascontiguousarray(v[:, :capacity]) for v in self.values]  # each [n_kv, capacity, head_dim]
        self.keys, self.values, self.capacity = keys, values, capacity
