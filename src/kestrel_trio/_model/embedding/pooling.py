"""Sentence embeddings from a decoder: its final hidden states (after the final norm), pooled and L2-normalized.

Theory of operation: an embedding model such as Qwen3-Embedding is a ``Qwen3ForCausalLM``-shaped checkpoint
whose sentence-transformers files say how a text becomes one vector: ``modules.json`` lists a ``Pooling``
module (its folder, usually ``1_Pooling``, holds ``config.json`` with ``pooling_mode_lasttoken``,
``pooling_mode_mean_tokens`` or ``pooling_mode_cls_token``) and, for Qwen3-Embedding, a ``Normalize``
module. :func:`read_pooling` reads them; a folder without them (any decoder LM, a GGUF file) pools its last
token, the only row of a causal model that has seen the whole text.

:class:`EmbeddingRun` computes the vectors of a batch of token-id lists with the decoder's own forward pass,
one prefill chunk per :meth:`EmbeddingRun.step`, so that the engine can interleave it with generations and
drop it between two chunks when its client leaves. Each input gets a fresh KV cache (texts never attend
to one another); the cache is dropped when the input is pooled. Every vector is returned L2-normalized (as
OpenAI's and Ollama's embeddings are), so cosine similarity is a dot product.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from kestrel_trio._model.checkpoints.confine import confined
from kestrel_trio._model.decoder.forward import Decoder, forward
from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio.errors import ModelLoadError

__all__ = ["POOLINGS", "read_pooling", "gguf_pooling", "EmbeddingRun", "pool", "normalize"]

POOLINGS = ("last", "mean", "cls")  # last token, mean of every token, first token
_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_POOLING_MODULE = "sentence_transformers.models.Pooling"


def read_pooling(folder: Path | None) -> str:
    """The pooling a checkpoint folder's sentence-transformers files name: "last", "mean" or "cls".

    A folder without ``modules.json`` (or a GGUF file, ``folder`` None) pools its last token. A pooling
    config this module cannot compute (max, weighted mean, several modes at once) is refused, naming the file,
    rather than pooled some other way.

    Raises:
        ModelLoadError: ``modules.json`` or the pooling config is unreadable, or names a pooling not in
            :data:`POOLINGS`.
    """
    if folder is None or not (folder / "modules.json").is_file():
        return "last"
    modules_path = confined(folder, "modules.json")
    try:
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{modules_path}: cannot read modules.json: {exc}") from None
    entries = [m for m in modules if isinstance(m, dict) and m.get("type") == _POOLING_MODULE] \
        if isinstance(modules, list) else []
    if not entries:
        return "last"  # no pooling module: the decoder's own last token
    config_path = confined(folder, f"{entries[0].get('path', '1_Pooling')}/config.json", named_by="modules.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path}: cannot read the pooling config: {exc}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path}: the pooling config is not a JSON object")
    asked = sorted(key for key, value in config.items() if key.startswith("pooling_mode_") and value is True)
    if len(asked) != 1 or asked[0] not in _MODES:
        raise ModelLoadError(f"{config_path}: kestrel-trio pools by exactly one of {', '.join(_MODES)}; this config "
                             f"asks for {', '.join(asked) or 'none'}")
    chosen = [_MODES[asked[0]]]
    return chosen[0]


def gguf_pooling(metadata, architecture: str) -> str:
    """The pooling a GGUF file's ``{arch}.pooling_type`` names (llama.cpp's enum); absent: "last".

    Raises:
        ModelLoadError: a pooling this module cannot compute (llama.cpp's "rank", a reranker's head).
    """
    kind = metadata.get(f"{architecture}.pooling_type")
    if kind is None or int(kind) in (0, 3):  # 0: none (a plain LM), 3: last
        return "last"
    if int(kind) == 1:
        return "mean"
    if int(kind) == 2:
        return "cls"
    raise ModelLoadError(f"{architecture}.pooling_type {kind}: kestrel-trio pools by last token, mean or cls only")


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """One unit-length vector [hidden] from a text's final hidden states ``rows`` [T, hidden]."""
    if pooling == "mean":
        vector = rows.mean(axis=0, dtype=np.float64)  # [hidden]
    elif pooling == "cls":
        vector = rows[0].astype(np.float64)  # [hidden]
    else:
        vector = rows[-1].astype(np.float64)  # [hidden]
    return normalize(vector)


def normalize(vector: np.ndarray) -> np.ndarray:
    """``vector`` [d] scaled to unit L2 norm (a zero vector stays zero), as float32."""
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)  # [d]


class EmbeddingRun:
    """The embeddings of a batch of texts, computed one prefill chunk per :meth:`step` (synchronous, no trio).

    Args:
        inputs: each text's token ids (non-empty; the engine checked each against the context).
        pooling: one of :data:`POOLINGS`.
        chunk: tokens per forward pass (the engine's prefill chunk).
        new_cache: makes one input's KV cache of at most the given number of tokens.
    """

    def __init__(self, inputs: Sequence[Sequence[int]], pooling: str, chunk: int, new_cache) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
        self.inputs = [np.asarray(ids, dtype=np.int64) for ids in inputs]  # each [T_i]
        self.pooling = pooling
        self.chunk = chunk
        self._new_cache = new_cache
        self.vectors: list[np.ndarray] = []  # each [hidden], float32, unit length
        self._cache: KVCache | None = None
        self._rows: list[np.ndarray] = []  # the current input's pooled-from rows so far, each [rows, hidden]
        self.tokens_fed = 0  # tokens through the model so far, every input counted

    def release(self) -> None:
        """Drop the KV cache of the input in progress (the job was abandoned)."""
        self._cache = None
        self._rows = []

    @property
    def done(self) -> bool:
        return len(self.vectors) == len(self.inputs)

    @property
    def tokens(self) -> int:
        """Tokens in every input (usage's prompt_tokens)."""
        return sum(int(ids.size) for ids in self.inputs)

    def step(self, decoder: Decoder) -> bool:
        """Feed the next chunk of the current input; True once every input has its vector."""
        if self.done:
            return True
        ids = self.inputs[len(self.vectors)]  # [T]
        if self._cache is None:
            self._cache = self._new_cache(int(ids.size))
        cache = self._cache
        start = cache.length
        piece = ids[start : start + self.chunk]  # [<= chunk]
        positions = np.arange(start, start + piece.size, dtype=np.int64)  # [<= chunk]
        last = start + piece.size == ids.size
        every_row = self.pooling == "mean" or (self.pooling == "cls" and start == 0)
        rows = forward(decoder, piece, positions, [cache], [piece.size], all_logits=every_row,
                       wanted=[last], hidden=True)  # [piece or 1 or 0, hidden]
        self.tokens_fed += int(piece.size)
        if self.pooling == "mean":
            self._rows.append(rows.sum(axis=0, keepdims=True, dtype=np.float64))  # [1, hidden]: a running sum
        elif self.pooling == "cls" and start == 0:
            self._rows.append(rows[:1])  # [1, hidden]
        elif self.pooling == "last" and last:
            self._rows.append(rows)  # [1, hidden]
        if last:
            if self.pooling == "mean":
                total = np.sum(np.concatenate(self._rows), axis=0)  # [hidden]
                self.vectors.append(normalize(total / ids.size))
            else:
                self.vectors.append(pool(self._rows[0], "last"))
            self._rows = []
            self._cache = None  # this input's KV is no longer needed
        return self.done
