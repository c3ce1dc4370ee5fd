"""A per-request key/value cache that grows in blocks.

Each request owns one. Storage is preallocated per layer as
[n_kv, capacity, head_dim] so that one head's keys are contiguous for the
attention matmul, and grows by whole blocks (never per token), so appending a
decode step's key is a slice assignment, not a concatenation. Growth is by a
quarter of the capacity at least, so that copies stay linear in the length,
while the memory held stays within a quarter (plus a block) of what is used:
on a board, KV bytes are the budget that limits context and the prefix cache.
"""

from __future__ import annotations

import numpy as np

__all__ = ["KVCache"]

BLOCK_TOKENS = 64


class KVCache:
    """Keys and values of every layer for one sequence.

    Args:
        num_layers: decoder layers.
        num_kv_heads: key/value heads per layer.
        head_dim: channels per head.
        block_tokens: growth granularity (tokens).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_tokens = block_tokens
        self.length = 0  # tokens committed to the cache
        self.capacity = 0
        self.keys: list[np.ndarray] = []  # num_layers of [n_kv, capacity, head_dim]
        self.values: list[np.ndarray] = []  # num_layers of [n_kv, capacity, head_dim]

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated storage."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))

    def reserve(self, new_tokens: int) -> None:
        """Make room for ``new_tokens`` more tokens, growing in whole blocks."""
        needed = self.length + new_tokens
        if needed <= self.capacity:
            return
        capacity = self._round_up(max(needed, self.capacity + self.capacity // 4))
        shape = (self.num_kv_heads, capacity, self.head_dim)
        for store in (self.keys, self.values):
            for layer in range(self.num_layers):
                grown = np.empty(shape, dtype=np.float32)  # [n_kv, capacity, head_dim]
                if layer < len(store):
                    grown[:, : self.length] = store[layer][:, : self.length]
                    store[layer] = grown
                else:
                    store.append(grown)
        self.capacity = capacity

    def _round_up(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens) * self.block_tokens

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store one layer's new ``k``, ``v`` [T, n_kv, head_dim] after the committed tokens.

        Returns:
            The layer's keys and values up to and including the new tokens,
            each [n_kv, length + T, head_dim] (views, no copy).
        """
        t = k.shape[0]
        end = self.length + t
        self.keys[layer][:, self.length : end] = k.transpose(1, 0, 2)  # [n_kv, T, head_dim]
        self.values[layer][:, self.length : end] = v.transpose(1, 0, 2)  # [n_kv, T, head_dim]
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def commit(self, new_tokens: int) -> None:
        """Count ``new_tokens`` written to every layer as part of the sequence."""
        self.length += new_tokens

    def truncate(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens."""
        self.length = min(self.length, length)
