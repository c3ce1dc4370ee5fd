"""Qwen3-VL: the vision tower (tower), its config.json (qwen3_vl_config) and the model that joins the tower
to the decoder, from a folder (qwen3_vl) or a GGUF with its mmproj file (qwen3_vl_gguf).

A room of kestrel_trio._model: its ranks among the others are in tests/test_architecture.py.
"""
