"""The MoE op's own features (numpy only: the serving path imports this), appended to the shared
feature list (``gemm_costmodel.serving.features``) for ``moe`` models only.

The shared features see M * top_k rows spread evenly over E experts. A grouped GEMM runs
sum_e ceil(count_e / BLOCK_M) row tiles over the experts that got tokens, reads only those
experts' weights, and launches a grid sized for the worst case (vLLM's padding bound), whose
idle programs exit at once. These features describe that from the routing histogram:

- the histogram's statistics: tokens per expert (mean, max), active experts, imbalance;
- the real work decomposition per config: row tiles, padded rows, programs, waves;
- the memory floor over the active experts' weights, and the launched (mostly idle) grid;
- for the GEMV (no align, no tiles): its real programs (gate_up: a pair's intermediate columns;
  down: a token's output columns, looping over its top_k experts), K steps per program, fp32
  accumulator elements per thread, programs per SM from a register estimate, waves, weight bytes
  in flight per SM and waves x K steps (its configs' times on one problem are up to 4x apart);
  0 on other rows.

Inputs: for training, the dataset columns (routing id, m, e, top_k, stage, block_m); the routing
id regenerates the histogram (``routing.expert_counts``, seeded). At run time, the routing id the
caller names (default ``balanced``: during CUDA-graph capture the histogram is not on the host).
"""
from __future__ import annotations

import numpy as np

from gemm_costmodel.kernels.space_common import VARIANT_CODES

from . import routing as R

STAGE_CODES = {"gate_up": 0, "down": 1}
# Extra per-row inputs (beside the shared base columns) and the features computed from them.
INPUTS = ("stage_code", "tiles_real", "active_experts", "tpe_max")
NAMES = ("stage_down", "log2_tpe_mean", "log2_tpe_max", "active_fraction", "imbalance", "tiles_real",
         "pad_real", "log2_programs_real", "waves_real", "wave_efficiency_real", "log2_grid_programs",
         "log2_t_weights_us", "log2_t_traffic_real_us", "log2_t_waves_real_us",
         "gemv_log2_programs", "gemv_k_steps", "gemv_acc_per_thread", "gemv_log2_occupancy", "gemv_waves",
         "gemv_log2_inflight_kb", "gemv_log2_serial_steps")


