"""Constrained decoding: a grammar bound to the model's tokenizer, and the per-token masks it yields.

Theory of operation:

* :func:`grammar_vocab` builds, once per tokenizer, llguidance's view of the
  vocabulary (a token trie over each token's bytes) from the tokenizer's own
  tokenizer.json. It takes about a second for Qwen's 151k tokens, so it is
  built lazily, off the event loop, by the first request that needs it.
* :func:`compile_constraint` checks a grammar against that vocabulary and
  keeps one ready matcher as a prototype (its first mask already computed:
  the lexer states it builds are shared by every copy): the
  :class:`Constraint`, immutable and shared by every choice of a request. It raises BadRequestError before
  any compute when the grammar cannot be built.
* Each generation starts its own :class:`ConstraintState` (a copy of the
  prototype, microseconds). The state is *active* while the next token must
  follow the grammar; before that it is *waiting*:
    - for the end of a reasoning block (``</think>``) when the prompt opened
      one: the reasoning stays free, the answer after it is constrained
      (past up to two newlines, which Qwen writes after ``</think>`` and the
      reasoning splitter drops);
    - for its trigger (``<tool_call>`` for ``tool_choice: "auto"``): text is
      free until the model opens a call; the call is constrained, and once
      it closes the state waits for the next one.
  Waiting costs one bytes comparison per token.
* While active, the matcher's bitmask (one bit per token id) decides the
  tokens that may be drawn: :meth:`ConstraintState.token_mask` turns it into
  a boolean row the sampler applies before temperature and truncation. End
  of sequence is allowed exactly where the grammar accepts (llguidance's EOS
  bit stands for every EOS id of the model), and once the grammar is complete
  nothing else is. A generation that reaches max_tokens first just ends with
  ``finish_reason: "length"``.
* :func:`start_masks` computes the masks of every active state of a batched
  step at once, in a helper thread, while the step's forward pass runs (both
  release the GIL): llguidance spreads the batch over its own threads. The
  sampler then waits only for whatever is left of that work.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import attrs
import llguidance
import numpy as np

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.chat_formats import qwen3
from kestrel_trio.text.constraints.grammar import clean_message, schema_error
from kestrel_trio.text.tokens.tokenizer import Tokenizer

__all__ = ["GrammarVocab", "grammar_vocab", "Constraint", "ConstraintState", "compile_constraint", "start_masks"]

log = logging.getLogger("kestrel_trio.grammar")

# The reasoning block's tags, watched for in the bytes written while waiting (Qwen3's, the one family that
# reasons: kestrel_trio.text.chat_formats).
THINK_START = qwen3.TAGS.start.encode()
THINK_END = qwen3.TAGS.end.encode()
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)  # llguidance's defaults otherwise (fuel, grammar size)
_MASK_THREADS = max(1, min(4, os.cpu_count() or 1))  # llguidance's own workers for a batch of masks


class GrammarVocab:
    """llguidance's tokenizer for one model: token bytes, the EOS ids, the mask width.

    Args:
        tokenizer: the model's tokenizer.
        vocab_size: rows of the model's logits (may exceed the tokenizer's; padding rows are never allowed).
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.eos_ids = np.array(sorted(tokenizer.eos_token_ids), dtype=np.int64)  # [n_eos]
        if self.eos_ids.size == 0:
            raise BadRequestError("structured outputs need a model with an end-of-sequence token")
        self.eos_set = frozenset(int(i) for i in self.eos_ids)
        self.vocab_size = vocab_size
        self.llg = llguidance.LLTokenizer(tokenizer.to_json(), n_vocab=vocab_size, eos_token=int(self.eos_ids[0]))
        self.words = (vocab_size + 31) // 32  # int32 words per mask row
        self._tokenizer = weakref.ref(tokenizer)  # not a strong one: the cache below is keyed weakly by it
        # Single tokens of only newlines, by their length: what may separate </think> from the answer.
        self.newlines = {ids[0]: len(text) for text in ("\n", "\n\n") if len(ids := tokenizer.encode(text)) == 1}

    def special_token(self, text: str) -> int | None:
        """The id of ``text`` when it is one special token for llguidance (``<tool_call>`` in Qwen), else None."""
        tokenizer = self._tokenizer()
        token = tokenizer.token_to_id(text) if tokenizer is not None else None
        return token if token is not None and self.llg.is_special_token(token) else None

    def token_bytes(self, token: int) -> bytes:
        return self.llg.decode_bytes([token])


_vocabs: weakref.WeakKeyDictionary[Tokenizer, GrammarVocab] = weakref.WeakKeyDictionary()
_vocabs_lock = threading.Lock()


