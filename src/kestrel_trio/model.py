"""The public model object: load a checkpoint folder, compute logits, generate.

This module joins the numpy model core with the text layer; it never imports trio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kestrel_trio._model import Decoder, KVCache, ModelConfig, forward, load_decoder
from kestrel_trio.errors import BadRequestError, ContextLengthError, ModelLoadError

__all__ = ["Model", "load_model", "DEFAULT_PREFILL_CHUNK"]

DEFAULT_PREFILL_CHUNK = 256  # tokens per prefill step


class Model:
    """A loaded Qwen model.

    Args:
        decoder: the numpy decoder (config, weights, rotary tables).
        name: the model id reported to clients.
        path: the checkpoint folder, if any.
    """

    def __init__(self, decoder: Decoder, *, name: str, path: Path | None = None) -> None:
        self.decoder = decoder
        self.name = name
        self.path = path

    @property
    def config(self) -> ModelConfig:
        """The checkpoint's configuration."""
        return self.decoder.config

    @property
    def context_length(self) -> int:
        """The longest sequence (prompt plus generated tokens) the model accepts."""
        return self.decoder.config.max_position_embeddings

    def new_cache(self) -> KVCache:
        """An empty KV cache for one sequence."""
        return self.decoder.new_cache()

    def check_token_ids(self, token_ids: Sequence[int], *, param: str = "token_ids") -> np.ndarray:
        """``token_ids`` as an int64 array, or BadRequestError naming what is wrong."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        if ids.ndim != 1 or ids.size == 0:
            raise BadRequestError(f"'{param}' must be a non-empty list of token ids", param=param)
        vocab = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            raise BadRequestError(f"'{param}' has token ids outside 0..{vocab - 1}", param=param)
        if ids.size > self.context_length:
            raise ContextLengthError(
                f"{ids.size} tokens exceed the model's context length of {self.context_length}", param=param
            )
        return ids

    def step(self, cache: KVCache, token_ids: Sequence[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Feed new tokens of one sequence through the model, extending ``cache``.

        Args:
            cache: the sequence's KV cache (its length is the position of the first new token).
            token_ids: [T] the new tokens.
            all_logits: return logits for every new token, not only the last.

        Returns:
            float32 logits, [T, vocab] if ``all_logits`` else [vocab].
        """
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        positions = np.arange(cache.length, cache.length + ids.size, dtype=np.int64)  # [T]
        logits = forward(self.decoder, ids, positions, [cache], [ids.size], all_logits=all_logits)
        return logits if all_logits else logits[0]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Full-sequence logits, float32 [len(token_ids), vocab_size], in one forward pass."""
        ids = self.check_token_ids(token_ids)
        return self.step(self.new_cache(), ids, all_logits=True)

    def prefill(self, cache: KVCache, token_ids: Sequence[int], chunk: int = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
        """Feed a prompt in chunks of ``chunk`` tokens; the last position's logits [vocab]."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        logits = None
        for start in range(0, ids.size, chunk):
            logits = self.step(cache, ids[start : start + chunk])
        assert logits is not None
        return logits

    def greedy(self, token_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation: prefill, then one decode step per token, through the KV cache.

        Stops only at ``max_new_tokens`` (end-of-sequence tokens are not special here).
        """
        ids = self.check_token_ids(token_ids)
        if ids.size + max_new_tokens > self.context_length:
            raise ContextLengthError(
                f"{ids.size} prompt tokens + {max_new_tokens} new tokens exceed the context length {self.context_length}",
                param="max_new_tokens",
            )
        cache = self.new_cache()
        logits = self.prefill(cache, ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) < max_new_tokens:
                logits = self.step(cache, [token])
        return out


def load_model(path: str | Path) -> Model:
    """Load a Hugging Face checkpoint folder.

    Args:
        path: a folder with config.json and safetensors weights (one file or
            shards with model.safetensors.index.json).

    Raises:
        ModelLoadError: naming the file, field or tensor at fault.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: not a checkpoint folder")
    decoder = load_decoder(folder)
    return Model(decoder, name=folder.resolve().name, path=folder)
