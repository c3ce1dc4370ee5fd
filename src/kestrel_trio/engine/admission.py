"""Admission: where a request becomes a queued job, and the consumer's end of it.

``open_generations`` is the one place a generation is admitted (the engine's state, the images, the context and
KV budget, the queue's room: all of a request's generations or none); ``open_embeddings`` admits a batch of texts
to embed as one job the same way. A :class:`GenerationHandle` is what the caller iterates; closing it abandons the
job. ``end_generations`` ends every stream at once. The theory of operation is
:mod:`kestrel_trio.engine.engine`'s docstring.
"""

from __future__ import annotations

import collections
import copy
from typing import Sequence

import attrs
import trio

from kestrel_trio.engine.embeddings import EmbeddingHandle, EmbeddingJob, EmbeddingRequest, new_job
from kestrel_trio.engine.memory.kv_budget import KVBudget
from kestrel_trio.engine.metrics import EngineMetrics
from kestrel_trio.engine.speculation import Speculation
from kestrel_trio.engine.types import Delta, EngineLimits, GenerationRequest
from kestrel_trio.errors import (
    BadRequestError, ContextLengthError, EngineUnavailableError, KestrelError, QueueFullError,
)
from kestrel_trio.model import Model
from kestrel_trio.text.context_length import check_context
from kestrel_trio.text.generation import Generation

__all__ = ["Admission", "GenerationHandle", "Job"]


@attrs.define(eq=False)
class Job:
    """One accepted request, from queue to its terminal result."""

    generation: Generation
    results: trio.MemorySendChannel
    receiver: trio.MemoryReceiveChannel
    enqueued_at: float
    abandoned: bool = False
    done: bool = False
    steps: int = 0
    steps_after_abandon: int = 0
    admitted_at: float | None = None
    last_token_at: float | None = None
    kv_bytes: int = 0  # KV reserved for it once admitted: prompt + max_tokens, in whole blocks
    waited_for_kv: bool = False

    @property
    def phase(self) -> str:
        if self.admitted_at is None:
            return "queued"
        return self.generation.phase.value


