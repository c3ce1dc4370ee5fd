"""Reuse of prompt KV across requests: a bounded, least-recently-used prefix cache.

Theory of operation: an entry is a KV cache that a request filled, together
with the token ids it holds; only its first ``length`` tokens count. A request
that started stepping keeps writing its cache only past the tokens it already
had, so an entry may point at a live request's cache (zero copy, marked in
use) and be extended in place when that request finishes. A new request
looks for the entry sharing the longest common token prefix with its prompt.
If no running request uses that entry's cache, the cache itself is handed
over (no copy, no new memory): the entry is cut to the shared prefix, since
the new request writes after it, and is in use until that request ends.
Otherwise the shared tokens are copied into the new request's own cache. The
last prompt token is always recomputed, since its logits are needed to
sample. An entry no request writes to any more is shrunk to its tokens (in
whole blocks), so a short answer to a request that reserved the whole context
does not keep the whole context's bytes. Entries are evicted least recently
used first, until their storage fits the byte budget.

Under an engine's KV budget, a new request's cache is capped at its
reservation (``KVCache.max_tokens``): an idle entry is handed over only if
its capacity fits that cap (the request's reservation then bounds it), else
its tokens are copied. Idle entries are the prefix cache's own memory within
the KV budget (:attr:`PrefixCache.idle_bytes`); the engine evicts them
(:meth:`PrefixCache.evict_idle`) to make room for a request it admits.

The engine calls it from its worker thread only (one step at a time), so it
takes no lock.
"""

from __future__ import annotations

import collections
from typing import Sequence

import attrs
import numpy as np

from kestrel_trio._model.cache.kv_cache import KVCache

