"""The engine: a bounded queue of generation requests feeding one inference task.

Theory of operation:

* ``open_generations`` is the one place a generation is admitted: it checks
  the engine's state (503), the images against the model (400), each prompt
  plus max_tokens against the context (400) and the queue's room for all of
  a request's generations (429, with a Retry-After derived from observed
  service times), then turns each request into a :class:`Job` and puts it on
  a bounded trio memory channel with ``send_nowait``; all of them or none.
  The HTTP handler never blocks on a full queue.
* The inference task (:meth:`Engine.run`) is the only owner of the model.
  Between steps, in trio, it moves newly queued jobs into its waiting line,
  discards jobs whose consumer has left, admits waiting jobs into the active
  set (up to ``max_batch``) and then runs ONE step for every active job in a
  worker thread (``trio.to_thread.run_sync``): a prefill chunk or one decode
  token each, batched into one forward pass (:mod:`kestrel_trio.engine.step.batch`,
  synchronous code that never touches trio).
* Prompts share work through a prefix cache (KV of earlier prompts and
  answers, LRU within a byte budget), consulted in the worker thread at a
  job's first step. A waiting job whose prompt starts with the prompt of a job
  still in prefill waits for that prefill to end, then reuses it (this is how
  n > 1 choices and identical concurrent requests share one prefill).
  Prompts with images take no part in either: equal ``<|image_pad|>`` ids
  may stand for different images, so a reuse would be silently wrong.
* A prompt's images (Qwen3-VL) are encoded by the vision tower over the
  job's first steps, one vision block per step, in the same worker thread as
  every other step: other streams keep flowing, and a client that leaves
  stops the encoding between two blocks.
* After the step it delivers each job's result on the job's own channel, whose
  capacity (max_tokens + 2) is larger than the number of results a job can
  ever produce, so delivery never blocks the inference task on a slow reader.
* A consumer that leaves (the context manager exits, e.g. because its client
  disconnected) marks the job abandoned. A queued job is then dropped without
  any compute; an active one is dropped right after the step in flight, so an
  abandoned generation runs at most one more step.
* Every accepted job ends with exactly one terminal item: a delta carrying a
  finish_reason, or an error. When the engine stops, waiting and active jobs
  get :class:`EngineUnavailableError`. ``end_generations(error)`` (a server's
  shutdown, once its grace is over) ends every stream at once: each handle
  raises ``error`` at its next read, and its consumer's close abandons the job.
* Memory is planned (:mod:`kestrel_trio.engine.memory.kv_budget`): ``open_generations``
  refuses (400) a request whose worst-case KV (prompt + max_tokens, in whole
  blocks) exceeds the whole KV budget, or whose length exceeds the context
  cap (``max_model_len``). Admission reserves that worst case; a waiting job
  that does not fit the room left (after evicting idle prefix-cache entries)
  stays queued, first come first served, until running generations end. Its
  cache grows with its tokens but never past the reservation, so the real KV
  bytes never exceed the budget. A MemoryError inside a step fails only the
  generations that needed the memory (:mod:`kestrel_trio.engine.step.contained`).
* When the batch empties and nothing waits, the engine tidies memory once in
  its worker thread (:meth:`Engine._tidy_memory`): idle prefix-cache entries
  are shrunk to their tokens, and the C heap's free pages go back to the
  kernel, so an idle server does not keep the high-water mark of its last
  long generations.
* An embedding request (:mod:`kestrel_trio.engine.embeddings`) is one job on the same queue, counted
  against the same bound; once admitted (one at a time, within the KV budget) it runs one prefill chunk
  per loop turn beside the generations' step, and is dropped between two chunks when abandoned.
* Speculative decoding (``limits.speculative``; :mod:`kestrel_trio.engine.speculation`)
  runs inside a step whose batch is one generation: that step may produce
  several tokens, each delivered as its own delta, exactly as plain steps
  would have delivered them.
"""

from __future__ import annotations

import collections
import logging

import trio

