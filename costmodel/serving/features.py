"""The feature registry: every model input, declared once, computed the same way for
training (from a dataset frame) and at runtime (from the candidate table).

Numpy only: the serving path imports this. Inputs are the base columns of
``BASE_COLUMNS`` as numpy arrays (one entry per (shape, candidate) row); the
output is a float32 matrix whose columns follow ``FEATURE_NAMES``. The ONNX
models see the same columns as f0..fN. Any change to the list or to a formula
must bump ``FEATURE_VERSION``: it is part of the schema hash that the runtime
checks against each model's manifest.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from gemm_costmodel.serving.hardware import GpuSpec
from gemm_costmodel.kernels.gemm_configs import DTYPE_BYTES as IN_BYTES
from gemm_costmodel.kernels.gemm_configs import OUT_DTYPE, VARIANT_CODES
from gemm_costmodel.kernels.gemm_configs import PARAM_NAMES as PARAMS

FEATURE_VERSION = 2  # 2: variant codes 4-5 (swap-AB)

DTYPE_CODES = {"bf16": 0, "fp16": 1, "fp8": 2, "fp32": 3}
OUT_BYTES = {d: IN_BYTES[OUT_DTYPE[d]] for d in IN_BYTES}

_IN_B = [float(IN_BYTES[d]) for d in DTYPE_CODES]
_OUT_B = [float(OUT_BYTES[d]) for d in DTYPE_CODES]
# Per-row numeric inputs every feature is computed from.
BASE_COLUMNS = ("m", "n", "k", "e", "top_k", "dtype_code", "variant_code", *PARAMS,
                "sm_count", "smem_per_sm_kb", "l2_mb", "peak_tflops", "hbm_gbps")


@dataclass(frozen=True)
class Feature:
    name: str
    doc: str
    fn: Callable[["_Ctx"], np.ndarray]


REGISTRY: list[Feature] = []


def feature(name: str, doc: str, fn: Callable[["_Ctx"], np.ndarray]) -> None:
    """Register a feature; registration order is the column order."""
    if any(f.name == name for f in REGISTRY):
        raise ValueError(f"feature {name!r} registered twice")
    REGISTRY.append(Feature(name, doc, fn))


class _Ctx:
    """Base columns as float64 arrays plus derived quantities shared by several features."""

    def __init__(self, cols: Mapping[str, np.ndarray]):
        # Columns stay as given: a scalar (one shape, many candidates at runtime) is
        # computed once and broadcast at the end, which halves the runtime cost.
        n = max(np.size(v) for v in cols.values())
        self.n_rows = n
        g = {c: np.asarray(cols[c], dtype=np.float64) for c in BASE_COLUMNS}
        self.__dict__.update(g)
        dc = g["dtype_code"].astype(np.int64)
        self.in_b = np.asarray(_IN_B)[dc]
        self.out_b = np.asarray(_OUT_B)[dc]
        v = g["variant_code"].astype(np.int64)
        self.is_vendor = v == VARIANT_CODES["vendor"]
        tiled = ~self.is_vendor
        one = np.ones(np.shape(v))
        # Vendor rows have no tile: use 1s so the arithmetic stays finite, then zero the results.
        self.bm = np.where(tiled, g["block_m"], one)
        self.bn = np.where(tiled, g["block_n"], one)
        self.bk = np.where(tiled, g["block_k"], one)
        self.sk = np.where(tiled, np.maximum(g["split_k"], 1), one)
        self.warps = np.where(tiled, g["num_warps"], 4 * one)
        self.stages = np.where(tiled, g["num_stages"], one)
        self.tiled = tiled
        # Experts: a dense GEMM is E=1, top_k=1; a grouped GEMM does top_k*M rows over E weights.
        self.rows = self.m * self.top_k
        self.tiles_m = np.ceil(self.rows / self.bm)
        self.tiles_n = np.ceil(self.n / self.bn)
        self.k_per_split = np.ceil(np.ceil(self.k / self.bk) / self.sk) * self.bk
        self.k_iters = self.k_per_split / self.bk
        self.programs = self.tiles_m * self.tiles_n * self.sk
        self.smem = self.stages * (self.bm + self.bn) * self.bk * self.in_b
        occ_smem = np.floor(self.smem_per_sm_kb * 1024 / np.maximum(self.smem, 1))
        occ_warps = np.floor(64 / self.warps)
        self.occupancy = np.clip(np.minimum(occ_smem, occ_warps), 1, 32)
        self.slots = self.sm_count * self.occupancy
        self.waves = self.programs / self.slots
        self.flops = 2.0 * self.rows * self.n * self.k
        self.min_bytes = (self.rows * self.k + self.e * self.n * self.k) * self.in_b + self.rows * self.n * self.out_b
        self.peak = self.peak_tflops * 1e12
        self.bw = self.hbm_gbps * 1e9
        self.traffic = (self.programs * (self.bm + self.bn) * self.k_per_split * self.in_b
                        + np.where(self.sk > 1, 2 * self.sk * self.rows * self.n * 4, 0))

    def only_tiled(self, x):
        return np.where(self.tiled, x, 0.0)


def _log2(x):
    return np.log2(np.maximum(x, 1e-30))


# -- raw inputs ------------------------------------------------------------
feature("log2_m", "log2 rows of x (tokens)", lambda c: _log2(c.m))
feature("log2_n", "log2 output features", lambda c: _log2(c.n))
feature("log2_k", "log2 reduction dim", lambda c: _log2(c.k))
feature("e", "experts (1 = dense)", lambda c: c.e)
feature("top_k", "experts per token (1 = dense)", lambda c: c.top_k)
feature("dtype_code", "input dtype code (DTYPE_CODES)", lambda c: c.dtype_code)
feature("in_bytes", "input element bytes", lambda c: c.in_b)
feature("variant_code", "kernel variant code (VARIANT_CODES)", lambda c: c.variant_code)
feature("is_vendor", "vendor library (cuBLAS)", lambda c: c.is_vendor.astype(np.float64))
for _p in PARAMS:
    feature(_p, f"config parameter {_p} (0 = n/a)", (lambda p: lambda c: getattr(c, p))(_p))
# -- the GPU, as numbers -----------------------------------------------------
feature("sm_count", "streaming multiprocessors", lambda c: c.sm_count)
feature("smem_per_sm_kb", "shared memory per SM, KiB", lambda c: c.smem_per_sm_kb)
feature("l2_mb", "L2 cache, MiB", lambda c: c.l2_mb)
feature("peak_tflops", "dense tensor-core peak for the dtype, TFLOP/s", lambda c: c.peak_tflops)
feature("hbm_gbps", "HBM bandwidth, GB/s", lambda c: c.hbm_gbps)
# -- derived: work decomposition ----------------------------------------------
feature("tiles_m", "output tiles along M", lambda c: c.only_tiled(c.tiles_m))
feature("tiles_n", "output tiles along N", lambda c: c.only_tiled(c.tiles_n))
feature("log2_programs", "log2 programs (tiles x split-K)", lambda c: c.only_tiled(_log2(c.programs)))
feature("occupancy", "programs resident per SM (shared memory and warp limits)", lambda c: c.only_tiled(c.occupancy))
feature("waves", "programs / (SMs x occupancy)", lambda c: c.only_tiled(c.waves))
feature("tail_fraction", "fill of the last wave (1 = full)",
        lambda c: c.only_tiled(np.where(c.waves % 1 == 0, 1.0, c.waves % 1)))
feature("wave_efficiency", "programs / (waves rounded up x slots)",
        lambda c: c.only_tiled(c.programs / (np.ceil(c.waves) * c.slots)))
feature("sm_fill", "fraction of SMs with at least one program", lambda c: c.only_tiled(np.minimum(c.programs / c.sm_count, 1)))
feature("pad_m", "wasted fraction of the padded M tiles", lambda c: c.only_tiled(1 - c.rows / (c.tiles_m * c.bm)))
feature("pad_n", "wasted fraction of the padded N tiles", lambda c: c.only_tiled(1 - c.n / (c.tiles_n * c.bn)))
feature("pad_k", "wasted fraction of the padded K slices", lambda c: c.only_tiled(1 - c.k / (c.k_per_split * c.sk)))
feature("k_iters", "K-loop iterations per program", lambda c: c.only_tiled(c.k_iters))
feature("m_fill", "rows / block_m (below 1: the tile is partly empty)", lambda c: c.only_tiled(c.rows / c.bm))
feature("acc_per_thread", "fp32 accumulators per thread", lambda c: c.only_tiled(c.bm * c.bn / (c.warps * 32)))
feature("smem_kb", "shared memory per program, KiB", lambda c: c.only_tiled(c.smem / 1024))
feature("log2_tile_flops", "log2 FLOPs per program", lambda c: c.only_tiled(_log2(2 * c.bm * c.bn * c.k_per_split)))
# -- derived: roofline -------------------------------------------------------
feature("log2_flops", "log2 2*M*N*K", lambda c: _log2(c.flops))
feature("log2_min_bytes", "log2 bytes that must move (inputs once, output once)", lambda c: _log2(c.min_bytes))
feature("log2_intensity", "log2 FLOPs per minimum byte", lambda c: _log2(c.flops / c.min_bytes))
feature("log2_t_compute_us", "log2 FLOPs / peak, us", lambda c: _log2(c.flops / c.peak * 1e6))
feature("log2_t_memory_us", "log2 minimum bytes / HBM bandwidth, us", lambda c: _log2(c.min_bytes / c.bw * 1e6))
feature("log2_t_roofline_us", "log2 max(compute, memory) time, us",
        lambda c: _log2(np.maximum(c.flops / c.peak, c.min_bytes / c.bw) * 1e6))
feature("log2_t_waves_us", "log2 waves x per-program compute time at per-SM peak, us",
        lambda c: c.only_tiled(_log2(np.ceil(c.waves) * c.occupancy * 2 * c.bm * c.bn * c.k_per_split
                                     / (c.peak / c.sm_count) * 1e6)))
feature("log2_traffic_bytes", "log2 operand bytes all programs load, plus split-K partials",
        lambda c: c.only_tiled(_log2(c.traffic)))
feature("traffic_over_l2", "operand traffic / L2 size", lambda c: c.only_tiled(c.traffic / (c.l2_mb * 2**20)))
feature("log2_t_traffic_us", "log2 traffic / HBM bandwidth, us", lambda c: c.only_tiled(_log2(c.traffic / c.bw * 1e6)))

FEATURE_NAMES = tuple(f.name for f in REGISTRY)


# Ops whose models predate per-op schema hashes: their hash is the shared one, so the
# shipped dense model stays valid.
_SHARED_HASH_OPS = ("gemm",)


def schema_hash(op: str = "gemm") -> str:
    """Hash of the version, the base columns and the feature names, for model manifests;
    per op: any other op's hash also covers its name and its extra features, so adding
    an op (or changing its features) never invalidates another op's model."""
    payload = {"version": FEATURE_VERSION, "base": BASE_COLUMNS, "features": FEATURE_NAMES}
    if op not in _SHARED_HASH_OPS:
        from gemm_costmodel import registry

        payload.update(op=op, extra=list(registry.get(op).extra_features))
        mod = op_features(op)
        if mod is not None:
            payload.update(inputs=list(mod.INPUTS), own=list(mod.NAMES))
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def op_features(op: str = "gemm"):
    """The op's own feature module (registry field ``features``: ``INPUTS``, ``NAMES``,
    ``compute(ctx, inputs)``, ``frame_inputs(df)``, ``problem_inputs(...)``), or None."""
    if op in _SHARED_HASH_OPS:
        return None
    from gemm_costmodel import registry

    return registry.get(op).features_module()


