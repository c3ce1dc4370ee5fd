"""Ollama's API served over the chat preparation every front shares.

``routes``: ``/api/chat``, ``/api/generate``, ``/api/embed``, the listings and the refusals of Ollama's model
store; ``facts``: what the listings say about the served model, read once. The JSON shapes themselves are
:mod:`kestrel_trio.ollama`'s.
"""
