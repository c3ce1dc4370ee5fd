"""The terminal commands ``generate`` and ``chat``: the sans-IO generation loop, driven synchronously.

Ctrl-C (KeyboardInterrupt) arrives between model steps; in ``chat`` it stops
the current answer and returns to the prompt.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from kestrel_trio.model import DEMO_MODEL_ID, Model, load_demo_model, load_model, set_blas_threads
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.generation import Generation, check_context

__all__ = ["load_with_progress", "generate_once", "chat_loop"]


class ProgressBar:
    """A one-line text progress bar on a terminal stream."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.label = label
        self.stream = stream
        self.width = width
        self._shown = -1

    def __call__(self, fraction: float) -> None:
        percent = int(fraction * 100)
        if percent == self._shown:
            return
        self._shown = percent
        filled = int(fraction * self.width)
        self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (self.width - filled)}] {percent:3d}%")
        if percent >= 100:
            self.stream.write("\n")
        self.stream.flush()


def load_with_progress(path: str | None, *, weights: str = "auto", blas_threads: int | None = None) -> Model:
    """Load a checkpoint (or the demo model) showing a progress bar on stderr."""
    if blas_threads is not None:
        set_blas_threads(blas_threads)
    if path is None:
        print(f"kestrel-trio: no --model given, using the built-in demo model {DEMO_MODEL_ID!r}: its weights are "
              "random, so its text is meaningless.", file=sys.stderr)
        bar = ProgressBar("building demo weights")
        bar(0.0)
        model = load_demo_model()
        bar(1.0)
        return model
    return load_model(path, progress=ProgressBar("loading weights"), weights=weights)


def _params(args: argparse.Namespace, model: Model, prompt_tokens: int) -> SamplingParams:
    max_tokens = min(args.max_tokens, max(1, model.context_length - prompt_tokens))
    check_context(prompt_tokens, max_tokens, model.context_length, param="prompt")
    requested = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed, "max_tokens": max_tokens}
    defaults = model.tokenizer.generation_defaults if model.tokenizer is not None else {}
    return SamplingParams.with_defaults(requested, defaults)


def _stream(model: Model, prompt_ids: list[int], params: SamplingParams, out: TextIO) -> tuple[str, str]:
    """Generate and print text as it comes; returns (text, finish_reason)."""
    tokenizer = model.require_tokenizer()
    generation = Generation(prompt_ids, params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                            cache=model.new_cache(), vocab_size=model.config.vocab_size)
    pieces: list[str] = []
    while generation.finish_reason is None:
        result = generation.advance(model.step(generation.cache, generation.next_input()))
        if result.text:
            pieces.append(result.text)
            out.write(result.text)
            out.flush()
    return "".join(pieces), generation.finish_reason


def _template_kwargs(args: argparse.Namespace) -> dict:
    return {"enable_thinking": False} if args.no_think else {}


def generate_once(model: Model, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """``kestrel-trio generate``: one answer to one prompt, streamed to ``out``."""
    if args.raw or not model.has_chat_template:
        prompt = args.prompt
    else:
        prompt = model.apply_chat_template([{"role": "user", "content": args.prompt}], **_template_kwargs(args))
    ids = model.encode(prompt)
    try:
        _text, reason = _stream(model, ids, _params(args, model, len(ids)), out)
    except KeyboardInterrupt:
        out.write("\n")
        print("[stopped]", file=sys.stderr)
        return 130
    out.write("\n")
    print(f"[finish_reason: {reason}]", file=sys.stderr)
    return 0


def chat_loop(model: Model, args: argparse.Namespace, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    """``kestrel-trio chat``: multi-turn chat; /reset clears history, /exit or Ctrl-D leaves."""
    history: list[dict] = []
    out.write("kestrel-trio chat: /reset clears the history, /exit or Ctrl-D leaves, Ctrl-C stops an answer.\n")
    while True:
        out.write(">>> ")
        out.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            out.write("\n")
            continue
        if not line:
            out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            history.clear()
            out.write("[history cleared]\n")
            continue
        history.append({"role": "user", "content": text})
        prompt = model.apply_chat_template(history, **_template_kwargs(args))
        ids = model.encode(prompt)
        try:
            answer, _reason = _stream(model, ids, _params(args, model, len(ids)), out)
        except KeyboardInterrupt:
            history.pop()
            out.write("\n[stopped]\n")
            continue
        out.write("\n")
        history.append({"role": "assistant", "content": answer})
