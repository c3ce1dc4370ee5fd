"""The engine's memory: the KV budget that bounds every live KV byte and what each generation reserves of it
(kv_budget), and what the host can give, what the process holds and giving freed memory back (host_memory).

A room of the engine layer, below the engine's trio side (admission, the inference task) that asks it.
"""
