"""The flags the ``kestrel-trio`` commands share, the argparse types that check their values, and what the
commands read back from them (the quantized cache, the sampling defaults).

A bad value stops at argparse with the flag named, before any model loads.
"""

from __future__ import annotations

import argparse
import os

import attrs

from kestrel_trio.hub.commands import MODEL_HELP


def at_least(minimum: float, kind: type = int):
    """An argparse type: a number of ``kind`` that is >= ``minimum`` (argparse names the flag on failure)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        return value

    return parse


def tcp_port(text: str) -> int:
    port = at_least(0)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {port}")
    return port


def existing_folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    return text


def cors_origin(text: str) -> str:
    from kestrel_trio.http.policy.cors import normalize_origin

    try:
        return normalize_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


COUNT = at_least(1)
SECONDS = at_least(0.0, float)
POSITIVE_SECONDS = at_least(1e-3, float)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="MODEL", default=None, help=MODEL_HELP)
    parser.add_argument("--mmproj", metavar="FILE", default=None,
                        help="the vision tower of a Qwen3-VL GGUF --model: llama.cpp's mmproj GGUF file "
                             "(projector qwen3vl_merger; F32, F16, BF16 or Q8_0), so that it takes images (default: "
                             "none, or the projector a hub GGUF repo holds beside a Qwen3-VL --model)")
    parser.add_argument("--weights", choices=["auto", "fp32", "bf16", "int8", "int4", "gguf"], default="auto",
                        help="weights in memory (docs/memory.md): fp32 copies; bf16 mapped from the checkpoint; "
                             "int8 or int4, a checkpoint folder quantized at load (and cached); gguf, a GGUF file's "
                             "tensors as stored, mapped; auto: for a folder the first of fp32, bf16, int8, int4 "
                             "that fits the memory available, for a GGUF file gguf (default auto)")
    parser.add_argument("--quantized-cache", metavar="DIR", default=None,
                        help="where int8/int4 weights are cached so the next load maps them, or 'off' "
                             "(default: ~/.cache/kestrel-trio/quantized)")
    parser.add_argument("--blas-threads", type=COUNT, default=None,
                        help="threads numpy's BLAS may use (default: one per core)")
    parser.add_argument("--prefill-precision", choices=("fp32", "bf16"), default=None,
                        help="how prompts are multiplied with float32 weights: fp32, or bf16 in AMX tiles "
                             "(Intel Sapphire Rapids and later; faster prefill, logits within about 0.5%%; "
                             "docs/performance.md) (default fp32)")
    parser.add_argument("--exact-products", action="store_true",
                        help="multiply quantized GGUF weights exactly: each weight expanded to float32, as the "
                             "reference does, instead of llama.cpp's integer products with the activations "
                             "quantized to int8 (the default on aarch64 and on x86-64 with AVX2 for Q8_0, Q4_0, "
                             "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; logits within a few percent)")


def add_speculative_args(serve: argparse.ArgumentParser, engine: dict) -> None:
    from kestrel_trio.text.speculative import DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS, SPECULATIVE_MODES

    group = serve.add_argument_group("speculative decoding (batch 1; docs/performance.md)")
    group.add_argument("--speculative", choices=list(SPECULATIVE_MODES), default=None,
                       help="draft tokens and verify them in one forward pass when a single generation runs: "
                            "ngram drafts from the prompt and output so far (prompt lookup), draft from "
                            f"--draft-model (default {engine['speculative']}; draft with --draft-model)")
    group.add_argument("--draft-model", metavar="MODEL", default=None,
                       help="a small model with the same tokenizer that drafts tokens (as --model: a folder, "
                            ".gguf file, hub repo id or named model); implies --speculative draft (default: none)")
    defaults = ", ".join(f"{count} for {mode}" for mode, count in DEFAULT_SPECULATIVE_TOKENS.items())
    group.add_argument("--speculative-tokens", metavar="K", default=None, type=at_least(1),
                       help=f"tokens drafted per step, 1 to {MAX_SPECULATIVE_TOKENS} (default {defaults})")


def quantized_cache(args: argparse.Namespace) -> str | bool:
    """load_model's quantized_cache from --quantized-cache: True (the default folder), False ('off') or a folder."""
    if args.quantized_cache is None:
        return True
    return False if args.quantized_cache == "off" else args.quantized_cache


def _sampling(field: str, kind: type):
    """An argparse type: a value of SamplingParams' ``field``, refused with the message the server would give.

    The ranges live in one place, SamplingParams' validators; checking here
    refuses a bad value before the model loads.
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        from kestrel_trio.errors import BadRequestError
        from kestrel_trio.text import SamplingParams

        try:
            SamplingParams(**{field: value})
        except BadRequestError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return value

    return parse


def _repetition_guard(text: str):
    """An argparse type: a RepetitionGuard from WINDOW:REPEATS."""
    from kestrel_trio.errors import BadRequestError
    from kestrel_trio.text.repetition import RepetitionGuard

    try:
        return RepetitionGuard.parse(text)
    except BadRequestError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def add_sampling_choices(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: str) -> None:
    """The sampling flags ``serve``, ``generate`` and ``chat`` share (llama-server's names); ``default``: whose
    value applies when one is not given."""
    parser.add_argument("--temperature", type=_sampling("temperature", float), default=None,
                        help=f"0 to 2; 0 for greedy (default: {default}, else 1)")
    parser.add_argument("--top-p", type=_sampling("top_p", float), default=None,
                        help=f"nucleus sampling mass, above 0 and at most 1 (default: {default}, else 1, off)")
    parser.add_argument("--top-k", type=_sampling("top_k", int), default=None,
                        help=f"sample from the k most likely tokens; 0 or -1 off (default: {default}, else off)")
    parser.add_argument("--min-p", type=_sampling("min_p", float), default=None,
                        help=f"drop tokens less likely than MIN_P times the most likely one, 0 to 1 (default: "
                             f"{default}, else 0, off)")
    parser.add_argument("--repeat-penalty", "--repetition-penalty", dest="repetition_penalty", metavar="PENALTY",
                        type=_sampling("repetition_penalty", float), default=None,
                        help="divide the logits of tokens already in the prompt or answer by this (over the whole "
                             f"sequence, as transformers and vLLM do), 0.01 to 100; 1 off (default: {default}, "
                             "else 1)")
    parser.add_argument("--repetition-guard", metavar="WINDOW:REPEATS", type=_repetition_guard, default=None,
                        help="end an answer (finish_reason length) once its last WINDOW tokens are REPEATS or more "
                             "copies of one cycle, e.g. 128:4 (default: off)")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=_sampling("max_tokens", int), default=256,
                        help="most tokens to generate, >= 1 (default 256)")
    add_sampling_choices(parser, "the model's")
    parser.add_argument("--seed", type=_sampling("seed", int), default=None,
                        help="seed for reproducible sampling (default: none, a fresh random seed)")
    parser.add_argument("--no-think", action="store_true",
                        help="disable Qwen3 thinking, enable_thinking=false (default: off, the model may think)")


def sampling_defaults(args: argparse.Namespace):
    """serve's SamplingDefaults from its sampling flags."""
    from kestrel_trio.text.sampling import SamplingDefaults

    return SamplingDefaults(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, repetition_guard=args.repetition_guard)


def limit_defaults(limits: type) -> dict:
    """The field defaults of an attrs limits class: each default lives there, once."""
    return {field.name: field.default for field in attrs.fields(limits)}


def mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"

