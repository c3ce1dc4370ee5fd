"""JSON field checks every API front shares (OpenAI, Responses, Anthropic, Ollama).

``access``: typed getters over a decoded request body whose errors name the field's dotted path
(``messages[2].content``); ``key_classes``: the one loop that sorts an object's keys into acting, documented
no-op, refused and unknown. The lowest room of the OpenAI layer: it imports no other.
"""
