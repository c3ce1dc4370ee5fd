"""The numpy model core: config, checkpoint readers, layers, KV cache, Qwen forward passes.

Imports numpy and the standard library only (never trio). This package is
private: every other module enters it through the names below, never through
its submodules (``tests/test_architecture.py`` holds the rule), so what the
rest of kestrel-trio relies on is listed here, in one place.

Its modules live in rooms, each importing only the rooms below it (the same
test ranks them): forms/ (how a matrix's rows are stored: ggml's blocks,
packed rows); checkpoints/ (a model folder's files and config) and products/ (the
weight products, each model's backend and product threads); gguf/ (a GGUF file's reader, names and config);
weights/ (a checkpoint assembled in its residency) and
cache/ (the KV cache and the prefix cache); decoder/ (the model itself:
layers, rope, attention, the forward passes); embedding/ and vision/.
"""

from kestrel_trio._model.products.backend import (
    PREFILL_PRECISIONS, Backend, default_products, defaults, prefill_precision, set_default_prefill_precision,
    set_default_products,
)
from kestrel_trio._model.checkpoints.confine import check_folder_files, confined
from kestrel_trio._model.checkpoints.config import (
    ModelConfig, config_from_dict, read_config, read_config_json, read_json_object,
)
from kestrel_trio._model.embedding.pooling import POOLINGS, EmbeddingRun, gguf_pooling, normalize, read_pooling
from kestrel_trio._model.decoder.forward import Decoder, feed_chunks, forward
from kestrel_trio._model.weights.gguf_checkpoint import load_gguf_weights
from kestrel_trio._model.gguf.config import config_from_gguf, gguf_architecture
from kestrel_trio._model.gguf.reader import GgufFile, is_gguf_file
from kestrel_trio._model.cache.kv_cache import BLOCK_TOKENS, KVCache, KVCacheFull, kv_token_bytes
from kestrel_trio._model.cache.kv_storage import KV_DTYPES, storage_dtype, to_storage
from kestrel_trio._model.decoder.layers import linear
from kestrel_trio._model.products.matmul import (
    UPCAST_CHUNK, choose_small_batch_call, product_threads, set_product_threads, small_batch_call,
    warm_fused_products,
)
from kestrel_trio._model.gguf.names import gguf_name
from kestrel_trio._model.forms.packed import GgmlRows, PackedMatrix
from kestrel_trio._model.cache.prefix_cache import PrefixCache
from kestrel_trio._model.vision.qwen3_vl import Qwen3VL, VLPrompt, load_qwen3_vl
from kestrel_trio._model.vision.qwen3_vl_config import is_qwen3_vl, vl_config_from_dict
from kestrel_trio._model.vision.qwen3_vl_gguf import load_qwen3_vl_gguf, mmproj_image_fields, vl_config_from_gguf
from kestrel_trio._model.weights.quant_cache import default_cache_dir
from kestrel_trio._model.weights.resident import mapped_bytes
from kestrel_trio._model.checkpoints.random_init import random_tensors, write_random_checkpoint
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.checkpoints.shapes import expected_shapes
from kestrel_trio._model.vision.tower import vision_shapes
from kestrel_trio._model.weights.residency import (
    describe_weights, load_weights, packed_matrices, resident_bytes, resolve_residency,
)
from kestrel_trio._model.weights.assemble import assemble_weights

__all__ = [
    # config, and the files a model folder names
    "ModelConfig", "config_from_dict", "read_config", "read_config_json", "read_json_object",
    "check_folder_files", "confined",
    # weights and checkpoints
    "load_weights", "assemble_weights", "resolve_residency", "expected_shapes", "random_tensors",
    "write_random_checkpoint", "GgufFile", "is_gguf_file", "load_gguf_weights",
    "config_from_gguf", "gguf_architecture",
    # forward passes and caches
    "Decoder", "forward", "feed_chunks", "KVCache", "PrefixCache", "linear",
    # embeddings: pooled final hidden states
    "POOLINGS", "EmbeddingRun", "read_pooling", "gguf_pooling", "normalize",
    # KV storage and its memory
    "BLOCK_TOKENS", "KVCacheFull", "kv_token_bytes", "KV_DTYPES", "storage_dtype", "to_storage", "mapped_bytes",
    # Qwen3-VL
    "Qwen3VL", "VLPrompt", "is_qwen3_vl", "load_qwen3_vl", "vl_config_from_dict",
    "load_qwen3_vl_gguf", "mmproj_image_fields", "vl_config_from_gguf",
    # product threads and kernels
    "choose_small_batch_call", "product_threads", "set_product_threads", "small_batch_call", "UPCAST_CHUNK",
    "warm_fused_products", "packed_matrices",
    # one model's kernel settings, and the defaults of models loaded without their own
    "Backend", "defaults", "set_default_products", "default_products", "set_default_prefill_precision",
    "prefill_precision",
    "PREFILL_PRECISIONS",
    # quantized residency
    "PackedMatrix", "GgmlRows", "default_cache_dir", "describe_weights", "resident_bytes",
    # for the benchmarks' checkpoints and tables
    "gguf_name", "SafetensorsCheckpoint", "vision_shapes",
]
