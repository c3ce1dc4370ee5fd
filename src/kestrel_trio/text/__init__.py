"""The sans-IO text layer: tokens in, text out, and the choice of the next token.

Nothing here does I/O or imports trio; every object is a plain synchronous
state machine or value type that the engine drives.

Directly in this folder: the generation state machine (:mod:`.generation`), the
value a step returns (:mod:`.step_result`), the context-window check
(:mod:`.context_length`), and what a generation consults each step: stop
strings (:mod:`.stops`), the repetition guard (:mod:`.repetition`) and
speculative decoding (:mod:`.speculative`). The rest lives in rooms, each
named for its concern (their ranks are in tests/test_architecture.py):

- :mod:`.tokens`: the checkpoint's tokenizer (:class:`Tokenizer`, with its EOS
  ids, chat template and generation_config.json sampling defaults), the
  detokenizer (:class:`IncrementalDetokenizer`: token ids to text deltas that
  never split a character) and :class:`ChatTemplate`, which renders chat
  messages into a prompt exactly as transformers' ``apply_chat_template`` does.
- :mod:`.sampling`: :class:`SamplingParams` (validated sampling options) and
  :class:`Sampler` (the seeded next-token sampler).
- :mod:`.constraints`: structured outputs' grammars and token masks, and the
  reasoning budget.
- :mod:`.media`: Qwen3-VL's image and video preprocessing.
- :mod:`.chat_formats`: each model family's markers (reasoning blocks, tool
  calls), the parser of an answer into reasoning, content and tool-call
  pieces, and the prompt edits that open or close reasoning.

:class:`StopStringMatcher` withholds stop strings from streamed text.
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
