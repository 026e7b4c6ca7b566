"""Exploration (kept as a record; not in the package): fp8_blockscale's shipped own features (the
power-of-two parts of N and K, ``kernels/fp8_blockscale/features.py``) plus the pipeline-fill
features of ``fp8bs_stage_features.py`` (stage_fill, log2 stages / K steps), for a
leave-one-family-out CV against the shipped features. The first pair is for the M = 1 GEMV picks,
the second for the M > 1 misses at K of 128-512.

    python benchmarks/explore/fp8bs_stage_pow2_features.py --set seed=0 --out /tmp/f.csv

(the arguments are cv_variants.py's; --op is fixed to fp8_blockscale).
"""
from __future__ import annotations

import numpy as np

import fp8bs_stage_features as S
from gemm_costmodel.kernels.fp8_blockscale import features as P

INPUTS = P.INPUTS
NAMES = P.NAMES + S.NAMES
frame_inputs = P.frame_inputs
problem_inputs = P.problem_inputs


def compute(ctx, x: dict) -> np.ndarray:
    return np.concatenate([P.compute(ctx, x), S.compute(ctx, x)], axis=1)


if __name__ == "__main__":
    import cv_variants

    cv_variants.main_with_features("fp8_blockscale", "fp8bs_stage_pow2_features", NAMES)
