"""Sampling: the choice of the next token from a row of logits.

- :mod:`.params`: :class:`SamplingParams` (one request's sampling and stopping options, validated) and
  :class:`SamplingDefaults` (the server's defaults a request's own fields override).
- :mod:`.sampler`: :class:`Sampler`, the seeded draw in vLLM's and transformers' order (bias, penalties,
  grammar mask, temperature, top-k, top-p, min-p), and the logprobs it reports.

The three classes are re-exported here: ``kestrel_trio.text.sampling.SamplingDefaults`` and its siblings were
one module's names before this room, and the package root imports them from this path.
"""

from kestrel_trio.text.sampling.params import SamplingDefaults, SamplingParams
from kestrel_trio.text.sampling.sampler import Sampler

__all__ = ["SamplingParams", "SamplingDefaults", "Sampler"]
