"""What a CPU has and what it gets: its features, read once (features), and the kernel plan, a pure
function of them that names each kind of work's kernel for any CPU on any host (plan:
``python -m kestrel_trio._kernels.cpu.plan`` prints the board's, an AVX2 x86's, an AVX-512 one's and
this host's).
"""
