"""``/api/tags``, ``/api/show``, ``/api/ps`` and ``/api/version`` bodies, from plain facts (no trio/numpy)."""

from __future__ import annotations

import hashlib

import attrs

from kestrel_trio.ollama.responses import OLLAMA_VERSION

__all__ = ["ModelFacts", "tags_body", "show_body", "ps_body", "version_body", "listed_name", "names_of"]


@attrs.frozen
class ModelFacts:
    """What the listings say about the served model.

    Attributes:
        model_id: the server's model id.
        family: the architecture's family ("qwen3", "llama", ...).
        file_format: "gguf" or "safetensors" ("" for the built-in demo model).
        parameter_count: weights in the language model.
        quantization: how the weights are stored ("Q4_K_M", "BF16", "F32", ...).
        size: bytes of the weight files (0 for the demo model).
        context_length: the context served (tokens).
        embedding_length: the hidden size.
        block_count: decoder layers.
        template: the chat template's text ("" for none).
        capabilities: Ollama's capability names ("completion", "tools", "thinking", "vision", "embedding").
        parameters: the sampling defaults as Ollama's "key value" lines.
        modified_at: RFC 3339 time the server started.
    """

    model_id: str
    family: str
    file_format: str
    parameter_count: int
    quantization: str
    size: int
    context_length: int
    embedding_length: int
    block_count: int
    template: str
    capabilities: tuple[str, ...]
    parameters: str
    modified_at: str


def listed_name(model_id: str) -> str:
    """The name the listings give: the id, with Ollama's ``:latest`` tag when it has none."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else f"{model_id}:latest"


def names_of(model_id: str) -> frozenset[str]:
    """Every name a request may use for the served model (with and without ``:latest``)."""
    return frozenset({model_id, listed_name(model_id)})


def _digest(facts: ModelFacts) -> str:
    """A stable identifier of the served model (sha256 of its id and size; not a hash of its files)."""
    return hashlib.sha256(f"{facts.model_id}\0{facts.size}".encode()).hexdigest()


def _size_label(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M"
    return f"{count / 1e3:.1f}K"


def _details(facts: ModelFacts) -> dict:
    return {"parent_model": "", "format": facts.file_format, "family": facts.family, "families": [facts.family],
            "parameter_size": _size_label(facts.parameter_count), "quantization_level": facts.quantization}


def _entry(facts: ModelFacts) -> dict:
    name = listed_name(facts.model_id)
    return {"name": name, "model": name, "modified_at": facts.modified_at, "size": facts.size,
            "digest": _digest(facts), "details": _details(facts)}


def tags_body(facts: ModelFacts) -> dict:
    """``GET /api/tags``: the one served model."""
    return {"models": [_entry(facts)]}


def ps_body(facts: ModelFacts, expires_at: str) -> dict:
    """``GET /api/ps``: the served model, loaded for the server's life (``size_vram`` 0: CPU only)."""
    return {"models": [{**_entry(facts), "expires_at": expires_at, "size_vram": 0,
                        "context_length": facts.context_length}]}


def show_body(facts: ModelFacts) -> dict:
    """``POST /api/show``: template, parameters, details, model_info and capabilities."""
    arch = facts.family
    info = {"general.architecture": arch, "general.parameter_count": facts.parameter_count,
            f"{arch}.context_length": facts.context_length, f"{arch}.embedding_length": facts.embedding_length,
            f"{arch}.block_count": facts.block_count}
    return {"license": "", "modelfile": f"# served by kestrel-trio\nFROM {facts.model_id}\n",
            "parameters": facts.parameters, "template": facts.template, "details": _details(facts),
            "model_info": info, "capabilities": list(facts.capabilities), "modified_at": facts.modified_at}


def version_body() -> dict:
    """``GET /api/version``."""
    return {"version": OLLAMA_VERSION}
