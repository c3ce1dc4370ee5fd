"""OpenAI response bodies, in exactly OpenAI's shapes (sans-IO).

``choices``: one choice assembled from generated text (reasoning, content, tool calls, logprobs); ``logprobs``:
token logprobs in the chat and completions shapes; ``bodies``: the completion, chunk, usage and model-list
bodies, ids and the one JSON serializer; ``sse``: server-sent events framing. Imports no other room.
"""
