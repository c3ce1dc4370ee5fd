"""A chat request's images and videos: limits, locating (inline data or an allowed folder, never the
network), reading, decoding and preprocessing, all before any engine work (``images``, ``videos``).
"""
