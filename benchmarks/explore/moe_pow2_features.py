"""Exploration (kept as a record; not in the package): fp8_blockscale's power-of-two features
(``kernels/fp8_blockscale/features.py``: log2 of the largest power of two dividing N and K) added
to the MoE op's own features, for a leave-one-family-out CV against the shipped MoE features.

Why: on fp8_blockscale they raised the held-out match over seeds 0-4 (the M = 1 GEMV's best
config follows whether N and K are powers of two); the MoE misses are M = 1 GEMV picks too.

    python benchmarks/explore/moe_pow2_features.py --gpus "NVIDIA H100 80GB HBM3" --set seed=0 --out /tmp/m.csv

(the arguments are cv_variants.py's; --op is fixed to moe).
"""
from __future__ import annotations

import numpy as np

from gemm_costmodel.kernels.fp8_blockscale.features import NAMES as POW2_NAMES
from gemm_costmodel.kernels.fp8_blockscale.features import compute as pow2_compute
from gemm_costmodel.kernels.moe import features as MF

INPUTS = MF.INPUTS
NAMES = MF.NAMES + POW2_NAMES
frame_inputs = MF.frame_inputs
problem_inputs = MF.problem_inputs


def compute(ctx, x: dict) -> np.ndarray:
    return np.concatenate([MF.compute(ctx, x), pow2_compute(ctx, x)], axis=1)


if __name__ == "__main__":
    import cv_variants

    cv_variants.main_with_features("moe", "moe_pow2_features", NAMES)
