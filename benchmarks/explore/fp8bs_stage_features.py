"""Exploration (kept as a record; not in the package): pipeline-fill features as fp8_blockscale's
own feature module, for a leave-one-family-out CV against the shipped features.

Four of the op's nine M > 1 misses have K of 128-512, where the K loop takes 1-4 steps and the
pick and the oracle differ in stages or tile width. Features:
- stage_fill: min(num_stages - 1, k_iters) / k_iters, the share of the K loop the prologue
  prefetches (1: the whole loop is in flight before the first MMA);
- log2_stages_over_k: log2(num_stages / k_iters).
0 on vendor rows.

    python benchmarks/explore/fp8bs_stage_features.py --set seed=0 --out /tmp/f.csv

(the arguments are cv_variants.py's; --op is fixed to fp8_blockscale).
"""
from __future__ import annotations

import numpy as np

# No inputs beyond the shared base columns, as the op's shipped module.
from gemm_costmodel.kernels.fp8_blockscale.features import INPUTS, frame_inputs, problem_inputs  # noqa: F401

NAMES = ("stage_fill", "log2_stages_over_k")


def compute(ctx, x: dict) -> np.ndarray:
    k_iters = np.maximum(ctx.k_iters, 1.0)
    fill = np.minimum(np.maximum(ctx.stages - 1, 0), k_iters) / k_iters
    ratio = np.log2(np.maximum(ctx.stages, 1) / k_iters)
    out = np.stack([np.broadcast_to(fill, (ctx.n_rows,)), np.broadcast_to(ratio, (ctx.n_rows,))], axis=1)
    return np.where(np.asarray(ctx.tiled).reshape(-1, 1), out, 0.0)


if __name__ == "__main__":
    import cv_variants

    cv_variants.main_with_features("fp8_blockscale", "fp8bs_stage_features", NAMES)