def _tiles(counts: np.ndarray, block_m: np.ndarray) -> np.ndarray:
    """sum_e ceil(count_e / BLOCK_M) for each BLOCK_M (vendor rows: 0 -> 0), per distinct BLOCK_M
    in one (distinct, E) integer array: a few numpy calls however many BLOCK_M values."""
    ubm, inv = np.unique(block_m, return_inverse=True)
    step = np.maximum(ubm, 1)[:, None]
    per = ((np.asarray(counts)[None, :] + step - 1) // step).sum(axis=1).astype(np.float64)
    per[ubm < 1] = 0.0
    return per[inv.reshape(-1)]


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


# Rows of compute's (len(NAMES), rows) block that are log2s of their argument, and that are 0 on
# vendor rows: both applied in a few calls over the block (the runtime's cold decision, issue 18).
_LOG2_ROWS = np.array([1, 2, 7, 10, 11, 12, 13, 14, 17, 19, 20], dtype=np.intp)
_TILED_ROWS = (slice(5, 11), slice(12, 14))
_GEMV_ROWS = slice(14, 21)


def _value(v):
    """A per-row input as float64: an array stays one, a scalar becomes a numpy scalar (the runtime's
    one problem), whose operations cost a tenth of a 0-d array's."""
    a = np.asarray(v, dtype=np.float64)
    return a[()] if a.ndim == 0 else a


def compute(ctx, x: dict) -> np.ndarray:
    """(rows, len(NAMES)) features from the shared context ``ctx`` (serving.features._Ctx) and the
    extra inputs ``x``; tile features are 0 on vendor rows."""
    n = ctx.n_rows
    tiles_real, active, tpe_max = _value(x["tiles_real"]), _value(x["active_experts"]), _value(x["tpe_max"])
    tpe_mean = ctx.rows / ctx.e
    tiles = np.where(ctx.tiled, np.maximum(tiles_real, 1), 1.0)
    programs = tiles * ctx.tiles_n
    waves = programs / ctx.slots
    full_waves = np.ceil(waves)
    # vLLM's grid bound: M*top_k + E*(BLOCK_M - 1) rows (capped at M*top_k*BLOCK_M when M*top_k < E).
    padded_bound = np.where(ctx.rows < ctx.e, np.minimum(ctx.rows * ctx.bm, ctx.rows + ctx.e * (ctx.bm - 1)),
                            ctx.rows + ctx.e * (ctx.bm - 1))
    # Rows in NAMES order, before the log2 (_LOG2_ROWS) and the vendor zeroing (_TILED_ROWS).
    out = np.empty((len(NAMES), n))
    out[0] = _value(x["stage_code"])
    out[1] = tpe_mean
    out[2] = np.maximum(tpe_max, 1)
    out[3] = active / ctx.e
    out[4] = tpe_max / np.maximum(tpe_mean, 1e-9)
    out[5] = tiles
    out[6] = 1 - ctx.rows / (tiles * ctx.bm)
    out[7] = programs
    out[8] = waves
    out[9] = programs / (full_waves * ctx.slots)
    out[10] = np.ceil(padded_bound / ctx.bm) * ctx.tiles_n  # the launched grid
    out[11] = active * ctx.n * ctx.k * ctx.in_b / ctx.bw * 1e6  # the active experts' weights, us
    out[12] = programs * ctx.tile_edge * ctx.k * ctx.in_b / ctx.bw * 1e6  # operand traffic, us
    out[13] = full_waves * ctx.occupancy * 2 * ctx.bm * ctx.bn * ctx.k / (ctx.peak / ctx.sm_count) * 1e6
    # The GEMV's own work decomposition (impl.moe_gemv_*_kernel); gate_up computes N / 2 columns
    # from two weight rows each.
    down = _value(x["stage_code"])
    cols = np.ceil(ctx.n * (1 - 0.5 * (1 - down)) / ctx.bn)
    out[14] = (ctx.m * (down + (1 - down) * ctx.top_k)) * cols
    out[15] = (down * ctx.top_k + (1 - down)) * np.ceil(ctx.k / ctx.bk)
    out[16] = ctx.bn * ctx.bk * (2 - down) / (32 * ctx.warps)
    # Programs per SM from a register estimate (accumulators and the loaded tile, the activation
    # slice, ~32 for addressing; at most 255 per thread, 64K per SM, 64 warps), the waves they
    # take, the weight bytes each SM has in flight per K step, and waves x K steps (the serial
    # chain of dependent loads when too few bytes are in flight to cover the memory latency).
    regs = np.minimum(255.0, 2 * out[16] + ctx.bk / (32 * ctx.warps) + 32)
    occ = np.clip(np.floor(65536 / (32 * ctx.warps * regs)), 1, np.floor(64 / ctx.warps))
    out[17] = occ
    out[18] = out[14] / (ctx.sm_count * occ)
    out[19] = np.minimum(occ, np.ceil(out[14] / ctx.sm_count)) * (2 - down) * ctx.bn * ctx.bk * ctx.in_b / 1024
    out[20] = np.ceil(out[18]) * out[15]
    logs = out[_LOG2_ROWS]
    np.maximum(logs, 1e-30, out=logs)
    out[_LOG2_ROWS] = np.log2(logs, out=logs)
    vendor = ~np.broadcast_to(ctx.tiled, (n,))
    for rows in _TILED_ROWS:
        np.copyto(out[rows], 0.0, where=vendor)
    np.copyto(out[_GEMV_ROWS], 0.0, where=~np.broadcast_to(ctx.variant_code == VARIANT_CODES["gemv"], (n,)))
    return out.T
