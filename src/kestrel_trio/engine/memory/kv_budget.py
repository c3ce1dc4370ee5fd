"""The KV budget: one bound on every live KV byte, and what each generation reserves of it.

Theory of operation (the policy; docs/operations.md says what a client sees):

* Every byte of KV held by the engine counts against one budget: the caches
  of the generations in the batch, and the prefix cache's entries (the
  prefix cache sits *inside* the budget; ``prefix_cache_bytes`` only caps
  its share). An entry a running generation still writes to is that
  generation's memory, not the prefix cache's.
* A generation reserves its worst case when it is admitted to the batch:
  prompt + max_tokens tokens, rounded up to whole blocks of
  :data:`~kestrel_trio.model.BLOCK_TOKENS`. Its cache grows with
  its tokens (in blocks) and can never grow past that, so no admitted
  generation can run out of KV and the real bytes never exceed the
  reserved ones. Without max_tokens, a request gets as many tokens as the
  context cap and the budget both allow (and reserves them all).
* A request whose reservation exceeds the whole budget can never run: it is
  refused at once (400 ``context_length_exceeded``, naming the budget and
  the numbers), before any compute. One that fits the budget but not the
  room left waits in the queue, first come first served (the queue bound
  and its immediate 429 still hold). Room is made first by evicting idle
  prefix-cache entries, least recently used first; if that is not enough,
  the request waits for running generations to end.
* The default budget is derived once, after the weights are loaded, and is
  the smaller of two figures. What the engine can ever use: ``max_batch``
  sequences at the context cap plus the prefix cache's share (more is never
  touched, so never worth promising). And a modest share of the memory the
  process may still take (:mod:`.host_memory`): the smallest of
  MemAvailable, the cgroup's room and the address-space room, less the
  weights still mapped from the checkpoint, less a headroom and the step
  temporaries at the context cap, times :data:`BUDGET_SHARE`. A board is
  shared with other programs, and MemAvailable at start says nothing about
  what they take later.
"""

from __future__ import annotations

import attrs

from kestrel_trio.engine.memory.host_memory import HostMemory, read_host_memory
from kestrel_trio.engine.types import EngineLimits
from kestrel_trio.errors import ContextLengthError, KestrelError
from kestrel_trio.model import BLOCK_TOKENS, Model, ModelConfig

__all__ = ["KVBudget", "budget_for", "derive_budget_bytes", "step_temporaries_bytes", "most_kv_bytes",
           "HEADROOM_BYTES", "BUDGET_SHARE"]

HEADROOM_BYTES = 256 * 2**20  # the interpreter, tokenizer, HTTP buffers and allocator slack beside the KV
BUDGET_SHARE = 0.5  # of the memory left after the headroom: the board is shared, the kernel's figure a guess
MIN_BUDGET_BYTES = 16 * 2**20  # below this a derived budget is refused: the machine has no memory to spare


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


