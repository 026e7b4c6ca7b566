"""The dense GEMM op (registry ``gemm``), a folder like the other ops'.

space.py: the problem, configs and the feasible candidate space (torch-free); kernel.py: the
Triton kernels and ``launch(cfg, x, w)`` for every candidate, with the swap-AB (swapab.py) and
GEMV (gemv.py) decode kernels; impl.py: the op's implementation as the registry sees it;
heuristic.py: the fallback rule (pure Python); suites.py: the dense shape suites.
"""