__all__ = ["PrefixCache", "common_prefix_length"]


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` [n] and ``b`` [m] share."""
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])  # [k]
    return int(differ[0]) if differ.size else n


@attrs.define(eq=False)
class _Entry:
    token_ids: np.ndarray  # [length] int64
    cache: KVCache  # holds at least ``length`` tokens
    in_use: bool  # a running request may append to ``cache``: copy from it, never hand it over

    @property
    def length(self) -> int:
        return int(self.token_ids.size)


class PrefixCache:
    """Prompt KV kept for reuse, bounded by bytes and entries.

    Args:
        budget_bytes: the most KV storage kept (bytes); 0 disables the cache.
        min_tokens: the shortest common prefix worth reusing (tokens).
        max_entries: the most entries kept (bounds the lookup's linear scan).

    Attributes:
        hits: lookups that reused a prefix.
        misses: lookups that found none.
        reused_tokens: prompt tokens restored instead of computed.
    """

    def __init__(self, budget_bytes: int, *, min_tokens: int = 8, max_entries: int = 64) -> None:
        self.budget_bytes = budget_bytes
        self.min_tokens = min_tokens
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # oldest first
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the entries' caches."""
        return sum(entry.cache.nbytes for entry in self._entries.values())

    @property
    def idle_bytes(self) -> int:
        """Bytes of the entries no running request uses: the prefix cache's own share of the KV memory."""
        return sum(entry.cache.nbytes for entry in self._entries.values() if not entry.in_use)

    def evict_idle(self, max_bytes: int) -> int:
        """Drop idle entries, least recently used first, until they hold at most ``max_bytes``; bytes freed."""
        idle = self.idle_bytes
        freed = 0
        for key, entry in list(self._entries.items()):  # oldest first
            if idle - freed <= max_bytes:
                break
            if not entry.in_use:
                del self._entries[key]
                freed += entry.cache.nbytes
        return freed

    def shrink_idle(self) -> int:
        """Shrink every idle entry to its tokens (whole blocks); entries that cannot be shrunk are dropped.

        An abandoned request's entry is released idle at its full reservation
        (:meth:`release` runs where no copy should); this is the later, cheap
        place for the copy. Returns the bytes let go.
        """
        before = self.nbytes
        for key, entry in list(self._entries.items()):
            if not entry.in_use:
                entry.cache.truncate(entry.length)
                try:
                    entry.cache.shrink_to_fit()
                except MemoryError:
                    del self._entries[key]
        return before - self.nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def reuse(self, prompt_ids: Sequence[int], cache: KVCache) -> tuple[KVCache, int]:
        """The cache a new request should use for ``prompt_ids``, and how many prompt tokens it holds.

        An idle entry's cache is handed over (the entry is then cut to the
        shared tokens and in use until :meth:`store` or :meth:`release` says
        otherwise); else the shared tokens are copied into the empty
        ``cache``, which is first given room for the whole prompt.

        Returns:
            (the cache to use, tokens restored: 0 on a miss, always fewer than ``len(prompt_ids)``).
        """
        if cache.length:
            return cache, 0
        best, length = self._lookup(prompt_ids)
        if best is None:
            return cache, 0
        if best.in_use or not _may_hand_over(best.cache, cache):
            cache.reserve(len(prompt_ids))
            _copy_prefix(best.cache, cache, length)
            return cache, length
        best.cache.truncate(length)
        best.cache.max_tokens = cache.max_tokens  # the new request's reservation now bounds it
        best.token_ids, best.in_use = best.token_ids[:length], True
        return best.cache, length

    def restore(self, prompt_ids: Sequence[int], cache: KVCache) -> int:
        """Copy the longest cached prefix of ``prompt_ids`` into the empty ``cache``.

        Returns:
            Tokens restored (0 on a miss); always fewer than ``len(prompt_ids)``.
        """
        if cache.length:
            return 0
        best, length = self._lookup(prompt_ids)
        if best is not None:
            _copy_prefix(best.cache, cache, length)
        return length

    def _lookup(self, prompt_ids: Sequence[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with ``prompt_ids`` (counted as a hit) and that length."""
        if not self.enabled:
            return None, 0
        prompt = np.asarray(prompt_ids, dtype=np.int64)  # [P]
        best, best_length = None, 0
        for entry in self._entries.values():
            length = common_prefix_length(entry.token_ids, prompt)
            if length > best_length:
                best, best_length = entry, length
        best_length = min(best_length, prompt.size - 1)  # the last prompt token yields the logits
        if best is None or best_length < self.min_tokens:
            self.misses += 1
            return None, 0
        self._entries.move_to_end(id(best))
        self.hits += 1
        self.reused_tokens += best_length
        return best, best_length

    def release(self, cache: KVCache) -> None:
        """``cache``'s request has ended without :meth:`store` (abandoned, failed): its entry may be handed over."""
        for entry in self._entries.values():
            if entry.cache is cache:
                entry.in_use = False

    def store(self, token_ids: Sequence[int], cache: KVCache, *, in_use: bool = False) -> None:
        """Keep ``cache`` (which holds the KV of ``token_ids``) for later requests.

        The caller must not rewrite the first ``len(token_ids)`` tokens of
        ``cache`` afterwards (appending is fine). An entry whose tokens are a
        prefix of these is superseded.

        Args:
            token_ids: the tokens whose KV ``cache`` holds, in order.
            cache: the KV, kept without a copy (unless not ``in_use``: then shrunk to its tokens, a copy).
            in_use: a running request still appends to ``cache`` (it is then
                copied from, not handed over, until stored again or released).
        """
        if not self.enabled or len(token_ids) < self.min_tokens:
            return
        ids = np.asarray(token_ids, dtype=np.int64)  # [L]
        if ids.size > cache.length:
            raise ValueError(f"the cache holds {cache.length} tokens, not {ids.size}")
        for key, entry in list(self._entries.items()):
            if entry.cache is cache or common_prefix_length(entry.token_ids, ids) == entry.length:
                del self._entries[key]
        entry = _Entry(token_ids=ids, cache=cache, in_use=in_use)
        if not in_use:
            try:
                cache.shrink_to_fit()  # kept at its length, not at the reservation of the request that filled it
            except MemoryError:
                return  # short of memory: better not kept than kept whole
        if cache.nbytes > self.budget_bytes:
            return
        self._entries[id(entry)] = entry
        self._evict()

    def _evict(self) -> None:
        total = self.nbytes
        while self._entries and (total > self.budget_bytes or len(self._entries) > self.max_entries):
            _, oldest = self._entries.popitem(last=False)
            total -= oldest.cache.nbytes

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()


def _may_hand_over(entry: KVCache, fresh: KVCache) -> bool:
    """Whether ``entry`` may replace the request's ``fresh`` cache: same storage, capacity within its cap."""
    return entry.dtype == fresh.dtype and (fresh.max_tokens is None or entry.capacity <= fresh.max_tokens)


def _copy_prefix(source: KVCache, target: KVCache, tokens: int) -> None:
    if source.dtype != target.dtype:
        raise ValueError(f"cannot copy {source.dtype} KV into a {target.dtype} cache")
    target.reserve(tokens)
    for layer in range(source.num_layers):
        target.keys[layer][:, :tokens] = source.keys[layer][:, :tokens]  # [n_kv, tokens, head_dim]
        target.values[layer][:, :tokens] = source.values[layer][:, :tokens]  # [n_kv, tokens, head_dim]
    target.commit(tokens)