@attrs.frozen
class KVBudget:
    """One engine's KV budget.

    Attributes:
        budget_bytes: every live KV byte together stays within this.
        token_bytes: one token's keys and values in every layer, in the cache's dtype.
        dtype: the caches' storage ("fp32", "bf16", "fp16").
        source: how the budget was set, for the log and /health.
        block_tokens: reservations are whole blocks of this many tokens.
    """

    budget_bytes: int
    token_bytes: int
    dtype: str
    source: str = "set"
    block_tokens: int = BLOCK_TOKENS

    @property
    def budget_tokens(self) -> int:
        """The longest sequence one generation may reserve: the budget in whole blocks (tokens)."""
        return self.budget_bytes // (self.token_bytes * self.block_tokens) * self.block_tokens

    def reservation_tokens(self, tokens: int) -> int:
        """``tokens`` rounded up to whole blocks."""
        return -(-tokens // self.block_tokens) * self.block_tokens

    def reservation_bytes(self, tokens: int) -> int:
        """Bytes reserved for a sequence of ``tokens`` (in whole blocks)."""
        return self.reservation_tokens(tokens) * self.token_bytes

    def max_tokens_for(self, prompt_tokens: int, max_tokens: int, *, requested: bool, param: str,
                       max_tokens_param: str = "max_tokens") -> int:
        """The max_tokens a request may have under the budget, or ContextLengthError naming the budget.

        Args:
            prompt_tokens: tokens in the prompt.
            max_tokens: the max_tokens that fits the context cap (requested, or the context's room).
            requested: whether the client set max_tokens (else it shrinks to what the budget holds).
            param: the request field that carried the prompt.
            max_tokens_param: the request field that carried max_tokens.
        """
        limit = self.budget_tokens
        if prompt_tokens >= limit:
            raise ContextLengthError(
                f"The prompt is {prompt_tokens} tokens, but this server's KV cache budget holds {limit} tokens "
                f"({self.describe()}), and at least one token must remain for the answer", param=param)
        if prompt_tokens + max_tokens > limit:
            if not requested:
                return limit - prompt_tokens
            need = prompt_tokens + max_tokens
            raise ContextLengthError(
                f"The prompt ({prompt_tokens} tokens) plus {max_tokens_param} ({max_tokens}) needs {need} tokens "
                f"of KV cache ({_mib(self.reservation_bytes(need))} in {self.block_tokens}-token blocks), but this "
                f"server's KV cache budget holds {limit} tokens ({self.describe()})", param=max_tokens_param)
        return max_tokens

    def describe(self) -> str:
        """``512.0 MiB of fp32 KV at 112 KiB a token`` and how the budget was set."""
        return (f"{_mib(self.budget_bytes)} of {self.dtype} KV at {self.token_bytes / 1024:g} KiB a token, "
                f"{self.source}")


def budget_for(model: Model, limits: EngineLimits, *, draft_token_bytes: int = 0) -> KVBudget:
    """The KV budget ``limits`` set for ``model`` (as served), or the one derived from the memory available now.

    ``draft_token_bytes``: a draft model's KV a token (speculative decoding), reserved beside each sequence's.

    Raises:
        KestrelError: no budget could be derived (see :func:`derive_budget_bytes`).
    """
    token_bytes = model.kv_token_bytes(limits.kv_dtype)
    if limits.kv_cache_bytes is not None:
        return KVBudget(limits.kv_cache_bytes, token_bytes, limits.kv_dtype, source="set (kv_cache_bytes)")
    step_bytes = step_temporaries_bytes(model.config, prefill_chunk=limits.prefill_chunk, max_batch=limits.max_batch,
                                        max_model_len=model.context_length)
    most = most_kv_bytes(token_bytes + draft_token_bytes, max_batch=limits.max_batch,
                         max_model_len=model.context_length, prefix_cache_bytes=limits.prefix_cache_bytes)
    budget, how = derive_budget_bytes(read_host_memory(), mapped_weight_bytes=model.mapped_weight_bytes(),
                                      step_bytes=step_bytes, most_bytes=most)
    return KVBudget(budget, token_bytes, limits.kv_dtype, source=how)


def most_kv_bytes(token_bytes: int, *, max_batch: int, max_model_len: int, prefix_cache_bytes: int,
                  block_tokens: int = BLOCK_TOKENS) -> int:
    """The most KV an engine can ever hold (bytes): ``max_batch`` reservations at the context cap, and the prefix cache.

    Args:
        token_bytes: one token's keys and values in every layer.
        max_batch: generations in the batch at once.
        max_model_len: the context cap (tokens; a reservation is at most this, in whole blocks).
        prefix_cache_bytes: the prefix cache's cap.
    """
    sequence = -(-max_model_len // block_tokens) * block_tokens * token_bytes
    return max_batch * sequence + prefix_cache_bytes


def step_temporaries_bytes(config: ModelConfig, *, prefill_chunk: int, max_batch: int, max_model_len: int) -> int:
    """A generous estimate of the arrays one model step allocates beside the KV (bytes).

    The largest are a prefill chunk's attention scores against the whole
    context (heads x chunk x context, float32, one sequence at a time) and
    its causal mask; then the activations of max_batch chunks at once and
    their logits.
    """
    scores = config.num_attention_heads * prefill_chunk * max_model_len * 4
    mask = prefill_chunk * max_model_len * 5  # float32 0/-inf plus the boolean it is made from
    inter = max(config.intermediate_size, config.moe_intermediate_size * max(1, config.num_experts_per_tok))
    projections = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    row = 4 * config.hidden_size + projections + 3 * inter  # float32 values a row holds at once, at most
    activations = max_batch * prefill_chunk * row * 4
    logits = 2 * max_batch * config.vocab_size * 4
    return scores + mask + activations + logits


def derive_budget_bytes(host: HostMemory, *, mapped_weight_bytes: int, step_bytes: int,
                        most_bytes: int | None = None) -> tuple[int, str]:
    """The default KV budget (bytes) and a line saying how it was reached.

    Args:
        host: the memory this process may still take, read after the weights were loaded.
        mapped_weight_bytes: weights still mapped from the checkpoint file (counted as
            available by the kernel, but read at every step).
        step_bytes: temporaries of one model step (:func:`step_temporaries_bytes`).
        most_bytes: the most KV the engine can ever hold (:func:`most_kv_bytes`); the budget
            never exceeds it (None: no such cap).

    Raises:
        KestrelError: no memory figure could be read, or too little is left; set the budget explicitly.
    """
    rooms = []
    if host.mem_available is not None:
        rooms.append(host.mem_available - mapped_weight_bytes)
    if host.cgroup_room is not None:
        rooms.append(host.cgroup_room - mapped_weight_bytes)
    if host.address_space_room is not None:
        rooms.append(host.address_space_room)  # VmSize already counts the whole mapping
    if not rooms:
        raise KestrelError("cannot read how much memory is available (/proc/meminfo); set the KV cache budget "
                           "explicitly (--kv-cache-mb / EngineLimits.kv_cache_bytes)")
    room = min(rooms)
    budget = int((room - HEADROOM_BYTES - step_bytes) * BUDGET_SHARE)
    how = (f"derived at start: {host.describe()}, less {_mib(mapped_weight_bytes)} of mapped weights, "
           f"{_mib(HEADROOM_BYTES)} headroom and {_mib(step_bytes)} of step temporaries, x {BUDGET_SHARE:g}")
    if budget < MIN_BUDGET_BYTES:
        raise KestrelError(f"too little memory is left for a KV cache ({_mib(max(budget, 0))}; {how}); free some "
                           "memory, lower the context cap (--max-model-len) or set --kv-cache-mb explicitly")
    if most_bytes is not None and most_bytes < budget:
        return most_bytes, (f"{how} = {_mib(budget)}, capped at {_mib(most_bytes)}: what --max-batch sequences at "
                            "the context cap and the prefix cache can hold")
    return budget, how
