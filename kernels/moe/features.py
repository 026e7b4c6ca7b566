"""The MoE op's own features (numpy only: the serving path imports this), appended to the shared
feature list (``gemm_costmodel.serving.features``) for ``moe`` models only.

The shared features see M * top_k rows spread evenly over E experts. A grouped GEMM runs
sum_e ceil(count_e / BLOCK_M) row tiles over the experts that got tokens, reads only those
experts' weights, and launches a grid sized for the worst case (vLLM's padding bound), whose
idle programs exit at once. These features describe that from the routing histogram:

- the histogram's statistics: tokens per expert (mean, max), active experts, imbalance;
- the real work decomposition per config: row tiles, padded rows, programs, waves;
- the memory floor over the active experts' weights, and the launched (mostly idle) grid.

Inputs: for training, the dataset columns (routing id, m, e, top_k, stage, block_m); the routing
id regenerates the histogram (``routing.expert_counts``, seeded). At run time, the routing id the
caller names (default ``balanced``: during CUDA-graph capture the histogram is not on the host).
"""
from __future__ import annotations

import numpy as np

from . import routing as R

STAGE_CODES = {"gate_up": 0, "down": 1}
# Extra per-row inputs (beside the shared base columns) and the features computed from them.
INPUTS = ("stage_code", "tiles_real", "active_experts", "tpe_max")
NAMES = ("stage_down", "log2_tpe_mean", "log2_tpe_max", "active_fraction", "imbalance", "tiles_real",
         "pad_real", "log2_programs_real", "waves_real", "wave_efficiency_real", "log2_grid_programs",
         "log2_t_weights_us", "log2_t_traffic_real_us", "log2_t_waves_real_us")


def _tiles(counts: np.ndarray, block_m: np.ndarray) -> np.ndarray:
    """sum_e ceil(count_e / BLOCK_M) for each BLOCK_M (vendor rows: 0 -> 0)."""
    out = np.zeros(len(block_m), dtype=np.float64)
    for bm in np.unique(block_m):
        if bm >= 1:
            out[block_m == bm] = float(((counts + bm - 1) // bm).sum())
    return out


def problem_inputs(m: int, e: int, top_k: int, stage: str, block_m, routing: str = "balanced",
                   counts=None) -> dict:
    """Extra inputs of one problem against candidates (block_m an array over them)."""
    if stage not in STAGE_CODES:
        raise ValueError(f"stage must be one of {', '.join(STAGE_CODES)}, got {stage!r}")
    c = np.asarray(counts if counts is not None else R.expert_counts(routing, int(m), int(e), int(top_k)),
                   dtype=np.int64)
    if c.shape != (int(e),) or c.sum() != int(m) * int(top_k):
        raise ValueError(f"counts must be E={e} expert token counts summing to M*top_k={int(m) * int(top_k)}")
    bm = np.asarray(block_m, dtype=np.int64).reshape(-1)
    return {"stage_code": float(STAGE_CODES[stage]), "tiles_real": _tiles(c, bm),
            "active_experts": float((c > 0).sum()), "tpe_max": float(c.max())}


def frame_inputs(df) -> dict:
    """Extra inputs of every row of a dataset frame (columns routing, m, e, top_k, stage, block_m)."""
    n = len(df)
    out = {k: np.zeros(n, dtype=np.float64) for k in INPUTS}
    stage = df["stage"].astype(str).to_numpy()
    bad = ~np.isin(stage, list(STAGE_CODES))
    if bad.any():
        raise ValueError(f"column 'stage': {stage[bad][0]!r} is not an MoE stage ({', '.join(STAGE_CODES)})")
    out["stage_code"] = np.array([STAGE_CODES[s] for s in stage], dtype=np.float64)
    keys = np.stack([df["m"].to_numpy(np.int64), df["e"].to_numpy(np.int64), df["top_k"].to_numpy(np.int64)], 1)
    routing = df["routing"].astype(str).to_numpy()
    bm = df["block_m"].to_numpy(np.int64)
    groups: dict = {}
    for i, key in enumerate(zip(routing, map(tuple, keys))):
        groups.setdefault(key, []).append(i)
    for (ro, (m, e, top_k)), rows in groups.items():
        rows = np.asarray(rows)
        x = problem_inputs(int(m), int(e), int(top_k), "gate_up", bm[rows], ro)
        out["tiles_real"][rows] = x["tiles_real"]
        out["active_experts"][rows] = x["active_experts"]
        out["tpe_max"][rows] = x["tpe_max"]
    return out


def _log2(x):
    return np.log2(np.maximum(x, 1e-30))


def compute(ctx, x: dict) -> np.ndarray:
    """(rows, len(NAMES)) features from the shared context ``ctx`` (serving.features._Ctx) and the
    extra inputs ``x``; tile features are 0 on vendor rows."""
    n = ctx.n_rows
    b = {k: np.broadcast_to(np.asarray(x[k], dtype=np.float64), (n,)) for k in INPUTS}
    tpe_mean = ctx.rows / ctx.e
    tiles = np.where(ctx.tiled, np.maximum(b["tiles_real"], 1), 1.0)
    programs = tiles * ctx.tiles_n
    waves = programs / ctx.slots
    # vLLM's grid bound: M*top_k + E*(BLOCK_M - 1) rows (capped at M*top_k*BLOCK_M when M*top_k < E).
    padded_bound = np.where(ctx.rows < ctx.e, np.minimum(ctx.rows * ctx.bm, ctx.rows + ctx.e * (ctx.bm - 1)),
                            ctx.rows + ctx.e * (ctx.bm - 1))
    grid = np.ceil(padded_bound / ctx.bm) * ctx.tiles_n
    weights = b["active_experts"] * ctx.n * ctx.k * ctx.in_b
    traffic = programs * (ctx.bm + ctx.bn) * ctx.k * ctx.in_b
    t_waves = np.ceil(waves) * ctx.occupancy * 2 * ctx.bm * ctx.bn * ctx.k / (ctx.peak / ctx.sm_count) * 1e6
    cols = [
        np.broadcast_to(b["stage_code"], (n,)),
        _log2(np.broadcast_to(tpe_mean, (n,))),
        _log2(np.maximum(b["tpe_max"], 1)),
        np.broadcast_to(b["active_experts"] / ctx.e, (n,)),
        np.broadcast_to(b["tpe_max"] / np.maximum(tpe_mean, 1e-9), (n,)),
        ctx.only_tiled(tiles),
        ctx.only_tiled(1 - ctx.rows / (tiles * ctx.bm)),
        ctx.only_tiled(_log2(programs)),
        ctx.only_tiled(waves),
        ctx.only_tiled(programs / (np.ceil(waves) * ctx.slots)),
        ctx.only_tiled(_log2(grid)),
        _log2(np.broadcast_to(weights / ctx.bw * 1e6, (n,))),
        ctx.only_tiled(_log2(traffic / ctx.bw * 1e6)),
        ctx.only_tiled(_log2(t_waves)),
    ]
    return np.stack([np.broadcast_to(np.asarray(c, dtype=np.float64), (n,)) for c in cols], axis=1)
