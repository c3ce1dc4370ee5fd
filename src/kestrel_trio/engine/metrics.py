"""The engine's Prometheus metrics, named like vLLM's with a ``kestrel:`` prefix."""

from __future__ import annotations

from typing import Callable, Iterable

from kestrel_trio.stats import Counter, Gauge, Histogram, render_prometheus

__all__ = ["EngineMetrics"]

_MASK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class EngineMetrics:
    """Counters and histograms updated by the engine on the trio side.

    Args:
        running: returns the number of generations in the active set.
        waiting: returns the number of live queued generations.
        prefix_cache: the engine's PrefixCache, whose counters are exported.
        kv_usage: returns the engine's KVUsage (bytes budgeted, reserved, used; waits).
    """

    def __init__(self, running: Callable[[], float], waiting: Callable[[], float], prefix_cache=None,
                 kv_usage: Callable[[], object] | None = None) -> None:
        self.running = Gauge("kestrel:num_requests_running", "Generations in the active batch.", function=running)
        self.waiting = Gauge("kestrel:num_requests_waiting", "Generations waiting in the queue.", function=waiting)
        self.prompt_tokens = Counter("kestrel:prompt_tokens_total", "Prompt tokens processed.")
        self.generation_tokens = Counter("kestrel:generation_tokens_total", "Tokens generated.")
        self.steps = Counter("kestrel:model_steps_total", "Batched model steps run in the worker thread.")
        self.finished = Counter("kestrel:request_success_total", "Generations finished.", ["finished_reason"])
        self.accepted = Counter("kestrel:request_accepted_total", "Generations accepted into the queue.")
        self.rejected = Counter("kestrel:request_rejected_total", "Requests refused before queuing.", ["reason"])
        self.cancelled = Counter("kestrel:request_cancelled_total", "Generations whose client left.", ["phase"])
        self.failed = Counter("kestrel:request_failed_total", "Generations ended by an engine error.")
        self.ttft = Histogram(
            "kestrel:time_to_first_token_seconds", "Time from queuing to the first generated token.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0),
        )
        self.itl = Histogram(
            "kestrel:inter_token_latency_seconds", "Time between consecutive generated tokens.",
            buckets=_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = Histogram("kestrel:e2e_request_latency_seconds", "Time from queuing to the last token.")
        self.queue_time = Histogram("kestrel:request_queue_time_seconds", "Time spent queued before the first step.")
        if prefix_cache is not None:
            self.prefix_hits = Gauge("kestrel:prefix_cache_hits", "Prompts that reused cached KV (since start).",
                                     function=lambda: prefix_cache.hits)
            self.prefix_queries = Gauge("kestrel:prefix_cache_queries",
                                        "Prompts looked up in the prefix cache (since start).",
                                        function=lambda: prefix_cache.hits + prefix_cache.misses)
            self.prefix_tokens = Gauge("kestrel:prefix_cache_reused_tokens",
                                       "Prompt tokens restored instead of computed (since start).",
                                       function=lambda: prefix_cache.reused_tokens)
            self.prefix_entries = Gauge("kestrel:prefix_cache_entries", "Prompts whose KV is kept for reuse.",
                                        function=lambda: len(prefix_cache))
        self.kv_waits = Counter("kestrel:kv_cache_waits_total",
                                "Generations that waited in the queue for KV room (counted once each).")
        self.out_of_memory = Counter("kestrel:request_out_of_memory_total",
                                     "Generations ended because a model step could not get their memory.")
        if kv_usage is not None:
            self.kv_budget = Gauge("kestrel:kv_cache_budget_bytes", "The KV cache budget.",
                                   function=lambda: kv_usage().budget_bytes)
            self.kv_reserved = Gauge("kestrel:kv_cache_reserved_bytes",
                                     "KV reserved by the generations in the batch (prompt + max_tokens each).",
                                     function=lambda: kv_usage().reserved_bytes)
            self.kv_used = Gauge("kestrel:kv_cache_used_bytes",
                                 "KV really held: the batch's caches and the prefix cache's idle entries.",
                                 function=lambda: kv_usage().used_bytes)
            self.kv_prefix = Gauge("kestrel:kv_cache_prefix_bytes", "KV held by idle prefix-cache entries.",
                                   function=lambda: kv_usage().prefix_bytes)
            self.kv_waiting = Gauge("kestrel:num_requests_waiting_for_kv",
                                    "Queued generations the batch has room for but the KV budget has not.",
                                    function=lambda: kv_usage().waiting_for_kv)
        self.step_time = Histogram("kestrel:model_step_seconds", "Duration of one batched model step.",
                                   buckets=_TOKEN_LATENCY_BUCKETS)
        self.structured = Counter("kestrel:structured_output_requests_total",
                                  "Generations accepted under a grammar (structured outputs), by what it came from.",
                                  ["kind"])
        self.mask_time = Histogram("kestrel:grammar_mask_seconds",
                                   "Time computing the token masks of one step (all its constrained sequences at once, "
                                   "beside the forward pass).", buckets=_MASK_BUCKETS)
        self.mask_wait = Counter("kestrel:grammar_mask_wait_seconds_total",
                                 "Time steps waited for token masks after their forward pass was done.")
        self.spec_drafts = Counter("kestrel:spec_decode_num_drafts_total",
                                   "Speculative verify steps (a draft scored in one forward pass).")
        self.spec_draft_tokens = Counter("kestrel:spec_decode_num_draft_tokens_total", "Tokens drafted.")
        self.spec_accepted_tokens = Counter("kestrel:spec_decode_num_accepted_tokens_total",
                                            "Drafted tokens accepted (kept as output).")
        self.spec_acceptance = Gauge("kestrel:spec_decode_draft_acceptance_rate",
                                     "Accepted over drafted tokens since start (0 before any draft).",
                                     function=self._acceptance_rate)

    def _acceptance_rate(self) -> float:
        drafted = self.spec_draft_tokens.value()
        return self.spec_accepted_tokens.value() / drafted if drafted else 0.0

    def observe_speculation(self, generations: Iterable) -> None:
        """Count the speculative decoding of the step just run (each generation's ``speculation``, if any)."""
        for g in generations:
            if g.speculation is not None:
                drafted, accepted, steps = g.speculation.take_counts()
                if steps:
                    self.spec_drafts.inc(steps)
                    self.spec_draft_tokens.inc(drafted)
                    self.spec_accepted_tokens.inc(accepted)

    def observe_masks(self, generations: Iterable) -> None:
        """Count the grammar mask work of the step just run (each generation's ``constraint``, if any)."""
        timings = [t for g in generations if g.constraint is not None and (t := g.constraint.take_timing())]
        if timings:
            self.mask_time.observe(max(seconds for seconds, _ in timings))  # one batch: the same wall time for all
            self.mask_wait.inc(sum(wait for _, wait in timings))

    def all(self) -> list:
        return [v for v in vars(self).values() if hasattr(v, "samples")]

    def render(self) -> str:
        """Prometheus text exposition of every engine metric."""
        return render_prometheus(self.all())
