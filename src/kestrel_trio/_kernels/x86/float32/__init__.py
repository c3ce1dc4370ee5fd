"""x86-64 kernels over float32 activations written in inline assembly (AVX2, AVX-512): weight-row
blocks, prefill chunk products and attention, the softmax's exponential; their code generator.
"""