def grammar_vocab(tokenizer: Tokenizer, vocab_size: int) -> GrammarVocab:
    """The :class:`GrammarVocab` of ``tokenizer``, built at the first call (about a second; call it off the event loop)."""
    with _vocabs_lock:  # two first requests at once build it once
        vocab = _vocabs.get(tokenizer)
        if vocab is None or vocab.vocab_size != vocab_size:
            vocab = _vocabs[tokenizer] = GrammarVocab(tokenizer, vocab_size)
        return vocab


@attrs.frozen(eq=False)
class Constraint:
    """A compiled grammar for one request, shared by all its choices.

    Attributes:
        kind: what it came from (``json_schema``, ``json_object``, ``regex``, ``choice``, ``grammar``,
            ``tool_call``), for /metrics.
        vocab: the model's grammar vocabulary.
        trigger: bytes that switch the constraint on each time the output ends with them (None: from the start).
        in_reasoning: the prompt opened a reasoning block: the constraint waits for its end.
    """

    kind: str
    vocab: GrammarVocab
    prototype: Any = attrs.field(repr=False)  # an llguidance.LLMatcher in its start state, never advanced
    trigger: bytes | None = None
    in_reasoning: bool = False

    def start(self) -> ConstraintState:
        """A fresh state for one generation."""
        return ConstraintState(self)


def compile_constraint(vocab: GrammarVocab, grammar: str, *, kind: str, param: str, schema: Any = None,
                       trigger: bytes | None = None, in_reasoning: bool = False) -> Constraint:
    """Bind ``grammar`` (from :mod:`kestrel_trio.text.constraints.grammar`) to the model's vocabulary.

    Args:
        vocab: from :func:`grammar_vocab`.
        grammar: llguidance grammar text.
        kind: see :class:`Constraint`.
        param: the request field the grammar came from, for the error.
        schema: the JSON schema as sent, when the grammar is one, to point the error at a keyword.
        trigger: see :class:`Constraint`.
        in_reasoning: see :class:`Constraint`.

    Raises:
        BadRequestError: the grammar cannot be built (``param`` names the field, or the keyword at fault).
    """
    try:
        # Not verbose: llguidance's verbose errors dump the grammar and parser state into the message.
        matcher = llguidance.LLMatcher(vocab.llg, grammar, log_level=0, limits=_LIMITS)
    except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException, a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        log.error("the grammar compiler failed on %s: %s: %s", param, type(exc).__name__,
                  str(exc).splitlines()[0][:500] if str(exc) else "")
        raise BadRequestError(f"'{param}' cannot be used for structured outputs: the grammar compiler failed on "
                              "it (an internal error)", param=param) from None
    if matcher.is_error():
        message = matcher.get_error()
        if schema is not None:
            raise schema_error(message, schema, param)
        raise BadRequestError(f"'{param}' cannot be used for structured outputs: {clean_message(message)}",
                              param=param)
    # The first mask builds lexer states that every copy shares: pay for it here, off the event loop,
    # rather than in a batched step. Computing a mask does not advance the matcher.
    scratch = np.empty(vocab.words, dtype=np.int32)  # [words]
    matcher.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
    return Constraint(kind, vocab, matcher, trigger, in_reasoning)


