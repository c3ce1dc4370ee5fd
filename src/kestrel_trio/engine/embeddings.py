"""An embedding request as one engine job: queued, admitted and cancelled like a generation.

Theory of operation: ``Engine.open_embeddings`` admits a request's whole batch of inputs as ONE job, through
the same bounded queue as generations (503 while not serving, 400 for an input longer than the context or
than the KV budget, 429 when the queue is full). Once admitted (first come, first served, within the KV
budget: the job reserves KV for its longest input, the only one whose cache lives at a time) the engine runs
one prefill chunk of it per step, beside the generations' step in the same worker thread, so streams keep
flowing while a long batch is embedded. A consumer that leaves (its handle closed) abandons the job: a queued
one never runs, a running one stops after the chunk in flight. The job's one result, the vectors or an error,
arrives on a channel of capacity 1 that the engine never blocks on.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np
import trio

from kestrel_trio.model import EmbeddingRun, Model, normalize

__all__ = ["EmbeddingRequest", "EmbeddingJob", "EmbeddingHandle", "Embeddings"]


@attrs.frozen
class EmbeddingRequest:
    """The token ids of a batch of texts to embed.

    Attributes:
        inputs: each text's token ids (non-empty).
        param: the request field that carried them, for error messages.
    """

    inputs: tuple[tuple[int, ...], ...]
    param: str = "input"


@attrs.frozen
class Embeddings:
    """A finished embedding job.

    Attributes:
        vectors: one float32 [hidden] unit vector per input, in order.
        prompt_tokens: tokens in every input.
    """

    vectors: tuple[np.ndarray, ...]
    prompt_tokens: int

    def as_lists(self, dimensions: int | None = None) -> list[list[float]]:
        """The vectors as lists of floats; with ``dimensions``, each cut to its first ``dimensions`` values and
        renormalized to unit length (Matryoshka truncation, as Qwen3-Embedding is trained for)."""
        if dimensions is None:
            return [vector.tolist() for vector in self.vectors]
        return [normalize(vector[:dimensions]).tolist() for vector in self.vectors]  # each [dimensions]


@attrs.define(eq=False)
class EmbeddingJob:
    """One accepted embedding request, from queue to its one result."""

    run: EmbeddingRun
    results: trio.MemorySendChannel
    receiver: trio.MemoryReceiveChannel
    enqueued_at: float
    kv_bytes: int  # KV reserved once admitted: the longest input's, in whole blocks
    abandoned: bool = False
    done: bool = False
    admitted_at: float | None = None
    waited_for_kv: bool = False

    def finish(self, outcome: object) -> None:
        """Deliver the job's one result (its :class:`Embeddings` or an error) unless its consumer has left."""
        if self.done:
            return
        self.done = True
        if not self.abandoned:
            try:
                self.results.send_nowait(outcome)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self.results.close()


def new_job(model: Model, inputs: Sequence[Sequence[int]], chunk: int, new_cache, kv_bytes: int,
            now: float) -> EmbeddingJob:
    """A queued job for ``inputs`` on ``model`` (the engine's checks already passed)."""
    send, recv = trio.open_memory_channel[object](1)
    return EmbeddingJob(model.embedding_run(inputs, chunk, new_cache), send, recv, now, kv_bytes)


class EmbeddingHandle:
    """The consumer's end of an embedding job: ``await handle.result()``; ``cancel`` abandons it."""

    def __init__(self, engine, job: EmbeddingJob) -> None:
        self._engine = engine
        self._job = job

    async def result(self) -> Embeddings:
        """The vectors, once computed.

        Raises:
            KestrelError: the engine stopped, the server is shutting down, or the step failed.
        """
        ended = self._engine.ended_error()
        if ended is not None:  # the server is shutting down: as a generation's handle, whatever was computed
            raise ended
        try:
            item = await self._job.receiver.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self._engine.unavailable("the embedding job ended without a result") from None
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        """Abandon the job (no-op once it finished)."""
        self._engine._abandon_embedding(self._job)
        self._job.receiver.close()

    async def __aenter__(self) -> "EmbeddingHandle":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()
