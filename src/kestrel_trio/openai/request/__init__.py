"""OpenAI request bodies -> validated frozen values (chat, completions, tokenize, detokenize).

``bodies``: the request values and their parsers (what :mod:`kestrel_trio.openai` re-exports);
``sampling_fields``: the sampling fields chat and completions share; ``messages``: ``messages``, ``tools``
and ``tool_choice``; ``structured``: ``response_format`` and ``structured_outputs``; ``thinking``:
``reasoning_effort``, ``enable_thinking`` and the thinking budget; ``image_urls``: where an image or video part
points; ``accepted_fields``: which keys act, which are documented no-ops and which are refused.
Built on :mod:`kestrel_trio.openai.fields`.
"""