def feature_names(op: str = "gemm") -> tuple[str, ...]:
    """The model's input columns for an op: the shared features, then the op's own."""
    mod = op_features(op)
    return FEATURE_NAMES + (tuple(mod.NAMES) if mod is not None else ())


def compute(cols: Mapping[str, np.ndarray], op: str = "gemm") -> np.ndarray:
    """Feature matrix (rows, len(feature_names(op))), float32, from the base columns (plus the
    op's extra inputs, for an op with features of its own)."""
    missing = [c for c in BASE_COLUMNS if c not in cols]
    if missing:
        raise ValueError(f"missing base column {missing[0]!r}")
    mod = op_features(op)
    if mod is not None:
        missing = [c for c in mod.INPUTS if c not in cols]
        if missing:
            raise ValueError(f"missing {op} input column {missing[0]!r}")
    ctx = _Ctx(cols)
    extra = mod.compute(ctx, cols) if mod is not None else None
    width = len(REGISTRY) + (extra.shape[1] if extra is not None else 0)
    out = np.empty((ctx.n_rows, width), dtype=np.float32)
    for j, f in enumerate(REGISTRY):
        out[:, j] = f.fn(ctx)
    if extra is not None:
        out[:, len(REGISTRY):] = extra
    return out


def gpu_columns(spec: GpuSpec, dtype: str) -> dict:
    """The GPU base columns for one dtype."""
    return {"sm_count": spec.sm_count, "smem_per_sm_kb": spec.smem_per_sm_kb, "l2_mb": spec.l2_mb,
            "peak_tflops": spec.peak_tflops(dtype), "hbm_gbps": spec.hbm_gbps}


