"""What the engine reports while it runs: queue and batch counters, the KV budget's state, a refusal's wait.

Read by /health and by admission's 429s; none of it ever waits on the worker thread (a step may be running).
A part of :class:`~kestrel_trio.engine.engine.Engine`, which holds the state read here.
"""

from __future__ import annotations

import math

import trio

from kestrel_trio.engine.memory.kv_budget import KVBudget
from kestrel_trio.engine.speculation import Speculation
from kestrel_trio.engine.types import EngineLimits, KVUsage
from kestrel_trio.model import Model, PrefixCache

__all__ = ["EngineHealth"]


class EngineHealth:
    """The engine's counters read by /health (never wait on the worker thread).

    Mixed into :class:`~kestrel_trio.engine.engine.Engine`, whose ``__init__`` sets the state below.
    """

    model: Model
    limits: EngineLimits
    kv: KVBudget
    kv_usage: KVUsage
    prefix_cache: PrefixCache
    speculation: Speculation
    step_started_at: float | None
    mean_step_seconds: float | None
    mean_service_seconds: float | None
    batch_in_flight: int
    _live_queued: int
    _active: list

    @property
    def queued(self) -> int:
        """Accepted generations not yet admitted to the batch (abandoned ones excluded)."""
        return self._live_queued

    @property
    def active(self) -> int:
        """Generations in the active batch."""
        return len(self._active)

    @property
    def busy(self) -> bool:
        """Whether a model step is running in the worker thread now."""
        return self.step_started_at is not None

    def stalled(self) -> bool:
        """Whether the step in flight has run far past its usual time (limits.stall_*)."""
        if self.step_started_at is None:
            return False
        usual = self.mean_step_seconds or 0.0
        allowed = max(self.limits.stall_floor, self.limits.stall_factor * usual)
        return trio.current_time() - self.step_started_at > allowed

    def report(self) -> dict:
        """The scheduler's counters and bounds, the context cap and the KV budget's state, as /health shows them
        (never waits on the worker thread)."""
        return {"busy": self.busy, "queued": self.queued, "active": self.active, "batch": self.batch_in_flight,
                "max_queued": self.limits.max_queued, "max_batch": self.limits.max_batch, **self.memory_report(),
                "speculative": self.speculation.report()}

    def memory_report(self) -> dict:
        """The context cap and the KV budget's state, for /health (counters only: never waits on a step)."""
        usage, kv = self.kv_usage, self.kv
        return {"max_model_len": self.model.context_length,
                "kv_cache": {"dtype": kv.dtype, "budget_bytes": kv.budget_bytes, "budget_tokens": kv.budget_tokens,
                             "token_bytes": kv.token_bytes, "reserved_bytes": usage.reserved_bytes,
                             "used_bytes": usage.used_bytes, "prefix_cache_bytes": usage.prefix_bytes,
                             "prefix_cache_budget_bytes": self.prefix_cache.budget_bytes,
                             "waiting_for_kv": usage.waiting_for_kv, "budget_from": kv.source}}

    def retry_after(self) -> int:
        """Seconds a refused client should wait, from observed service time (1 to 60)."""
        service = self.mean_service_seconds or 1.0
        ahead = self._live_queued + len(self._active)
        return int(min(60, max(1, math.ceil(service * ahead / self.limits.max_batch))))
