"""The fp8 block-scale op's own features (numpy only: the serving path imports this), appended to
the shared feature list (``gemm_costmodel.serving.features``) for ``fp8_blockscale`` models only.

Why: at M = 1 the op's GEMV configs (impl.fp8_blockscale_gemv_kernel) sit within a few percent of
each other, and the shared features describe them as MMA tiles: occupancy from shared memory and
warps (16 programs per SM for any 4-warp GEMV), accumulators of BLOCK_M x BLOCK_N. The GEMV keeps a
(BLOCK_N, BLOCK_K) fp32 accumulator and its converted weight tile in registers, so registers, not
shared memory, bound its programs per SM, and with them the weight bytes each SM has in flight.
The model picked ``bsgemv_n4k1024_w4`` on DeepSeek-V3's 24576x7168 and 36864x7168 weights, where
``bsgemv_n1k1024_w4`` was 5-7% faster (models/NOTES.md). These are the MoE GEMV's features
(kernels/moe/features.py) for one weight and one token row:

- programs (ceil(N / BLOCK_N)), K steps per program, fp32 accumulator elements per thread;
- programs per SM from a register estimate, the waves they take, weight bytes in flight per SM per
  K step, and waves x K steps (the chain of dependent loads when too few bytes are in flight);

0 on every other variant's rows. No inputs beyond the shared base columns.
"""
from __future__ import annotations

import numpy as np

from gemm_costmodel.kernels.gemm_configs import VARIANT_CODES

INPUTS: tuple[str, ...] = ()
NAMES = ("gemv_log2_programs", "gemv_k_steps", "gemv_acc_per_thread", "gemv_log2_occupancy", "gemv_waves",
         "gemv_log2_inflight_kb", "gemv_log2_serial_steps")
_LOG2_ROWS = np.array([0, 3, 5, 6], dtype=np.intp)
_GEMV = VARIANT_CODES["gemv"]


def problem_inputs(m: int, e: int = 1, top_k: int = 1, block_m=None, **_unused) -> dict:
    """No extra inputs: the GEMV's features come from the shape and the config alone."""
    return {}


def frame_inputs(df) -> dict:
    return {}


def compute(ctx, x: dict) -> np.ndarray:
    """(rows, len(NAMES)) features from the shared context ``ctx`` (serving.features._Ctx); 0 on
    rows that are not the GEMV."""
    n = ctx.n_rows
    out = np.empty((len(NAMES), n))
    out[0] = np.ceil(ctx.n / ctx.bn) * ctx.m
    out[1] = np.ceil(ctx.k / ctx.bk)
    acc = ctx.bn * ctx.bk / (32 * ctx.warps)
    out[2] = acc
    # Registers per thread: the accumulator, the weight tile converted to fp32, the token slice and
    # ~32 for addressing (at most 255; 64K per SM, at most 64 warps per SM).
    regs = np.minimum(255.0, 2 * acc + ctx.bk / (32 * ctx.warps) + 32)
    occ = np.clip(np.floor(65536 / (32 * ctx.warps * regs)), 1, np.floor(64 / ctx.warps))
    out[3] = occ
    out[4] = out[0] / (ctx.sm_count * occ)
    # The weight is fp8 (one byte an element) whatever the base column's dtype code says.
    out[5] = np.minimum(occ, np.ceil(out[0] / ctx.sm_count)) * ctx.bn * ctx.bk / 1024
    out[6] = np.ceil(out[4]) * out[1]
    logs = out[_LOG2_ROWS]
    np.maximum(logs, 1e-30, out=logs)
    out[_LOG2_ROWS] = np.log2(logs, out=logs)
    np.copyto(out, 0.0, where=~np.broadcast_to(ctx.variant_code == _GEMV, (n,)))
    return out.T