def problem_columns(m: int, n: int, k: int, dtype: str, spec: GpuSpec, variant_code, params: Mapping,
                    e: int = 1, top_k: int = 1) -> dict:
    """Base columns of one problem on one GPU against candidates given as arrays (or scalars)."""
    return {"m": m, "n": n, "k": k, "e": e, "top_k": top_k, "dtype_code": DTYPE_CODES[dtype],
            "variant_code": variant_code, **{p: params[p] for p in PARAMS}, **gpu_columns(spec, dtype)}


def frame_op(df) -> str:
    """The one op of a frame's rows ('gemm' without an op column); ValueError for several."""
    if "op" not in df.columns or len(df) == 0:
        return "gemm"
    ops = sorted(df["op"].astype(str).unique())
    if len(ops) != 1:
        raise ValueError(f"one op per feature matrix, got rows of {', '.join(ops)}")
    return ops[0]


def from_frame(df, spec_for: Callable[[str], GpuSpec]) -> np.ndarray:
    """Features of a dataset frame (columns of gemm_costmodel.data.dataset.SCHEMA)."""
    op = frame_op(df)
    cols = {c: df[c].to_numpy(dtype=np.float64) for c in ("m", "n", "k", "e", "top_k", *PARAMS)}
    dtypes = df["dtype"].astype(str).to_numpy()
    cols["dtype_code"] = np.array([DTYPE_CODES[d] for d in dtypes], dtype=np.float64)
    cols["variant_code"] = np.array([VARIANT_CODES[v] for v in df["variant"].astype(str)], dtype=np.float64)
    gpus = df["gpu_name"].astype(str).to_numpy()
    table = {}
    for g, d in set(zip(gpus, dtypes)):
        table[(g, d)] = gpu_columns(spec_for(g), d)
    for c in ("sm_count", "smem_per_sm_kb", "l2_mb", "peak_tflops", "hbm_gbps"):
        cols[c] = np.array([table[(g, d)][c] for g, d in zip(gpus, dtypes)], dtype=np.float64)
    mod = op_features(op)
    if mod is not None:
        cols.update(mod.frame_inputs(df))
    return compute(cols, op)