class ConstraintState:
    """One generation's progress through its constraint (see the module doc).

    Attributes:
        ended: the grammar was complete and the generation drew an EOS: it must stop
            (even with ``ignore_eos``: nothing can follow a complete answer).
    """

    def __init__(self, constraint: Constraint) -> None:
        self._vocab = constraint.vocab
        self._matcher = constraint.prototype.deep_copy()
        self._trigger = constraint.trigger
        self._in_reasoning = constraint.in_reasoning
        self._active = not self._in_reasoning and self._trigger is None
        self._tail = b""  # the last bytes written while waiting, to spot a trigger split over tokens
        self._watch = max(len(THINK_END), len(self._trigger or b""))
        self._pending: _MaskBatch | None = None
        self._row = 0
        self._timing: tuple[float, float] | None = None
        self._gap = 0  # newlines still allowed before the answer, right after a reasoning block
        self.ended = False

    @property
    def active(self) -> bool:
        """Whether the next token must follow the grammar."""
        return self._active and not self.ended

    def token_mask(self) -> np.ndarray:
        """Bool [vocab_size]: the tokens the grammar allows next (computed now unless :func:`start_masks` did)."""
        vocab = self._vocab
        batch, self._pending = self._pending, None
        if batch is None:
            batch = _MaskBatch([self])
            batch.run()
        row, wait = batch.row(self._row)
        self._timing = (batch.seconds, wait)
        allowed = np.unpackbits(row.view(np.uint8), count=vocab.vocab_size, bitorder="little").view(np.bool_)
        may_end = bool(allowed[vocab.eos_ids[0]])
        allowed[vocab.eos_ids] = may_end
        for token, length in vocab.newlines.items() if self._gap else ():
            if length <= self._gap:
                allowed[token] = True
        if not allowed.any():  # only after a matcher error: ending is the one safe move
            log.warning("a grammar allowed no token (%s); ending the generation", self._matcher.get_error() or "no error")
            allowed[vocab.eos_ids] = True
        return allowed

    def consume(self, token: int) -> None:
        """Advance past the token the generation drew."""
        if self.ended:
            return
        if not self._active:
            self._wait(token)
            return
        if self._gap:
            length = self._vocab.newlines.get(token, 0)
            if 0 < length <= self._gap:  # a newline between </think> and the answer: not part of it
                self._gap -= length
                return
            self._gap = 0
        if token in self._vocab.eos_set:
            self.ended = True
            return
        if not self._matcher.consume_token(token):
            log.warning("a grammar refused token %d: %s", token, self._matcher.get_error())
            self.ended = True
            return
        if self._trigger is not None and self._matcher.is_stopped():  # a triggered block is closed: wait for the next
            self._matcher.reset()
            self._active, self._tail = False, b""

    def take_timing(self) -> tuple[float, float] | None:
        """(seconds computing the last mask's batch, seconds waiting for it) once per mask, then None."""
        timing, self._timing = self._timing, None
        return timing

    def _wait(self, token: int) -> None:
        self._tail = (self._tail + self._vocab.token_bytes(token))[-self._watch:]
        if self._in_reasoning:
            if self._tail.endswith(THINK_END):
                self._in_reasoning, self._tail = False, b""
                self._active = self._trigger is None
                self._gap = 2 if self._active else 0
        elif self._trigger is not None and self._tail.endswith(self._trigger):
            self._active, self._tail = True, b""
        elif self._tail.endswith(THINK_START):
            self._in_reasoning, self._tail = True, b""


class _MaskBatch:
    """The masks of several states, one row each, filled by one llguidance call."""

    def __init__(self, states: list[ConstraintState]) -> None:
        self._matchers = [state._matcher for state in states]
        self.bitmask = np.empty((len(states), states[0]._vocab.words), dtype=np.int32)  # [B, words]
        self.seconds = 0.0
        self._future: concurrent.futures.Future | None = None

    def run(self) -> None:
        started = time.perf_counter()
        rows, width = self.bitmask.shape
        if rows == 1:
            self._matchers[0].unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        else:
            _executor().unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(self._matchers)],
                                                self.bitmask.ctypes.data, width * 4, rows)
        self.seconds = time.perf_counter() - started

    def submit(self) -> None:
        self._future = _helper().submit(self.run)

    def row(self, index: int) -> tuple[np.ndarray, float]:
        """Row ``index`` (int32 [words]) and the seconds spent waiting for it."""
        if self._future is None:
            return self.bitmask[index], 0.0
        started = time.perf_counter()
        self._future.result()
        return self.bitmask[index], time.perf_counter() - started


def start_masks(states: Iterable[ConstraintState], *, beside: bool = True) -> None:
    """Compute the next mask of every active state in one llguidance call; ``token_mask`` collects each.

    Call it right before the forward pass whose logits the masks will filter:
    the states' matchers must not be advanced until then.

    Args:
        states: the constraint states of the sequences that sample after this forward.
        beside: compute in the helper thread while the caller runs the forward
            (False: now, in this thread; benchmarks/features/bench_grammar.py compares the two).
    """
    active = [state for state in states if state.active]
    if not active:
        return
    batch = _MaskBatch(active)
    for i, state in enumerate(active):
        state._pending, state._row = batch, i
    if beside:
        batch.submit()
    else:
        batch.run()


_shared: dict[str, Any] = {}
_shared_lock = threading.Lock()


def _helper() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that computes a step's masks beside its forward pass."""
    with _shared_lock:
        if "helper" not in _shared:
            _shared["helper"] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kestrel-masks")
        return _shared["helper"]


def _executor() -> llguidance.LLExecutor:
    with _shared_lock:
        if "executor" not in _shared:
            _shared["executor"] = llguidance.LLExecutor(_MASK_THREADS)
        return _shared["executor"]