from kestrel_trio.engine.admission import Admission, GenerationHandle, Job
from kestrel_trio.engine.embeddings import EmbeddingJob, Embeddings
from kestrel_trio.engine.health import EngineHealth
from kestrel_trio.engine.memory.host_memory import release_free_memory
from kestrel_trio.engine.memory.kv_budget import budget_for
from kestrel_trio.engine.metrics import EngineMetrics
from kestrel_trio.engine.speculation import Speculation
from kestrel_trio.engine.step.batch import step_generations
from kestrel_trio.engine.step.contained import step_contained
from kestrel_trio.engine.types import Delta, EngineLimits, KVUsage
from kestrel_trio.errors import EngineUnavailableError, KestrelError, OutOfMemoryError
from kestrel_trio.model import Model, PrefixCache
from kestrel_trio.text.generation import Phase
from kestrel_trio.text.step_result import StepResult

__all__ = ["Engine", "GenerationHandle", "Job", "run_engine"]

log = logging.getLogger("kestrel_trio.engine")


class Engine(Admission, EngineHealth):
    """The single inference task and its bounded queue.

    Create with :func:`run_engine` (``await nursery.start(run_engine, model)``).

    Args:
        model: the loaded model; the engine is its only user while running.
        limits: queue size, batch size, prefill chunk, stall detection, context cap, KV budget
            and speculative decoding.
        draft_model: the draft model of ``limits.speculative == "draft"`` (same vocabulary as ``model``).

    Attributes:
        model: the model as served: ``limits.max_model_len`` caps its ``context_length``.
        kv: the KV budget (bytes, dtype, how it was set).
        kv_usage: KV bytes reserved and used and requests waiting for KV, as of the last step.

    Raises:
        KestrelError: ``max_model_len`` exceeds the model's context, no KV budget could be derived,
            or the speculative mode and ``draft_model`` disagree.

    Its client side (``open_generations``, ``open_embeddings``, ``end_generations``: :mod:`.admission`) and its
    counters (``report``, ``retry_after``: :mod:`.health`) are mixed in; this module holds the inference task.
    """

    def __init__(self, model: Model, limits: EngineLimits = EngineLimits(), draft_model: Model | None = None) -> None:
        if limits.max_model_len is not None:
            model = model.with_context_length(limits.max_model_len)
        self.model = model
        self.limits = limits
        self.speculation = Speculation(limits, model, draft_model)
        self.kv = budget_for(model, limits, draft_token_bytes=self.speculation.draft_token_bytes)
        log.info("KV cache budget: %.1f MiB = %d tokens of %s KV (%s); context cap %d tokens",
                 self.kv.budget_bytes / 2**20, self.kv.budget_tokens, self.kv.dtype, self.kv.source,
                 model.context_length)
        if self.kv.budget_tokens < model.context_length:
            log.warning("one sequence at the full context (%d tokens) needs %.1f MiB of KV, more than the budget: "
                        "requests are limited to %d tokens (prompt + max_tokens); --max-model-len or "
                        "--kv-cache-mb changes this", model.context_length,
                        self.kv.reservation_bytes(model.context_length) / 2**20, self.kv.budget_tokens)
        self.kv_usage = KVUsage(budget_bytes=self.kv.budget_bytes)
        self.status = "starting"  # starting -> ok -> stopped | broken
        # The live-job count (_live_queued) is the real bound; the channel has room for twice as many so that
        # jobs abandoned while queued, which leave the channel only at the next step boundary, rarely
        # crowd out a new request.
        self._queue_send, self._queue_recv = trio.open_memory_channel[Job](2 * limits.max_queued)
        self._waiting: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        self._embed_waiting: collections.deque[EmbeddingJob] = collections.deque()
        self._embedding: EmbeddingJob | None = None  # the admitted embedding job, one at a time
        self._live_queued = 0
        self._limiter = trio.CapacityLimiter(1)
        self.step_started_at: float | None = None
        self.mean_step_seconds: float | None = None
        self.mean_service_seconds: float | None = None
        self.max_steps_after_abandon = 0
        self.batch_in_flight = 0
        self.memory_tidied = 0  # times the engine gave memory back on going idle (_tidy_memory)
        self._untidy = False  # a step ran since the last tidy
        self.prefix_cache = PrefixCache(min(limits.prefix_cache_bytes, self.kv.budget_bytes))
        self._ended: KestrelError | None = None  # set by end_generations: every handle raises it
        self.metrics = EngineMetrics(running=lambda: len(self._active), waiting=lambda: self._live_queued,
                                     prefix_cache=self.prefix_cache, kv_usage=lambda: self.kv_usage)

    # ---- the inference task ----

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """The inference task: admit, step, deliver, until cancelled."""
        await trio.to_thread.run_sync(self.model.prepare_products)  # not in the first batched request's time
        self.status = "ok"
        task_status.started(self)
        try:
            while True:
                await self._admit()
                if self._embedding is not None:
                    await self._embed_step()
                if self._active:
                    await self._step()
        except BaseException as exc:
            if not isinstance(exc, (trio.Cancelled, KeyboardInterrupt)):
                log.exception("the inference task died")
                self.status = "broken"
            raise
        finally:
            if self.status == "ok":
                self.status = "stopped"
            self._fail_everything(EngineUnavailableError("the engine stopped before this generation finished"))

    async def _admit(self) -> None:
        self._drain_queue()
        if not self._active and not self._waiting and not self._embed_waiting and self._embedding is None:
            await self._tidy_memory()
            self._take(await self._queue_recv.receive())
            self._drain_queue()
        self._drop_abandoned()
        deferred = []
        blocked = 0
        while self._waiting and len(self._active) < self.limits.max_batch:
            job = self._waiting[0]
            if self._shares_a_running_prefill(job):
                deferred.append(self._waiting.popleft())
                continue
            if not self._make_kv_room(job.kv_bytes):
                blocked = min(self._live_queued, self.limits.max_batch - len(self._active))
                if not job.waited_for_kv:
                    job.waited_for_kv = True
                    self.metrics.kv_waits.inc()
                break  # first come, first served: later requests wait behind it
            self._waiting.popleft()
            job.admitted_at = trio.current_time()
            self._live_queued -= 1
            self.metrics.queue_time.observe(job.admitted_at - job.enqueued_at)
            self._active.append(job)
        self._waiting.extendleft(reversed(deferred))
        if self._embedding is None and self._embed_waiting and self._make_kv_room(self._embed_waiting[0].kv_bytes):
            job = self._embedding = self._embed_waiting.popleft()
            job.admitted_at = trio.current_time()
            self._live_queued -= 1
            self.metrics.queue_time.observe(job.admitted_at - job.enqueued_at)
        self._note_kv_usage(blocked)

    async def _embed_step(self) -> None:
        """One prefill chunk of the admitted embedding job, in the worker thread; its result once done."""
        job = self._embedding
        assert job is not None
        self.step_started_at = trio.current_time()
        outcome: object = None
        try:
            finished = await trio.to_thread.run_sync(self.model.step_embeddings, job.run, limiter=self._limiter)
        except MemoryError:
            outcome = OutOfMemoryError(f"The server ran out of memory while embedding {len(job.run.inputs)} "
                                       "input(s); retry later, or with fewer or shorter inputs")
        except Exception:
            log.exception("an embedding step failed")
            outcome = KestrelError("the model step failed; see the server log")
        else:
            if finished:
                outcome = Embeddings(tuple(job.run.vectors), job.run.tokens)
        finally:
            self.step_started_at = None
            self._untidy = True
        if outcome is not None or job.abandoned:
            if isinstance(outcome, OutOfMemoryError):
                self.metrics.out_of_memory.inc()
            self._end_embedding(job, outcome)
            self._embedding = None
        self._note_kv_usage()

    async def _tidy_memory(self) -> None:
        """Once per idle spell: shrink idle prefix-cache entries and hand the heap's free pages back to the kernel.

        In the worker thread (a copy of the kept tokens and a heap walk: milliseconds, not for the event loop).
        Measured with SmolLM2-135M (docs/operations.md, "Memory after use"): without it an idle server kept
        most of the RSS its longest generations had reached.
        """
        if not self._untidy:
            return
        self._untidy = False
        await trio.to_thread.run_sync(_tidy, self.prefix_cache, limiter=self._limiter)
        self.memory_tidied += 1
        self._note_kv_usage()

    def _make_kv_room(self, need: int) -> bool:
        """Whether ``need`` more bytes fit the KV budget now, evicting idle prefix-cache entries to make them fit."""
        room = self.kv.budget_bytes - self._reserved_bytes()
        if need > room:
            return False
        self.prefix_cache.evict_idle(room - need)
        if self.prefix_cache.idle_bytes > room - need:  # cannot happen: idle entries are all evictable
            log.warning("the prefix cache holds KV no running request owns; clearing it")
            self.prefix_cache.clear()
        return True

    def _reserved_bytes(self) -> int:
        """KV bytes reserved by admitted generations and the admitted embedding job."""
        embedding = 0 if self._embedding is None else self._embedding.kv_bytes
        return sum(job.kv_bytes for job in self._active) + embedding

    def _note_kv_usage(self, blocked: int | None = None) -> None:
        """Refresh :attr:`kv_usage` (in trio, while no step runs: the caches are not being written)."""
        prefix = self.prefix_cache.idle_bytes
        self.kv_usage = KVUsage(
            budget_bytes=self.kv.budget_bytes, reserved_bytes=self._reserved_bytes(),
            used_bytes=sum(job.generation.cache.nbytes for job in self._active) + prefix, prefix_bytes=prefix,
            waiting_for_kv=self.kv_usage.waiting_for_kv if blocked is None else blocked)

    def _shares_a_running_prefill(self, job: Job) -> bool:
        """Whether an active job is still prefilling this job's whole prompt but its last token."""
        if not self.prefix_cache.enabled or job.generation.has_images:
            return False
        prompt = job.generation.prompt_ids
        shared = prompt[:-1]
        if len(shared) < self.prefix_cache.min_tokens:
            return False
        return any(
            other.generation.phase is Phase.PREFILL and not other.generation.has_images
            and other.generation.prompt_ids[: len(shared)] == shared
            for other in self._active
        )

    def _drain_queue(self) -> None:
        while True:
            try:
                self._take(self._queue_recv.receive_nowait())
            except trio.WouldBlock:
                return

    def _take(self, job: Job | EmbeddingJob) -> None:
        """A job off the queue into its waiting line."""
        (self._embed_waiting if isinstance(job, EmbeddingJob) else self._waiting).append(job)

    def _drop_abandoned(self) -> None:
        # Abandoned jobs were counted at abandon time; here they just leave, with no compute.
        self._waiting = collections.deque(j for j in self._waiting if not j.abandoned)
        self._embed_waiting = collections.deque(j for j in self._embed_waiting if not (j.abandoned or j.done))
        if self._embedding is not None and (self._embedding.abandoned or self._embedding.done):  # left, or ended
            self._end_embedding(self._embedding, None)
            self._embedding = None
        for job in self._active:
            if job.abandoned:
                self._retire(job)  # no step runs now: the worker is idle
        self._active = [j for j in self._active if not j.abandoned]

    def _retire(self, job: Job) -> None:
        """``job`` leaves the batch: its cache is no longer its memory (the prefix cache may keep it, idle)."""
        self.prefix_cache.release(job.generation.cache)
        job.generation.drop_cache()

    async def _step(self) -> None:
        batch = list(self._active)
        generations = [job.generation for job in batch]
        started = self.step_started_at = trio.current_time()
        self.batch_in_flight = len(batch)
        self._untidy = True
        try:
            results = await trio.to_thread.run_sync(
                _contained, self.model, generations, self.prefix_cache, limiter=self._limiter,
            )
        except Exception:
            log.exception("a model step failed; failing its %d generation(s)", len(batch))
            for job in batch:
                self._finish_with_error(job, KestrelError("the model step failed; see the server log"))
            self._active.clear()
            self._note_kv_usage()
            return
        finally:
            self.step_started_at = None
            self.batch_in_flight = 0
        elapsed = trio.current_time() - started
        self.mean_step_seconds = _ewma(self.mean_step_seconds, elapsed)
        self.metrics.steps.inc()
        self.metrics.step_time.observe(elapsed)
        self.metrics.observe_masks(generations)
        self.metrics.observe_speculation(generations)
        for job, result in zip(batch, results):
            if isinstance(result, KestrelError):
                if isinstance(result, OutOfMemoryError):
                    self.metrics.out_of_memory.inc()
                self._finish_with_error(job, result)
            else:
                self._deliver(job, result)
        for job in self._active:
            if job.done:
                self._retire(job)
        self._active = [job for job in self._active if not job.done]
        self._note_kv_usage()

    def _deliver(self, job: Job, step: StepResult) -> None:
        job.steps += 1
        if job.abandoned:
            job.steps_after_abandon += 1
            self.max_steps_after_abandon = max(self.max_steps_after_abandon, job.steps_after_abandon)
            return
        tokens = step.tokens()  # one, or several after a speculative step
        for index, result in enumerate(tokens):
            self._deliver_token(job, result, job.generation.completion_tokens - len(tokens) + index + 1)

    def _deliver_token(self, job: Job, result: StepResult, completion_tokens: int) -> None:
        """Send one token's delta (``completion_tokens``: generated up to and including it)."""
        generation = job.generation
        now = trio.current_time()
        if generation.phase is Phase.DECODE or result.finish_reason is not None:
            if completion_tokens == 1:
                self.metrics.prompt_tokens.inc(generation.prompt_tokens)
                self.metrics.ttft.observe(now - job.enqueued_at)
            elif job.last_token_at is not None:
                self.metrics.itl.observe(now - job.last_token_at)
        if result.token_id is None:
            return
        job.last_token_at = now
        self.metrics.generation_tokens.inc()
        delta = Delta(
            text=result.text,
            token_id=result.token_id,
            finish_reason=result.finish_reason,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=generation.cached_tokens,
            logprobs=result.logprobs,
            stop_sequence=result.stop_sequence,
        )
        job.results.send_nowait(delta)  # never blocks: capacity exceeds the job's possible results
        if result.finish_reason is not None:
            job.done = True
            job.results.close()
            self.metrics.finished.inc(finished_reason=result.finish_reason)
            self.metrics.e2e.observe(now - job.enqueued_at)
            self.mean_service_seconds = _ewma(self.mean_service_seconds, now - (job.admitted_at or job.enqueued_at))

    def _finish_with_error(self, job: Job, error: KestrelError) -> None:
        if job.done:
            return
        job.done = True
        self._retire(job)
        if not job.abandoned:
            self.metrics.failed.inc()
            try:
                job.results.send_nowait(error)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        job.results.close()

    def _fail_everything(self, error: KestrelError) -> None:
        self._drain_queue_quietly()
        for embedding in [*self._embed_waiting, *([self._embedding] if self._embedding else [])]:
            self._end_embedding(embedding, error)
        self._embed_waiting.clear()
        self._embedding = None
        for job in [*self._waiting, *self._active]:
            self._finish_with_error(job, error)
        self._waiting.clear()
        self._active.clear()
        self._live_queued = 0
        self._queue_send.close()
        self._queue_recv.close()

    def _drain_queue_quietly(self) -> None:
        try:
            self._drain_queue()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            pass


def _contained(model, generations, prefix_cache) -> list:
    """The engine's step (the module's ``step_generations``, so a test may wrap it), MemoryErrors contained."""
    return step_contained(step_generations, model, generations, prefix_cache)


def _tidy(prefix_cache: PrefixCache) -> None:
    prefix_cache.shrink_idle()
    release_free_memory()


def _ewma(previous: float | None, sample: float, weight: float = 0.2) -> float:
    return sample if previous is None else (1 - weight) * previous + weight * sample


async def run_engine(
    model: Model, *, limits: EngineLimits = EngineLimits(), draft_model: Model | None = None,
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the inference task for ``model`` until cancelled.

    Use as ``engine = await nursery.start(run_engine, model)``: ``started``
    hands back the :class:`Engine` once it accepts requests.

    Args:
        model: a loaded model.
        limits: queue and batch sizes, prefill chunk, stall detection, speculative decoding.
        draft_model: the draft model when ``limits.speculative`` is "draft".
    """
    engine = Engine(model, limits, draft_model)
    await engine.run(task_status=task_status)
