"""The public model layer: load a checkpoint folder, compute logits, generate.

This room joins the numpy model core with the text layer; it never imports trio. Its ``__init__`` is where the
rest of the package (and a user) imports the model from; the code lives in one module a concern:

* :mod:`kestrel_trio.model.loaded`: :class:`Model`, a loaded checkpoint (tokens, logits, steps, the engine's seam);
* :mod:`kestrel_trio.model.loading`: :func:`load_model` and :func:`load_demo_model`;
* :mod:`kestrel_trio.model.checks`: what a load would refuse, checked before any weight is read;
* :mod:`kestrel_trio.model.settings`: the process-wide settings models are loaded with (threads, products,
  prefill precision);
* :mod:`kestrel_trio.model.checked`: a path checked once and carried to the load.
"""

from __future__ import annotations

# What the engine names of the core it steps through this module (kestrel_trio.engine imports no _model module).
from kestrel_trio._model import BLOCK_TOKENS, KV_DTYPES, EmbeddingRun, ModelConfig, PrefixCache, normalize
from kestrel_trio._model import prefill_precision
from kestrel_trio.model.checked import CheckedModel, check_model
from kestrel_trio.model.loaded import DEMO_CONFIG, DEMO_MODEL_ID, Model
from kestrel_trio.model.checks import (
    check_context_cap, check_draft_model, check_model_folder, is_qwen3_vl_folder, is_vl_language_gguf,
)
from kestrel_trio.model.loading import load_demo_model, load_model
from kestrel_trio.model.settings import set_blas_threads, set_prefill_precision, set_products
from kestrel_trio.text.generation import DEFAULT_PREFILL_CHUNK

__all__ = ["Model", "load_model", "check_model", "CheckedModel", "check_model_folder", "check_context_cap",
           "check_draft_model", "is_qwen3_vl_folder", "is_vl_language_gguf", "set_blas_threads",
           "set_prefill_precision", "prefill_precision", "set_products", "load_demo_model", "DEMO_MODEL_ID",
           "DEFAULT_PREFILL_CHUNK", "ModelConfig", "PrefixCache", "EmbeddingRun", "BLOCK_TOKENS", "KV_DTYPES",
           "normalize"]
