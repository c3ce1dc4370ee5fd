"""Test support shared by the engine and server suites: a step gate, a bounded poll, a greedy reference.

Importable from any test as ``step_gate`` (pytest's ``pythonpath`` includes tests/).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import numpy as np
import trio

from kestrel_trio.model import Model

_GATE_SAFETY_SECONDS = 30.0  # a held step never blocks longer than this, even if a test forgets to release


class StepGate:
    """Wraps the engine's batched model step so a test can hold the worker thread mid-step.

    Install it in place of ``kestrel_trio.engine.engine.step_generations``.
    While held, each step blocks in its worker thread, before any compute,
    until it is let through (:meth:`allow`) or the gate opens (:meth:`release`).

    Attributes:
        blocked: steps that have blocked so far (each counts once).

    Args:
        step: the real ``step_generations``.
    """

    def __init__(self, step: Callable) -> None:
        self._step = step
        self._cond = threading.Condition()
        self._held = False
        self._passes = 0  # steps that may still go through while held
        self.blocked = 0
        self._changed = trio.Event()

    def hold(self, after: int = 0) -> None:
        """Let ``after`` more steps through, then block every step."""
        with self._cond:
            self._held, self._passes = True, after

    def allow(self, steps: int = 1) -> None:
        """Let ``steps`` more steps through (blocked ones first)."""
        with self._cond:
            self._passes += steps
            self._cond.notify_all()

    def release(self) -> None:
        """Open the gate for good."""
        with self._cond:
            self._held = False
            self._cond.notify_all()

    @contextlib.contextmanager
    def held(self, after: int = 0):
        """``hold(after)`` for the duration of the block; always released on exit."""
        self.hold(after)
        try:
            yield self
        finally:
            self.release()

    async def until_blocked(self, count: int = 1) -> None:
        """Wait until ``count`` steps in all have blocked (the last one is still blocked unless let through)."""
        while self.blocked < count:
            await self._changed.wait()

    def _note_blocked(self) -> None:
        self.blocked += 1
        self._changed.set()
        self._changed = trio.Event()

    def _may_pass(self) -> bool:
        return not self._held or self._passes > 0

    def __call__(self, decoder, generations, *args):
        with self._cond:
            must_block = not self._may_pass()
        if must_block:
            trio.from_thread.run_sync(self._note_blocked)
        with self._cond:
            if not self._cond.wait_for(self._may_pass, timeout=_GATE_SAFETY_SECONDS):
                raise RuntimeError("the test never let a held step through")
            if self._held:
                self._passes -= 1
        return self._step(decoder, generations, *args)


async def wait_until(predicate: Callable[[], bool], interval: float = 0.01) -> None:
    """Poll ``predicate`` every ``interval`` seconds; the caller's fail_after bounds the wait."""
    while not predicate():
        await trio.sleep(interval)


def greedy_tokens(model: Model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation straight from the model, over real tokens only (padding rows of the
    embedding past the tokenizer's vocabulary are never picked, as in the engine's sampler)."""
    usable = min(model.config.vocab_size, model.require_tokenizer().vocab_size)
    cache = model.new_cache()
    logits = model.prefill(cache, prompt_ids)  # [vocab]
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        tokens.append(int(np.argmax(logits[:usable])))
        logits = model.step(cache, tokens[-1:])
    return tokens
