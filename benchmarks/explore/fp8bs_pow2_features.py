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

    python benchmarks/explore/fp8bs_pow2_features.py --set seed=0 --out /tmp/f.csv

(the arguments are cv_variants.py's; --op is fixed to fp8_blockscale).
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np

INPUTS: tuple[str, ...] = ()
NAMES = ("log2_n_pow2", "log2_k_pow2")


def frame_inputs(df) -> dict:
    return {}


def problem_inputs(m, e, top_k, block_m=None, **_) -> dict:
    return {}


def _pow2_part(x) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64).astype(np.int64)
    return np.log2((v & -v).astype(np.float64))


def compute(ctx, x: dict) -> np.ndarray:
    n = np.broadcast_to(_pow2_part(ctx.n), (ctx.n_rows,))
    k = np.broadcast_to(_pow2_part(ctx.k), (ctx.n_rows,))
    return np.stack([n, k], axis=1)


if __name__ == "__main__":
    from gemm_costmodel import registry

    registry.REGISTRY["fp8_blockscale"] = dataclasses.replace(registry.REGISTRY["fp8_blockscale"],
                                                              features="fp8bs_pow2_features")
    import cv_variants

    sys.argv = [sys.argv[0], "--op", "fp8_blockscale", *sys.argv[1:]]
    cv_variants.main()
