"""The public model object: load a checkpoint folder, compute logits, generate.

This module joins the numpy model core with the text layer; it never imports trio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kestrel_trio._model import Decoder, KVCache, ModelConfig, forward, load_decoder
from kestrel_trio._model.config import config_from_dict
from kestrel_trio._model.random_init import random_tensors
from kestrel_trio._model.weights import assemble_weights
from kestrel_trio.errors import BadRequestError, ContextLengthError, KestrelError, ModelLoadError
from kestrel_trio.text import ChatTemplate, Tokenizer, missing_template_error

__all__ = ["Model", "load_model", "load_demo_model", "DEMO_MODEL_ID", "DEFAULT_PREFILL_CHUNK"]

DEFAULT_PREFILL_CHUNK = 256  # tokens per prefill step
DEMO_MODEL_ID = "kestrel-demo-random"
# A tiny Qwen3 with the real Qwen3 vocabulary: big enough to exercise every code path, small enough to build in
# well under a second. Its weights are seeded noise, so its text is meaningless.
DEMO_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000.0,
}


class Model:
    """A loaded Qwen model.

    Args:
        decoder: the numpy decoder (config, weights, rotary tables).
        name: the model id reported to clients.
        path: the checkpoint folder, if any.
    """

    def __init__(
        self, decoder: Decoder, *, name: str, path: Path | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        self.decoder = decoder
        self.name = name
        self.path = path
        self.tokenizer = tokenizer
        self._template: ChatTemplate | None = None
        if tokenizer is not None and tokenizer.chat_template is not None:
            self._template = ChatTemplate(tokenizer.chat_template, special_tokens=tokenizer.special_tokens_map)

    @property
    def is_demo(self) -> bool:
        """Whether this is the built-in random-weight demo model."""
        return self.name == DEMO_MODEL_ID

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or KestrelError when the checkpoint has none."""
        if self.tokenizer is None:
            raise KestrelError(f"model {self.name!r} has no tokenizer.json, so it only takes token ids")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.require_tokenizer().encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.require_tokenizer().decode(ids)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None,
        **template_kwargs: object,
    ) -> str:
        """Render ``messages`` with the checkpoint's own chat template, as transformers does.

        Args:
            messages: OpenAI-style chat messages.
            add_generation_prompt: open an assistant turn at the end.
            tools: OpenAI-style tool schemas.
            **template_kwargs: template variables, e.g. ``enable_thinking=False``.

        Raises:
            BadRequestError: no template, or the template rejects the messages.
        """
        if self._template is None:
            raise missing_template_error()
        return self._template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **template_kwargs)

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


def load_model(path: str | Path, *, progress: Callable[[float], None] | None = None) -> Model:
    """Load a Hugging Face checkpoint folder.

    Args:
        path: a folder with config.json and safetensors weights (one file or
            shards with model.safetensors.index.json), and optionally
            tokenizer.json, tokenizer_config.json, generation_config.json and
            chat_template.jinja.
        progress: called with the fraction of weight bytes read (0 to 1).

    Raises:
        ModelLoadError: naming the file, field or tensor at fault.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: not a checkpoint folder")
    decoder = load_decoder(folder, progress)
    tokenizer = Tokenizer.from_folder(folder) if (folder / "tokenizer.json").is_file() else None
    if tokenizer is not None and tokenizer.vocab_size > decoder.config.vocab_size:
        raise ModelLoadError(
            f"{folder}: tokenizer.json has {tokenizer.vocab_size} tokens but config.json's vocab_size is "
            f"{decoder.config.vocab_size}"
        )
    return Model(decoder, name=folder.resolve().name, path=folder, tokenizer=tokenizer)


def load_demo_model(seed: int = 0) -> Model:
    """The built-in demo: a tiny Qwen3 with seeded random weights and the real Qwen3 tokenizer.

    Its text is meaningless; it exists so that every command works on a fresh
    machine with no checkpoint, through the whole real code path.
    """
    config = config_from_dict(DEMO_CONFIG, source="built-in demo config")
    tensors = random_tensors(config, seed)
    for array in tensors.values():
        array.flags.writeable = False
    weights = assemble_weights(config, tensors.__getitem__, set(tensors))
    return Model(Decoder.build(config, weights), name=DEMO_MODEL_ID, tokenizer=Tokenizer.from_demo())
