"""The terminal commands ``generate`` and ``chat``: the sans-IO generation loop, driven synchronously.

Ctrl-C (KeyboardInterrupt) arrives between model steps; in ``chat`` it stops
the current answer and returns to the prompt.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from kestrel_trio.cli.progress import LoadProgress, checkpoint_bytes, is_terminal
from kestrel_trio.model import DEMO_MODEL_ID, CheckedModel, Model, load_demo_model, load_model, set_blas_threads
from kestrel_trio.errors import BadRequestError
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.context_length import check_context
from kestrel_trio.text.generation import Generation
from kestrel_trio.text.repetition import RepetitionGuard

__all__ = ["load_with_progress", "generate_once", "chat_loop"]


def load_with_progress(path: CheckedModel | str | None, *, weights: str = "auto", blas_threads: int | None = None,
                       quantized_cache: str | bool = True) -> Model:
    """Load a checkpoint (checked, or a path; None: the demo model) showing its progress on stderr (see
    :class:`LoadProgress`)."""
    if blas_threads is not None:
        set_blas_threads(blas_threads)
    if path is None:
        print(f"kestrel-trio: no --model given, using the built-in demo model {DEMO_MODEL_ID!r}: its weights are "
              "random, so its text is meaningless.", file=sys.stderr)
        progress = LoadProgress("building demo weights")
        progress(0.0)
        model = load_demo_model()
        progress(1.0)
        return model
    progress = LoadProgress("loading weights",
                            total_bytes=checkpoint_bytes(path.path, path.mmproj) if isinstance(path, CheckedModel)
                            else checkpoint_bytes(path))
    try:
        return load_model(path, progress=progress, weights=weights, quantized_cache=quantized_cache)
    finally:
        progress.close()


# The sampling settings of generate's flags and chat's /set, by SamplingParams field; None: the model's default.
SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", "repetition_guard")
_ALIASES = {"repeat_penalty": "repetition_penalty"}  # llama.cpp's name


def _settings(args: argparse.Namespace) -> dict:
    """The sampling settings the command line chose."""
    return {name: getattr(args, name) for name in SETTINGS}


def _params(settings: dict, model: Model, prompt_tokens: int) -> SamplingParams:
    max_tokens = min(settings["max_tokens"], max(1, model.context_length - prompt_tokens))
    check_context(prompt_tokens, max_tokens, model.context_length, param="prompt")
    return SamplingParams.with_defaults({**settings, "max_tokens": max_tokens}, model.generation_defaults)


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
        _text, reason = _stream(model, ids, _params(_settings(args), model, len(ids)), out)
    except KeyboardInterrupt:
        out.write("\n")
        print("[stopped]", file=sys.stderr)
        return 130
    out.write("\n")
    print(f"[finish_reason: {reason}]", file=sys.stderr)
    return 0


CHAT_COMMANDS = (
    ("/help", "list these commands"),
    ("/reset", "forget the conversation so far"),
    ("/set", "list the sampling settings; /set NAME VALUE changes one, /set NAME default restores the model's"),
    ("/exit", "leave (also /quit or Ctrl-D)"),
)
CHAT_HELP = "\n".join(
    ["commands:"] + [f"  {name:<8} {what}" for name, what in CHAT_COMMANDS]
    + ["  //text   send a message that begins with /",
       "settings: " + ", ".join(SETTINGS) + " (e.g. /set temperature 0.2, /set repetition_guard 128:4, "
       "/set repetition_guard off)",
       "Ctrl-C stops an answer being written; the arrow keys edit the line and recall earlier ones."]
) + "\n"


def _setting_lines(settings: dict, model: Model) -> dict[str, str]:
    """Each setting's line: its value now, ``(default)`` where it is the model's (or the library's)."""
    effective = SamplingParams.with_defaults({**settings, "max_tokens": None}, model.generation_defaults)
    lines = {}
    for name in SETTINGS:
        value = settings[name] if name == "max_tokens" else getattr(effective, name)
        if name == "repetition_guard":
            value = "off" if value is None else value.describe()
        chosen = settings[name] is not None or name == "max_tokens"
        lines[name] = f"{name} {'none' if value is None else value}" + ("" if chosen else " (default)")
    return lines


def _set(settings: dict, words: list[str], model: Model) -> str:
    """Apply ``/set [NAME VALUE]``; what to print."""
    if not words:
        return "".join(f"  {line}\n" for line in _setting_lines(settings, model).values())
    name = words[0].replace("-", "_")
    name = _ALIASES.get(name, name)
    if name not in SETTINGS or len(words) != 2:
        return f"usage: /set NAME VALUE, NAME one of {', '.join(SETTINGS)} (/set alone lists them)\n"
    try:
        value = _setting_value(name, words[1])
        if value is not None:
            SamplingParams(**{name: value})  # the ranges of the server and the flags
    except BadRequestError as exc:
        return f"{name}: {exc.message}\n"
    except ValueError as exc:
        return f"{name}: {exc}\n"
    settings[name] = value
    return f"[{_setting_lines(settings, model)[name]}]\n"


def _setting_value(name: str, text: str):
    """``text`` as the value of setting ``name``; None for ``default`` (and ``off`` of the guard)."""
    if name == "max_tokens" and text.lower() == "default":
        raise ValueError("give a number of tokens (it has no model default)")
    if text.lower() == "default" or (name == "repetition_guard" and text.lower() == "off"):
        return None
    if name == "repetition_guard":
        return RepetitionGuard.parse(text)
    if name in ("top_k", "max_tokens", "seed"):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer (or 'default')") from None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number (or 'default')") from None