class Admission:
    """The client side of the engine: admit requests onto its queue, abandon them, end every stream.

    Mixed into :class:`~kestrel_trio.engine.engine.Engine`, whose ``__init__`` sets the state below and whose
    inference task takes the jobs off the queue (``_drain_queue_quietly`` is its).
    """

    model: Model
    limits: EngineLimits
    status: str
    kv: KVBudget
    speculation: Speculation
    metrics: EngineMetrics
    _queue_send: trio.MemorySendChannel
    _waiting: collections.deque[Job]
    _active: list[Job]
    _embed_waiting: collections.deque[EmbeddingJob]
    _embedding: EmbeddingJob | None
    _live_queued: int
    _ended: KestrelError | None

    def open_generation(self, request: GenerationRequest) -> "GenerationHandle":
        """Queue a generation; the handle iterates over its deltas.

        Use as ``async with engine.open_generation(request) as deltas:``.
        Leaving the block (or calling ``aclose()``) before the last delta
        cancels the generation: if queued, it never runs; if running, it stops
        after at most one more model step.

        Raises:
            QueueFullError: the queue is full (HTTP 429 with ``retry_after``).
            EngineUnavailableError: the engine is not running.
            ContextLengthError: the prompt plus max_tokens exceeds the context cap, or
                needs more KV than the whole KV budget.
            BadRequestError: the request has images and the model takes none.
        """
        return self.open_generations([request])[0]

    def open_generations(self, requests: Sequence[GenerationRequest]) -> list["GenerationHandle"]:
        """Queue every generation of one client request (its ``n`` choices), or none of them.

        This is where a generation is admitted: the engine's state, the
        images, the context length and the queue's room are each checked here
        and nowhere else, before anything is queued.

        Raises:
            EngineUnavailableError: the engine is not running.
            BadRequestError: more generations than the queue can ever hold, or
                images for a model that takes none.
            ContextLengthError: a prompt plus its max_tokens exceeds the context.
            QueueFullError: the queue has room for fewer than all of them (HTTP 429 with ``retry_after``).
        """
        if self.status != "ok":
            self.metrics.rejected.inc(reason="unavailable")
            raise EngineUnavailableError(f"the engine is not serving (status: {self.status})", retry_after=5)
        if len(requests) > self.limits.max_queued:
            raise BadRequestError(f"'n' must be at most {self.limits.max_queued} on this server (its queue size), "
                                  f"got {len(requests)}", param="n")
        generations = [self._new_generation(request) for request in requests]
        room = self.limits.max_queued - self._live_queued
        if len(generations) > room:
            self.metrics.rejected.inc(reason="queue_full")
            if len(generations) == 1:
                message = f"the request queue is full ({self.limits.max_queued} waiting); retry later"
            else:
                message = (f"the request queue has room for {max(room, 0)} more generation(s); this request "
                           f"needs {len(generations)} (n); retry later")
            raise QueueFullError(message, retry_after=self.retry_after())
        jobs: list[Job] = []
        try:
            for request, generation in zip(requests, generations):
                jobs.append(self._enqueue(request, generation))
        except BaseException:
            for job in jobs:
                self._abandon(job)
                job.receiver.close()
            raise
        return [GenerationHandle(self, job) for job in jobs]

    def open_embeddings(self, request: EmbeddingRequest) -> EmbeddingHandle:
        """Queue the embedding of a batch of texts as one job; ``await handle.result()`` gives the vectors.

        Admitted here, as generations are: the engine's state, each input against the context cap and the
        KV budget, and the queue's room. Leaving ``async with handle`` before the result abandons the job.

        Raises:
            EngineUnavailableError: the engine is not running.
            ContextLengthError: an input is longer than the context cap or than the KV budget holds.
            QueueFullError: the queue is full (HTTP 429 with ``retry_after``).
        """
        if self.status != "ok":
            self.metrics.rejected.inc(reason="unavailable")
            raise EngineUnavailableError(f"the engine is not serving (status: {self.status})", retry_after=5)
        longest = max(len(ids) for ids in request.inputs)
        for i, ids in enumerate(request.inputs):
            if len(ids) > self.model.context_length:
                raise ContextLengthError(f"'{request.param}' item {i} is {len(ids)} tokens, more than the "
                                         f"{self.model.context_name} of {self.model.context_length} tokens",
                                         param=request.param)
        reserved = self.kv.reservation_tokens(longest)
        if reserved * self.kv.token_bytes > self.kv.budget_bytes:
            raise ContextLengthError(f"'{request.param}' holds a text of {longest} tokens, more than the KV cache "
                                     f"budget's {self.kv.budget_tokens} tokens", param=request.param)
        if self._live_queued >= self.limits.max_queued:
            self.metrics.rejected.inc(reason="queue_full")
            raise QueueFullError(f"the request queue is full ({self.limits.max_queued} waiting); retry later",
                                 retry_after=self.retry_after())
        job = new_job(self.model, request.inputs, self.limits.prefill_chunk,
                      lambda tokens: self.model.new_cache(self.kv.dtype, max_tokens=reserved),
                      reserved * self.kv.token_bytes, trio.current_time())
        try:
            self._queue_send.send_nowait(job)
        except trio.WouldBlock:
            self.metrics.rejected.inc(reason="queue_full")
            raise QueueFullError("the request queue is full; retry later", retry_after=self.retry_after()) from None
        self._live_queued += 1
        self.metrics.accepted.inc()
        return EmbeddingHandle(self, job)

    def ended_error(self) -> KestrelError | None:
        """A fresh copy of the error :meth:`end_generations` ended every stream with, or None."""
        return None if self._ended is None else copy.copy(self._ended)

    def unavailable(self, message: str) -> EngineUnavailableError:
        """The error a consumer whose job ended without a result raises."""
        return EngineUnavailableError(f"{message} (engine status: {self.status})", retry_after=5)

    def _end_embedding(self, job: EmbeddingJob, outcome: object) -> None:
        """Deliver ``job``'s one result (or nothing, ``outcome`` None, to a consumer that left); it leaves the
        queue's count if it was still queued, and its KV is dropped."""
        if job.admitted_at is None and not (job.done or job.abandoned):
            self._live_queued -= 1
        job.finish(outcome)
        job.run.release()

    def _abandon_embedding(self, job: EmbeddingJob) -> None:
        if job.done or job.abandoned:
            return
        job.abandoned = True
        if job.admitted_at is None:
            self._live_queued -= 1
        self.metrics.cancelled.inc(phase="queued" if job.admitted_at is None else "prefill")

    def end_generations(self, error: KestrelError) -> None:
        """End every generation's stream with ``error`` now, and every later one's at its first read.

        Each handle raises ``error`` at its next read (deltas it has not read
        yet are not delivered); its consumer then closes it, which abandons the
        generation as usual, so no step runs for it after the one in flight.
        The engine itself keeps running (a shutting-down server still answers
        until its listener closes).
        """
        self._ended = error
        self._drain_queue_quietly()
        for embedding in [*self._embed_waiting, *([self._embedding] if self._embedding else [])]:
            self._end_embedding(embedding, error)
        for job in [*self._waiting, *self._active]:
            if not job.done and not job.abandoned:
                try:
                    job.results.send_nowait(error)  # wakes a reader waiting on an empty channel
                except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    def _enqueue(self, request: GenerationRequest, generation: Generation) -> Job:
        send, recv = trio.open_memory_channel[object](generation.params.max_tokens + 2)
        kv_bytes = generation.cache.max_tokens * self.kv.token_bytes + self.speculation.kv_bytes(generation.speculation)
        job = Job(generation=generation, results=send, receiver=recv, enqueued_at=trio.current_time(),
                  kv_bytes=kv_bytes)
        try:
            self._queue_send.send_nowait(job)
        except trio.WouldBlock:
            send.close()
            recv.close()
            self.metrics.rejected.inc(reason="queue_full")
            raise QueueFullError("the request queue is full; retry later", retry_after=self.retry_after()) from None
        self._live_queued += 1
        self.metrics.accepted.inc()
        if request.constraint is not None:
            self.metrics.structured.inc(kind=request.constraint.kind)
        return job

    def _new_generation(self, request: GenerationRequest) -> Generation:
        model = self.model
        if request.images:
            model.require_vision(request.prompt_param)
        prompt_tokens = len(request.prompt_ids)
        max_tokens = check_context(prompt_tokens, request.params.max_tokens, model.context_length,
                                   param=request.prompt_param, max_tokens_param=request.max_tokens_param,
                                   context_name=model.context_name)
        max_tokens = self.kv.max_tokens_for(prompt_tokens, max_tokens, requested=request.params.max_tokens is not None,
                                            param=request.prompt_param, max_tokens_param=request.max_tokens_param)
        params = attrs.evolve(request.params, max_tokens=max_tokens)
        tokenizer = model.require_tokenizer()
        reserved = self.kv.reservation_tokens(prompt_tokens + max_tokens)
        speculation = self.speculation.state_for(request, reserved, self.kv.budget_bytes - reserved * self.kv.token_bytes)
        return Generation(
            list(request.prompt_ids),
            params,
            tokenizer=tokenizer,
            eos_token_ids=tokenizer.eos_token_ids,
            cache=model.new_cache(self.kv.dtype, max_tokens=reserved),
            vocab_size=model.config.vocab_size,
            prefill_chunk=self.limits.prefill_chunk,
            images=request.images,
            constraint=request.constraint,
            contain_memory_errors=True,  # step_contained rolls back and retries
            speculation=speculation,
            reasoning_budget=request.reasoning_budget,
        )

    def _abandon(self, job: Job) -> None:
        if job.done or job.abandoned:
            return
        job.abandoned = True
        if job.admitted_at is None:
            self._live_queued -= 1
        self.metrics.cancelled.inc(phase=job.phase)


class GenerationHandle:
    """The consumer's end of one queued generation: an async iterator of :class:`Delta`.

    Closing it (``aclose``, leaving ``async with``, or ``cancel``) before the
    last delta abandons the generation.
    """

    def __init__(self, engine: Admission, job: Job) -> None:
        self._engine = engine
        self._job = job

    @property
    def finished(self) -> bool:
        return self._job.done

    def __aiter__(self) -> "GenerationHandle":
        return self

    async def __anext__(self) -> Delta:
        if self._engine._ended is not None:
            raise copy.copy(self._engine._ended)  # one instance per raise: tracebacks are not shared
        try:
            item = await self._job.receiver.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        """Abandon the generation (no-op once it finished)."""
        self._engine._abandon(self._job)
        self._job.receiver.close()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> "GenerationHandle":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()
