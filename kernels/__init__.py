"""GEMM kernels (folder kernels/, imported as ``gemm_costmodel.kernels``).

gemm.py: the Triton kernels and ``launch(cfg, x, w)`` for every candidate (swap-AB
kernels in gemm_swapab.py); common.py: the helpers both share (tile order, K loop,
split-K epilogue, operand checks, buffers); gemm_configs.py: the configs and the
feasible candidate space. Exploration-only kernels are in benchmarks/explore/, not installed.
"""
