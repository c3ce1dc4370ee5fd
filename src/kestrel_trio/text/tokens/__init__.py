"""Tokens and the text on either side of them: what a checkpoint's tokenizer files give.

- :mod:`.tokenizer`: the checkpoint's byte-level BPE tokenizer, its end-of-sequence ids, chat template and
  ``generation_config.json`` sampling defaults; from a GGUF file, its vocabulary rebuilt by :mod:`.gguf_vocab`.
- :mod:`.detokenizer`: token ids back to text deltas that never split a character.
- :mod:`.chat_template`: the chat template the tokenizer carries, rendered as transformers renders it.

The text layer's ``__init__`` re-exports the classes callers use (Tokenizer, ChatTemplate,
IncrementalDetokenizer); this room's modules are imported by their own paths.
"""
