"""The op ``vllm_moe``'s own features (numpy only: the serving path imports this), appended to the
shared feature list for ``vllm_moe`` models only.

The shared features see one GEMM of M * top_k rows, N = the intermediate size and K = hidden. The
layer runs two on one config: gate_up (N' = 2N, K' = hidden) and down (N' = hidden, K' = N), over
the same row tiles of the routed pairs. These describe both, and vLLM's own code paths:

- the routing histogram: tokens per expert (mean, max), active experts, imbalance;
- ``per_pair``: vLLM's per-pair assignment (M * top_k * 4 <= E: no sorting, one program row per
  pair); ``swap_ab_rule``: vLLM's swapped operands for fp8 on Hopper (BLOCK_SIZE_M < 64 and
  BLOCK_SIZE_N >= 64; vLLM takes it on compute capability 9.0 only);
- the real row tiles (per pair on the per-pair path, else sum_e ceil(count_e / BLOCK_M)), their
  padding, and per GEMM the real programs, waves, wave efficiency, operand traffic and a per-SM
  compute time; the launched grid (vLLM's padded length over BLOCK_M, mostly idle programs); the
  active experts' weight bytes over HBM bandwidth; K-loop lengths.

Inputs: as the MoE op's (``kernels/moe/features.py``): the routing id regenerates the histogram
for training rows; at run time the caller's routing (default balanced).
"""
from __future__ import annotations

import numpy as np

from ..moe import routing as R
from ..moe.features import _tiles

INPUTS = ("tiles_real", "active_experts", "tpe_max")
NAMES = ("log2_tpe_mean", "log2_tpe_max", "active_fraction", "imbalance", "per_pair", "swap_ab_rule",
         "tiles_real", "pad_real",
         "log2_programs_up", "waves_up", "wave_efficiency_up", "log2_t_traffic_up_us", "log2_t_waves_up_us",
         "k_iters_up",
         "log2_programs_down", "waves_down", "wave_efficiency_down", "log2_t_traffic_down_us",
         "log2_t_waves_down_us", "k_iters_down",
         "log2_grid_programs", "log2_t_weights_us")
# The fp8 dtype codes (serving.features.DTYPE_CODES: fp8 2, fp8bs 4).
_FP8_CODES = (2.0, 4.0)


def problem_inputs(m: int, e: int, top_k: int, block_m, routing: str = "balanced", counts=None, **_) -> dict:
    """Extra inputs of one problem against candidates (block_m an array over them)."""
    c = np.asarray(counts if counts is not None else R.expert_counts(routing, int(m), int(e), int(top_k)),
                   dtype=np.int64)
    if c.shape != (int(e),) or c.sum() != int(m) * int(top_k):
        raise ValueError(f"counts must be E={e} expert token counts summing to M*top_k={int(m) * int(top_k)}")
    bm = np.asarray(block_m, dtype=np.int64).reshape(-1)
    return {"tiles_real": _tiles(c, bm), "active_experts": float((c > 0).sum()), "tpe_max": float(c.max())}


def frame_inputs(df) -> dict:
    """Extra inputs of every row of a dataset frame (columns routing, m, e, top_k, block_m)."""
    n = len(df)
    out = {k: np.zeros(n, dtype=np.float64) for k in INPUTS}
    keys = np.stack([df["m"].to_numpy(np.int64), df["e"].to_numpy(np.int64), df["top_k"].to_numpy(np.int64)], 1)
    routing = df["routing"].astype(str).to_numpy()
    bm = df["block_m"].to_numpy(np.int64)
    groups: dict = {}
    for i, key in enumerate(zip(routing, map(tuple, keys))):
        groups.setdefault(key, []).append(i)
    for (ro, (m, e, top_k)), rows in groups.items():
        rows = np.asarray(rows)
        x = problem_inputs(int(m), int(e), int(top_k), bm[rows], ro)
        for k in INPUTS:
            out[k][rows] = x[k]
    return out


def _value(v):
    a = np.asarray(v, dtype=np.float64)
    return a[()] if a.ndim == 0 else a


# Rows of compute's block that are log2s, and those that are 0 on vendor rows.
_LOG2_ROWS = np.array([0, 1, 8, 11, 12, 14, 17, 18, 20, 21], dtype=np.intp)
_TILED_ROWS = slice(5, 21)


def compute(ctx, x: dict) -> np.ndarray:
    """(rows, len(NAMES)) features from the shared context ``ctx`` (serving.features._Ctx) and the
    extra inputs ``x``; tile features are 0 on vendor rows."""
    n_rows = ctx.n_rows
    active, tpe_max = _value(x["active_experts"]), _value(x["tpe_max"])
    rows = ctx.rows  # token-expert pairs
    tpe_mean = rows / ctx.e
    per_pair = (ctx.m * ctx.top_k * 4 <= ctx.e).astype(np.float64)
    tiles = np.where(per_pair > 0, rows, np.maximum(_value(x["tiles_real"]), 1))
    tiles = np.where(ctx.tiled, tiles, 1.0)
    inter, hidden = ctx.n, ctx.k
    out = np.empty((len(NAMES), n_rows))
    out[0] = tpe_mean
    out[1] = np.maximum(tpe_max, 1)
    out[2] = active / ctx.e
    out[3] = tpe_max / np.maximum(tpe_mean, 1e-9)
    out[4] = per_pair
    fp8 = np.isin(ctx.dtype_code, _FP8_CODES)
    out[5] = (fp8 & (ctx.bm < 64) & (ctx.bn >= 64)).astype(np.float64)
    out[6] = tiles
    out[7] = 1 - rows / (tiles * ctx.bm)
    r = 8
    for n_out, k_red in ((2 * inter, hidden), (hidden, inter)):
        programs = tiles * np.ceil(n_out / ctx.bn)
        waves = programs / ctx.slots
        full = np.ceil(waves)
        out[r] = programs
        out[r + 1] = waves
        out[r + 2] = programs / (full * ctx.slots)
        out[r + 3] = programs * ctx.tile_edge * k_red * ctx.in_b / ctx.bw * 1e6
        out[r + 4] = full * ctx.occupancy * 2 * ctx.bm * ctx.bn * k_red / (ctx.peak / ctx.sm_count) * 1e6
        out[r + 5] = np.ceil(k_red / ctx.bk)
        r += 6
    # vLLM's launched grid of gate_up: its padded length over BLOCK_M (the per-pair path: one row of
    # programs per pair), most of it exiting at once.
    padded = np.where(per_pair > 0, rows * ctx.bm, rows + np.minimum(ctx.e, rows) * (ctx.bm - 1))
    out[20] = np.ceil(padded / ctx.bm) * np.ceil(2 * inter / ctx.bn)
    out[21] = active * 3 * inter * hidden * ctx.in_b / ctx.bw * 1e6
    logs = out[_LOG2_ROWS]
    np.maximum(logs, 1e-30, out=logs)
    out[_LOG2_ROWS] = np.log2(logs, out=logs)
    vendor = ~np.broadcast_to(ctx.tiled, (n_rows,))
    np.copyto(out[_TILED_ROWS], 0.0, where=vendor)
    return out.T

