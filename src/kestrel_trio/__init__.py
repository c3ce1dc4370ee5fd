"""kestrel-trio: an OpenAI-compatible Qwen server on trio, h11 and numpy."""
