"""Kernels (folder kernels/, imported as ``gemm_costmodel.kernels``): one folder per op.

gemm/ (dense GEMM), fp8_blockscale/, moe/: each op's space, kernels, implementation and
suites; common.py: the Triton/host helpers the kernels share (tile order, K loop, split-K
epilogue, operand checks, buffers); space_common.py: what every op's config space shares;
shapes.py: the LLM layer catalogue the suites draw from; hardware.py: the GPU table;
timing.py: the CUDA-graph timer. Exploration-only kernels are in benchmarks/explore/, not installed.
"""
