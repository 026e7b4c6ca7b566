"""The grouped_gemm op's own features (numpy only: the serving path imports this), appended to the
shared feature list (``gemm_costmodel.serving.features``) for ``grouped_gemm`` models only.

The shared features see an M x N x K GEMM. A pass of a grouped GEMM is not one: fwd and dgrad run
sum_g ceil(tokens_g / BLOCK_M) row tiles (a group's last tile is partly padding), dgrad's output
is M x K with N the reduction, and wgrad writes E weight gradients of N x K, each reduced over its
own group's tokens, so its longest tile is the busiest group's. These features describe that:

- the pass (one-hot) and the reduction each pass runs: K (fwd), N (dgrad), tokens per group
  (wgrad: mean and max);
- the routing histogram: tokens per group (mean, max), empty groups, imbalance max / mean;
- the config's real work: output tiles (times split_k), their padding, waves over the SMs, the
  wave efficiency, K-loop steps of the longest tile;
- a roofline in microseconds: flops at peak, and the bytes every pass must move (its operands
  read once and its output written once).

Inputs: for training, the dataset columns (stage, routing, m, e, block_m); the routing id
regenerates the histogram (``routing.expert_counts``, top_k 1). At run time, the pass and routing
id the caller names (default routing ``balanced``).
"""
from __future__ import annotations

import numpy as np

from gemm_costmodel.kernels.moe import routing as R
from gemm_costmodel.kernels.space_common import VARIANT_CODES

STAGE_CODES = {"fwd": 0, "dgrad": 1, "wgrad": 2}
INPUTS = ("stage_code", "row_tiles", "active_groups", "tpg_max")
NAMES = ("stage_fwd", "stage_dgrad", "stage_wgrad", "log2_tpg_mean", "log2_tpg_max", "empty_fraction",
         "imbalance", "log2_reduction", "log2_reduction_max", "log2_tiles_real", "pad_real", "waves_real",
         "wave_efficiency_real", "log2_k_steps_max", "log2_t_flops_us", "log2_t_bytes_us")
_LOG2 = np.array([3, 4, 7, 8, 9, 13, 14, 15], dtype=np.intp)
# Rows that describe a Triton config's tiles: 0 on vendor rows.
_TILED = np.array([9, 10, 11, 12, 13], dtype=np.intp)


