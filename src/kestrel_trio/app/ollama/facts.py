"""What Ollama's listings say about the served model (:class:`kestrel_trio.ollama.ModelFacts`), read once."""

from __future__ import annotations

import datetime
import math

from kestrel_trio._model import expected_shapes, resident_bytes
from kestrel_trio.app.chat.job import default_sampling
from kestrel_trio.app.chat.thinking import model_thinks
from kestrel_trio.model import Model
from kestrel_trio.ollama import ModelFacts

__all__ = ["model_facts"]

# config.json's architecture -> Ollama's family name (GGUF's general.architecture)
_FAMILIES = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe", "Qwen2ForCausalLM": "qwen2",
             "LlamaForCausalLM": "llama", "Qwen3VLForConditionalGeneration": "qwen3vl"}
_MODES = {"fp32": "F32", "bf16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}  # kestrel's in-memory forms, as ggml names
# Ollama's Modelfile names of the sampling defaults /api/show reports
_PARAMETER_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "repetition_penalty": "repeat_penalty"}


def model_facts(model: Model, model_id: str, state) -> ModelFacts:
    """The served model's facts for /api/tags, /api/show and /api/ps (``state``: the server's)."""
    config = model.config
    # Every model completes and calls tools (a template without tools gets them as a system prompt); every
    # model also embeds (/api/embed), but only one whose files declare a pooling is listed as an embedding
    # model, as Ollama lists only those.
    capabilities = ["completion", "tools"]
    template = model.tokenizer.chat_template if model.tokenizer is not None else None
    if model_thinks(model):
        capabilities.append("thinking")
    if model.vision is not None:
        capabilities.append("vision")
    if model.embedding_checkpoint:
        capabilities.append("embedding")
    defaults = default_sampling(model, state.sampling, state.default_max_tokens)
    lines = [f"{name} {defaults[key]}" for key, name in _PARAMETER_NAMES.items() if defaults.get(key) is not None]
    started = datetime.datetime.fromtimestamp(state.created, datetime.timezone.utc)
    return ModelFacts(
        model_id=model_id, family=_FAMILIES.get(config.architecture, config.architecture.lower()),
        file_format=_file_format(model), parameter_count=_parameter_count(model),
        quantization=_quantization(model), size=_size(model), context_length=model.context_length,
        embedding_length=config.hidden_size, block_count=config.num_hidden_layers, template=template or "",
        capabilities=tuple(capabilities), parameters="\n".join(lines),
        modified_at=started.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def _parameter_count(model: Model) -> int:
    return sum(math.prod(shape) for shape in expected_shapes(model.config).values())


def _file_format(model: Model) -> str:
    if model.path is None:
        return ""
    return "gguf" if model.path.is_file() else "safetensors"


def _quantization(model: Model) -> str:
    if model.weights_mode != "gguf":
        return _MODES.get(model.weights_mode, model.weights_mode.upper())
    forms = resident_bytes(model.decoder.weights)  # the form holding most bytes names the file's type
    return max(forms, key=forms.__getitem__) if forms else "unknown"


def _size(model: Model) -> int:
    path = model.path
    if path is None:
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".gguf") and f.is_file())
