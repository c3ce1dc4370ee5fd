"""The model step the engine's worker thread runs, synchronous and sans-IO (no module here imports trio):
one batched step for every active generation (batch), and the same with a MemoryError kept to the
generations that needed the memory (contained).

A room of the engine layer; the trio side that calls it is :mod:`kestrel_trio.engine.engine`.
"""