def _row_tiles(counts: np.ndarray, block_m: np.ndarray) -> np.ndarray:
    """sum_g ceil(count_g / BLOCK_M) per BLOCK_M (vendor rows: block_m 0 -> 0), computed once per
    distinct BLOCK_M."""
    ubm, inv = np.unique(block_m, return_inverse=True)
    step = np.maximum(ubm, 1)[:, None]
    per = ((np.asarray(counts)[None, :] + step - 1) // step).sum(axis=1).astype(np.float64)
    per[ubm < 1] = 0.0
    return per[inv.reshape(-1)]


def problem_inputs(m: int, e: int, top_k: int = 1, block_m=None, stage: str = "fwd", routing: str = "balanced",
                   counts=None, **_) -> dict:
    """Extra inputs of one problem against candidates (block_m: an array over them)."""
    if stage not in STAGE_CODES:
        raise ValueError(f"stage must be one of {', '.join(STAGE_CODES)}, got {stage!r}")
    c = np.asarray(counts if counts is not None else R.expert_counts(routing, int(m), int(e), 1), dtype=np.int64)
    if c.shape != (int(e),) or c.sum() != int(m):
        raise ValueError(f"counts must be E={e} group token counts summing to M={int(m)}")
    bm = np.asarray(block_m if block_m is not None else [0], dtype=np.int64).reshape(-1)
    return {"stage_code": float(STAGE_CODES[stage]), "row_tiles": _row_tiles(c, bm),
            "active_groups": float((c > 0).sum()), "tpg_max": float(c.max())}


def frame_inputs(df) -> dict:
    """Extra inputs of every row of a dataset frame (columns stage, routing, m, e, block_m)."""
    n = len(df)
    out = {k: np.zeros(n, dtype=np.float64) for k in INPUTS}
    stage = df["stage"].astype(str).to_numpy()
    bad = ~np.isin(stage, list(STAGE_CODES))
    if bad.any():
        raise ValueError(f"column 'stage': {stage[bad][0]!r} is not a grouped_gemm pass ({', '.join(STAGE_CODES)})")
    out["stage_code"] = np.array([STAGE_CODES[s] for s in stage], dtype=np.float64)
    routing = df["routing"].astype(str).to_numpy()
    m = df["m"].to_numpy(np.int64)
    e = df["e"].to_numpy(np.int64)
    bm = df["block_m"].to_numpy(np.int64)
    groups: dict = {}
    for i, key in enumerate(zip(routing, m, e)):
        groups.setdefault(key, []).append(i)
    for (ro, mm, ee), rows in groups.items():
        rows = np.asarray(rows)
        x = problem_inputs(int(mm), int(ee), 1, bm[rows], "fwd", ro)
        for name in ("row_tiles", "active_groups", "tpg_max"):
            out[name][rows] = x[name]
    return out


def _value(v):
    a = np.asarray(v, dtype=np.float64)
    return a[()] if a.ndim == 0 else a


def compute(ctx, x: dict) -> np.ndarray:
    """(rows, len(NAMES)) features from the shared context ``ctx`` (serving.features._Ctx) and the
    extra inputs ``x``; tile features are 0 on vendor rows."""
    n_rows = ctx.n_rows
    code = _value(x["stage_code"])
    fwd, dgrad, wgrad = (np.asarray(code == c, dtype=np.float64) for c in (0.0, 1.0, 2.0))
    row_tiles = _value(x["row_tiles"])
    active, tpg_max = _value(x["active_groups"]), _value(x["tpg_max"])
    m, n, k, e = ctx.m, ctx.n, ctx.k, ctx.e
    tpg_mean = m / e
    # The output's columns: N (fwd), K (dgrad, wgrad); wgrad's rows are N per group.
    cols = fwd * n + (1 - fwd) * k
    col_tiles = np.ceil(cols / ctx.bn)
    wg_tiles = e * np.ceil(n / ctx.bm) * col_tiles
    tiles = (1 - wgrad) * np.maximum(row_tiles, 1) * col_tiles + wgrad * wg_tiles
    programs = tiles * ctx.sk
    waves = programs / ctx.slots
    red = fwd * k + dgrad * n + wgrad * tpg_mean
    red_max = fwd * k + dgrad * n + wgrad * np.maximum(tpg_max, 1)
    # Padded rows of the tile schedule: a group's last row tile (fwd, dgrad); N's last (wgrad).
    pad = (1 - wgrad) * (1 - m / np.maximum(row_tiles * ctx.bm, 1)) + wgrad * (1 - n / (np.ceil(n / ctx.bm) * ctx.bm))
    traffic = (m * k + m * n) * ctx.in_b + (1 - wgrad) * active * n * k * ctx.in_b + wgrad * e * n * k * ctx.out_b
    out = np.empty((len(NAMES), n_rows))
    out[0], out[1], out[2] = fwd, dgrad, wgrad
    out[3] = tpg_mean
    out[4] = np.maximum(tpg_max, 1)
    out[5] = 1 - active / e
    out[6] = tpg_max / np.maximum(tpg_mean, 1e-9)
    out[7] = np.maximum(red, 1)
    out[8] = red_max
    out[9] = programs
    out[10] = pad
    out[11] = waves
    out[12] = programs / (np.ceil(waves) * ctx.slots)
    out[13] = np.maximum(np.ceil(red_max / ctx.bk / ctx.sk), 1)
    out[14] = 2.0 * m * n * k / ctx.peak * 1e6
    out[15] = traffic / ctx.bw * 1e6
    logs = out[_LOG2]
    out[_LOG2] = np.log2(np.maximum(logs, 1e-30))
    vendor = np.broadcast_to(ctx.variant_code == VARIANT_CODES["vendor"], (n_rows,))
    block = out[_TILED]
    block[:, vendor] = 0.0
    out[_TILED] = block
    return out.T