def _line_reader(stdin: TextIO, out: TextIO):
    """A function ``read(prompt) -> line or None at end of input``.

    On a terminal that is ``input()`` with the standard library's readline
    loaded (line editing, history of this session, Tab completes a /command);
    elsewhere a plain read of ``stdin``, so pipes and tests see exactly the
    bytes they sent.
    """
    if stdin is sys.stdin and out is sys.stdout and is_terminal(stdin) and is_terminal(out):
        _enable_readline()

        def read_terminal(prompt: str) -> str | None:
            try:
                return input(prompt)
            except EOFError:
                return None

        return read_terminal

    def read_stream(prompt: str) -> str | None:
        out.write(prompt)
        out.flush()
        line = stdin.readline()
        return line if line else None

    return read_stream


def _enable_readline() -> None:
    try:
        import readline  # importing it is what gives input() line editing and history
    except ImportError:  # no readline on this platform (Windows): input() still works, unedited
        return
    names = [name for name, _what in CHAT_COMMANDS] + ["/quit"]

    def complete(text: str, state: int) -> str | None:
        matches = [name for name in names if name.startswith(text)] if text.startswith("/") else []
        return matches[state] if state < len(matches) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t\n")
    readline.parse_and_bind("tab: complete")


def chat_loop(model: Model, args: argparse.Namespace, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    """``kestrel-trio chat``: multi-turn chat; /help lists the commands, /exit or Ctrl-D leaves.

    A line beginning with ``/`` is a command, answered here and never sent to
    the model (an unknown one says so); ``//`` sends a message that begins with ``/``.
    """
    history: list[dict] = []
    settings = _settings(args)
    read = _line_reader(stdin, out)
    out.write("kestrel-trio chat: /help lists the commands, /exit or Ctrl-D leaves, Ctrl-C stops an answer.\n")
    while True:
        try:
            line = read(">>> ")
        except KeyboardInterrupt:
            out.write("\n")
            continue
        if line is None:
            out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and not text.startswith("//"):
            command = text.split()[0]
            if command in ("/exit", "/quit"):
                return 0
            if command == "/reset":
                history.clear()
                out.write("[history cleared]\n")
            elif command == "/help":
                out.write(CHAT_HELP)
            elif command == "/set":
                out.write(_set(settings, text.split()[1:], model))
            else:
                out.write(f"unknown command {command!r}: /help lists the commands (// sends a message that "
                          "begins with /)\n")
            continue
        if text.startswith("//"):
            text = text[1:]
        history.append({"role": "user", "content": text})
        prompt = model.apply_chat_template(history, **_template_kwargs(args))
        ids = model.encode(prompt)
        try:
            answer, _reason = _stream(model, ids, _params(settings, model, len(ids)), out)
        except KeyboardInterrupt:
            history.pop()
            out.write("\n[stopped]\n")
            continue
        out.write("\n")
        history.append({"role": "assistant", "content": answer})
