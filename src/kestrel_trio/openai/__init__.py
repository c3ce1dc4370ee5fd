"""The OpenAI schema layer: JSON <-> values, validation, error bodies, SSE framing.

Imports neither trio nor numpy.
"""
