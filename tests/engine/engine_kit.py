"""Test support for the engine suite: a step gate, a bounded poll, an engine for a block.

StepGate, wait_until and greedy_tokens live in tests/step_gate.py, shared with the server suite.
"""

from __future__ import annotations

import contextlib
import functools
from typing import AsyncIterator

import trio

from kestrel_trio.engine import Engine, EngineLimits, run_engine
from kestrel_trio.model import Model
from step_gate import StepGate, greedy_tokens, wait_until  # noqa: F401 (re-exported to the tests)

# A prompt that repeats itself: prompt lookup (speculative decoding) finds drafts in it.
REPEATING = "the quick brown fox jumps over the lazy dog. " * 4

@contextlib.asynccontextmanager
async def running_engine(model: Model, draft_model: Model | None = None, **limits) -> AsyncIterator[Engine]:
    """``run_engine(model, limits=EngineLimits(**limits), draft_model=draft_model)`` for the duration of the block."""
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model, limits=EngineLimits(**limits),
                                                       draft_model=draft_model))
        try:
            yield engine
        finally:
            nursery.cancel_scope.cancel()
