"""The sans-IO text layer: tokens in, text out, and the choice of the next token.

Nothing here does I/O or imports trio; every object is a plain synchronous
state machine or value type that the engine drives.

- :class:`Tokenizer`: the checkpoint's byte-level BPE tokenizer, its EOS ids,
  chat template and generation_config.json sampling defaults.
- :class:`ChatTemplate`: renders chat messages into a prompt exactly as
  transformers' ``apply_chat_template`` does.
- :class:`IncrementalDetokenizer`: token ids to text deltas that never split a
  character.
- :class:`SamplingParams` and :class:`Sampler`: validated sampling options and
  the seeded next-token sampler.
- :class:`StopStringMatcher`: withholds stop strings from streamed text.
- :mod:`kestrel_trio.text.chat_formats`: each model family's markers (reasoning
  blocks, tool calls), the parser of an answer into reasoning, content and
  tool-call pieces, and the prompt edits that open or close reasoning.
"""

from kestrel_trio.text.sampling import SamplingParams, Sampler
from kestrel_trio.text.stops import StopStringMatcher
from kestrel_trio.text.tokens.chat_template import ChatTemplate, missing_template_error
from kestrel_trio.text.tokens.detokenizer import IncrementalDetokenizer
from kestrel_trio.text.tokens.tokenizer import Tokenizer

__all__ = [
    "Tokenizer",
    "ChatTemplate",
    "missing_template_error",
    "IncrementalDetokenizer",
    "SamplingParams",
    "Sampler",
    "StopStringMatcher",
]
