"""Exploration (kept as a record; not in the package): the power-of-two part of N and K as
fp8_blockscale's own feature module, for a leave-one-family-out CV against the shipped features.

Why: at M = 1 the best GEMV config follows whether the weight's dimensions are powers of two
(N = 2048, 4096, 8192 prefer `n1k512_w4`; at K = 7168 every other N of 9216 and up prefers
`n1k1024_w4`; at K = 5120 N = 16384, 32768, 65536 prefer `n1k1024_w4` and the other large N
`n4k1024_w4`), the kind of pattern DRAM channel interleaving gives strided row reads. log2 N and
log2 K alone cannot express it. A fast M = 1-only loop (rank objective, the shipped
hyperparameters, family folds) moved the held-out M = 1 match from 25.4 to 27.4 of 37 shapes
(mean of seeds 0-4).

Features: log2 of the largest power of two dividing N (``log2_n_pow2``) and K (``log2_k_pow2``).
They were measured here as this script's own code and then shipped unchanged as
``kernels/fp8_blockscale/features.py``, which this script now serves, so on this checkout it
reproduces the shipped model's CV.

    python benchmarks/explore/fp8bs_pow2_features.py --set seed=0 --out /tmp/f.csv

(the arguments are cv_variants.py's; --op is fixed to fp8_blockscale).
"""
from __future__ import annotations

from gemm_costmodel.kernels.fp8_blockscale.features import (INPUTS, NAMES, compute, frame_inputs,  # noqa: F401
                                                            problem_inputs)

if __name__ == "__main__":
    import cv_variants

    cv_variants.main_with_features("fp8_blockscale", "fp8bs_pow2_features", NAMES)
