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

from gemm_costmodel.kernels.hardware import GpuSpec
from gemm_costmodel.kernels.gemm.space import DTYPE_BYTES as IN_BYTES
from gemm_costmodel.kernels.gemm.space import OUT_DTYPE, VARIANT_CODES
from gemm_costmodel.kernels.gemm.space import PARAM_NAMES as PARAMS

FEATURE_VERSION = 2  # 2: variant codes 4-5 (swap-AB)

# fp8bs (code 4): the MoE op's block-scaled fp8 (1-byte inputs, bf16 output). A new code leaves every
# existing row's features and the schema hash as they were (the hash covers the feature names, not
# the codes), so models trained before it keep loading; only rows of that dtype carry 4.
DTYPE_CODES = {"bf16": 0, "fp16": 1, "fp8": 2, "fp32": 3, "fp8bs": 4}
_BLOCK_FP8 = {"fp8bs": "fp8"}  # element sizes as the dtype it block-scales
OUT_BYTES = {d: IN_BYTES[OUT_DTYPE[d]] for d in IN_BYTES}

_IN_B = [float(IN_BYTES[_BLOCK_FP8.get(d, d)]) for d in DTYPE_CODES]
_OUT_B = [float(OUT_BYTES[_BLOCK_FP8.get(d, d)]) for d in DTYPE_CODES]
# Per-row numeric inputs every feature is computed from.
BASE_COLUMNS = ("m", "n", "k", "e", "top_k", "dtype_code", "variant_code", *PARAMS,
                "sm_count", "smem_per_sm_kb", "l2_mb", "peak_tflops", "hbm_gbps")


# What a feature reads, which decides where the runtime computes it (``CandidateFeatures``):
# "problem": the problem (M, N, K, E, top_k, dtype) and the GPU only: one value per decision;
# "config": the candidate's config, its dtype and the GPU only: computed once per candidate table;
# "both": anything (the default). Training computes every feature on every row the same way.
USES = ("problem", "config", "both")


@dataclass(frozen=True)
class Feature:
    name: str
    doc: str
    fn: Callable[["_Ctx"], np.ndarray]
    uses: str = "both"
    # fn is only_tiled(log2(arg)) where tiled_only / log2 say so (``feature``); the runtime
    # evaluates arg and applies the log2s and the vendor zeroing of many features in one step each.
    tiled_only: bool = False
    log2: bool = False
    arg: Callable[["_Ctx"], np.ndarray] | None = None


REGISTRY: list[Feature] = []


def feature(name: str, doc: str, fn: Callable[["_Ctx"], np.ndarray], uses: str = "both",
            tiled_only: bool = False, log2: bool = False) -> None:
    """Register a feature; registration order is the column order. ``uses`` says what it reads
    (USES); a wrong "problem" or "config" label would make the runtime's cached columns differ
    from training's: tests/test_features.py checks both paths for equality. ``log2``: the feature
    is ``_log2(fn(c))``. ``tiled_only``: the feature describes a tile and is 0 on vendor rows (the
    value, after the log2, is zeroed there). Training evaluates the composed function per
    feature; the runtime (``CandidateFeatures``) evaluates fn per feature and the log2s and the
    zeroing once per block of features: the same elementwise operations, so the same values."""
    if any(f.name == name for f in REGISTRY):
        raise ValueError(f"feature {name!r} registered twice")
    if uses not in USES:
        raise ValueError(f"feature {name!r}: uses must be one of {', '.join(USES)}, got {uses!r}")
    full = fn
    if log2:
        full = (lambda a: lambda c: _log2(a(c)))(full)
    if tiled_only:
        full = (lambda a: lambda c: c.only_tiled(a(c)))(full)
    REGISTRY.append(Feature(name, doc, full, uses, tiled_only, log2, fn))


class cached_property:  # noqa: N801 - functools' own name and use
    """functools.cached_property without its per-instance lock (Python < 3.12 takes one on every
    first access, a large share of a cold decision's feature time). A _Ctx is never shared
    between threads."""

    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


# _Ctx quantities that read only the config, its dtype and the GPU (like "config" features):
# CandidateFeatures computes them once per table.
CONFIG_QUANTITIES = ("is_vendor", "tiled", "bm", "bn", "bk", "sk", "warps", "stages", "smem", "occupancy",
                     "slots", "tile_edge", "tile_mn2", "partials_per_output", "edge_bytes", "occ_tile_mn2")


class _Ctx:
    """Base columns as float64 arrays plus derived quantities shared by several features.

    Everything is computed on first use (``cached_property``; base columns through
    ``__getattr__``): the runtime evaluates a few features at a time (``CandidateFeatures``), and
    a quantity no requested feature reads is never computed."""

    def __init__(self, cols: Mapping[str, np.ndarray], n_rows: int | None = None):
        # Columns stay as given: a scalar (one shape, many candidates at runtime) is
        # computed once and broadcast at the end, which halves the runtime cost.
        self._cols = cols
        self.n_rows = max(np.size(v) for v in cols.values()) if n_rows is None else n_rows

    def __getattr__(self, name):
        # Only reached for names not set yet: the base columns, converted once.
        cols = self.__dict__.get("_cols")
        if cols is None or name not in BASE_COLUMNS:
            raise AttributeError(name)
        v = np.asarray(cols[name], dtype=np.float64)
        self.__dict__[name] = v
        return v

    @cached_property
    def _dc(self):
        return self.dtype_code.astype(np.int64)

    @cached_property
    def in_b(self):
        return np.asarray(_IN_B)[self._dc]

    @cached_property
    def out_b(self):
        return np.asarray(_OUT_B)[self._dc]

    @cached_property
    def is_vendor(self):
        return self.variant_code.astype(np.int64) == VARIANT_CODES["vendor"]

    @cached_property
    def tiled(self):
        return ~self.is_vendor

    @cached_property
    def _one(self):
        return np.ones(np.shape(self.variant_code))

    # Vendor rows have no tile: use 1s so the arithmetic stays finite, then zero the results.
    @cached_property
    def bm(self):
        return np.where(self.tiled, self.block_m, self._one)

    @cached_property
    def bn(self):
        return np.where(self.tiled, self.block_n, self._one)

    @cached_property
    def bk(self):
        return np.where(self.tiled, self.block_k, self._one)

    @cached_property
    def sk(self):
        return np.where(self.tiled, np.maximum(self.split_k, 1), self._one)

    @cached_property
    def warps(self):
        return np.where(self.tiled, self.num_warps, 4 * self._one)

    @cached_property
    def stages(self):
        return np.where(self.tiled, self.num_stages, self._one)

    # Experts: a dense GEMM is E=1, top_k=1; a grouped GEMM does top_k*M rows over E weights.
    @cached_property
    def rows(self):
        return self.m * self.top_k

    @cached_property
    def tiles_m(self):
        return np.ceil(self.rows / self.bm)

    @cached_property
    def tiles_n(self):
        return np.ceil(self.n / self.bn)

    @cached_property
    def k_per_split(self):
        return np.ceil(np.ceil(self.k / self.bk) / self.sk) * self.bk

    @cached_property
    def k_iters(self):
        return self.k_per_split / self.bk

    @cached_property
    def programs(self):
        return self.tiles_m * self.tiles_n * self.sk

    @cached_property
    def smem(self):
        return self.stages * (self.bm + self.bn) * self.bk * self.in_b

    @cached_property
    def occupancy(self):
        occ_smem = np.floor(self.smem_per_sm_kb * 1024 / np.maximum(self.smem, 1))
        occ_warps = np.floor(64 / self.warps)
        return np.clip(np.minimum(occ_smem, occ_warps), 1, 32)

    @cached_property
    def slots(self):
        return self.sm_count * self.occupancy

    @cached_property
    def waves(self):
        return self.programs / self.slots

    @cached_property
    def flops(self):
        return 2.0 * self.rows * self.n * self.k

    @cached_property
    def min_bytes(self):
        return (self.rows * self.k + self.e * self.n * self.k) * self.in_b + self.rows * self.n * self.out_b

    @cached_property
    def peak(self):
        return self.peak_tflops * 1e12

    @cached_property
    def bw(self):
        return self.hbm_gbps * 1e9

    # Config-only parts of the formulas below (CONFIG_QUANTITIES: once per table at run time), each
    # the same operations in the same order as written out in the formula, so the same values.
    @cached_property
    def tile_edge(self):
        return self.bm + self.bn

    @cached_property
    def tile_mn2(self):
        return 2 * self.bm * self.bn

    @cached_property
    def partials_per_output(self):
        # fp32 partials written and read per output element and split (0 without split-K): 0 * x
        # adds +0.0 to a positive traffic, which leaves it unchanged, as np.where(split, x, 0) did.
        return np.where(self.sk > 1, 2 * self.sk, 0.0)

    # Products of integers below 2**53 are exact in float64 in any order, so the config-only and
    # the problem-only factors are grouped (fewer array operations per decision, issue 18) with
    # the same values as the formula written left to right.
    @cached_property
    def edge_bytes(self):
        return self.tile_edge * self.in_b

    @cached_property
    def occ_tile_mn2(self):
        return self.occupancy * self.tile_mn2

    @cached_property
    def traffic(self):
        return (self.programs * self.edge_bytes * self.k_per_split
                + self.partials_per_output * (self.rows * self.n * 4))

    @cached_property
    def full_waves(self):
        return np.ceil(self.waves)

    @cached_property
    def waves_frac(self):
        return self.waves % 1

    def only_tiled(self, x):
        return np.where(self.tiled, x, 0.0)


def _log2(x):
    return np.log2(np.maximum(x, 1e-30))


# -- raw inputs ------------------------------------------------------------
feature("log2_m", "log2 rows of x (tokens)", lambda c: c.m, uses="problem", log2=True)
feature("log2_n", "log2 output features", lambda c: c.n, uses="problem", log2=True)
feature("log2_k", "log2 reduction dim", lambda c: c.k, uses="problem", log2=True)
feature("e", "experts (1 = dense)", lambda c: c.e, uses="problem")
feature("top_k", "experts per token (1 = dense)", lambda c: c.top_k, uses="problem")
feature("dtype_code", "input dtype code (DTYPE_CODES)", lambda c: c.dtype_code, uses="problem")
feature("in_bytes", "input element bytes", lambda c: c.in_b, uses="problem")
feature("variant_code", "kernel variant code (VARIANT_CODES)", lambda c: c.variant_code, uses="config")
feature("is_vendor", "vendor library (cuBLAS)", lambda c: c.is_vendor.astype(np.float64), uses="config")
for _p in PARAMS:
    feature(_p, f"config parameter {_p} (0 = n/a)", (lambda p: lambda c: getattr(c, p))(_p), uses="config")
# -- the GPU, as numbers -----------------------------------------------------
feature("sm_count", "streaming multiprocessors", lambda c: c.sm_count, uses="problem")
feature("smem_per_sm_kb", "shared memory per SM, KiB", lambda c: c.smem_per_sm_kb, uses="problem")
feature("l2_mb", "L2 cache, MiB", lambda c: c.l2_mb, uses="problem")
feature("peak_tflops", "dense tensor-core peak for the dtype, TFLOP/s", lambda c: c.peak_tflops, uses="problem")
feature("hbm_gbps", "HBM bandwidth, GB/s", lambda c: c.hbm_gbps, uses="problem")
# -- derived: work decomposition ----------------------------------------------
feature("tiles_m", "output tiles along M", lambda c: c.tiles_m, tiled_only=True)
feature("tiles_n", "output tiles along N", lambda c: c.tiles_n, tiled_only=True)
feature("log2_programs", "log2 programs (tiles x split-K)", lambda c: c.programs, tiled_only=True, log2=True)
feature("occupancy", "programs resident per SM (shared memory and warp limits)",
        lambda c: c.occupancy, uses="config", tiled_only=True)
feature("waves", "programs / (SMs x occupancy)", lambda c: c.waves, tiled_only=True)
feature("tail_fraction", "fill of the last wave (1 = full)",
        lambda c: np.where(c.waves_frac == 0, 1.0, c.waves_frac), tiled_only=True)
feature("wave_efficiency", "programs / (waves rounded up x slots)",
        lambda c: c.programs / (c.full_waves * c.slots), tiled_only=True)
feature("sm_fill", "fraction of SMs with at least one program",
        lambda c: np.minimum(c.programs / c.sm_count, 1), tiled_only=True)
feature("pad_m", "wasted fraction of the padded M tiles", lambda c: 1 - c.rows / (c.tiles_m * c.bm), tiled_only=True)
feature("pad_n", "wasted fraction of the padded N tiles", lambda c: 1 - c.n / (c.tiles_n * c.bn), tiled_only=True)
feature("pad_k", "wasted fraction of the padded K slices", lambda c: 1 - c.k / (c.k_per_split * c.sk), tiled_only=True)
feature("k_iters", "K-loop iterations per program", lambda c: c.k_iters, tiled_only=True)
feature("m_fill", "rows / block_m (below 1: the tile is partly empty)", lambda c: c.rows / c.bm, tiled_only=True)
feature("acc_per_thread", "fp32 accumulators per thread",
        lambda c: c.bm * c.bn / (c.warps * 32), uses="config", tiled_only=True)
feature("smem_kb", "shared memory per program, KiB", lambda c: c.smem / 1024, uses="config", tiled_only=True)
feature("log2_tile_flops", "log2 FLOPs per program", lambda c: c.tile_mn2 * c.k_per_split,
        tiled_only=True, log2=True)
# -- derived: roofline -------------------------------------------------------
feature("log2_flops", "log2 2*M*N*K", lambda c: c.flops, uses="problem", log2=True)
feature("log2_min_bytes", "log2 bytes that must move (inputs once, output once)",
        lambda c: c.min_bytes, uses="problem", log2=True)
feature("log2_intensity", "log2 FLOPs per minimum byte", lambda c: c.flops / c.min_bytes, uses="problem",
        log2=True)
feature("log2_t_compute_us", "log2 FLOPs / peak, us", lambda c: c.flops / c.peak * 1e6, uses="problem",
        log2=True)
feature("log2_t_memory_us", "log2 minimum bytes / HBM bandwidth, us",
        lambda c: c.min_bytes / c.bw * 1e6, uses="problem", log2=True)
feature("log2_t_roofline_us", "log2 max(compute, memory) time, us",
        lambda c: np.maximum(c.flops / c.peak, c.min_bytes / c.bw) * 1e6, uses="problem", log2=True)
feature("log2_t_waves_us", "log2 waves x per-program compute time at per-SM peak, us",
        lambda c: c.full_waves * c.occ_tile_mn2 * c.k_per_split / (c.peak / c.sm_count) * 1e6,
        tiled_only=True, log2=True)
feature("log2_traffic_bytes", "log2 operand bytes all programs load, plus split-K partials",
        lambda c: c.traffic, tiled_only=True, log2=True)
feature("traffic_over_l2", "operand traffic / L2 size", lambda c: c.traffic / (c.l2_mb * 2**20), tiled_only=True)
feature("log2_t_traffic_us", "log2 traffic / HBM bandwidth, us",
        lambda c: c.traffic / c.bw * 1e6, tiled_only=True, log2=True)

FEATURE_NAMES = tuple(f.name for f in REGISTRY)


# Ops whose models predate per-op schema hashes: their hash is the shared one, so the
# shipped dense model stays valid.
_SHARED_HASH_OPS = ("gemm",)


def schema_hash(op: str) -> str:
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


def op_features(op: str):
    """The op's own feature module (registry field ``features``: ``INPUTS``, ``NAMES``,
    ``compute(ctx, inputs)``, ``frame_inputs(df)``, ``problem_inputs(...)``), or None."""
    if op in _SHARED_HASH_OPS:
        return None
    from gemm_costmodel import registry

    return registry.get(op).features_module()


def feature_names(op: str) -> tuple[str, ...]:
    """The model's input columns for an op: the shared features, then the op's own."""
    mod = op_features(op)
    return FEATURE_NAMES + (tuple(mod.NAMES) if mod is not None else ())


def compute(cols: Mapping[str, np.ndarray], op: str) -> np.ndarray:
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
    # Filled a feature at a time into a (features, rows) buffer: a contiguous row per feature is
    # far cheaper to write than a strided column; the transpose is a view.
    out = np.empty((width, ctx.n_rows), dtype=np.float32)
    for j, f in enumerate(REGISTRY):
        out[j] = f.fn(ctx)
    if extra is not None:
        out[len(REGISTRY):] = extra.T
    return np.ascontiguousarray(out.T)


# _Ctx quantities that read only the dtype and the GPU: CandidateFeatures keeps them as scalars.
TABLE_SCALARS = ("dtype_code", "sm_count", "smem_per_sm_kb", "l2_mb", "peak_tflops", "hbm_gbps", "_dc", "in_b",
                 "out_b", "peak", "bw")


def _scalar(v):
    """A 0-d array as its numpy scalar (same value): an operation on a numpy scalar costs about a
    tenth of one on a 0-d array, and a decision's problem quantities are all scalars."""
    return v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v


def _log2_inplace(block: np.ndarray) -> None:
    """``_log2`` of a contiguous block, in place: the same two ufuncs, elementwise."""
    np.maximum(block, 1e-30, out=block)
    np.log2(block, out=block)


class CandidateFeatures:
    """The runtime's feature rows of one candidate table (one op, dtype and GPU), equal to
    ``compute`` on the same base columns, computed in three parts:

    - "config" features (USES) of every candidate once, here;
    - "problem" features once per decision, as numpy scalars (not 0-d arrays), then broadcast;
    - "both" features over the decision's candidates only.

    A cold decision then evaluates about a third of the features over its candidates, which is
    what its time goes to (issue 18: the cold decision on the GPU host). Per decision, the cost
    is the number of numpy calls, not their size (~150 candidates): so the config features and
    every per-candidate input of the context (CONFIG_QUANTITIES) sit in one array, gathered in
    one call; the dtype's and the GPU's quantities (TABLE_SCALARS) are scalars computed once; each
    feature's ``arg`` is evaluated alone, but the log2 of all "log2" features of a part is one
    call over a contiguous block, and the vendor rows of the tiled-only features are zeroed in one
    call. Ops with features of their own (``op_features``) compute those over the candidates as
    in ``compute``.

    params: {PARAMS name: array over the table}, variant_code: array over the table."""

    def __init__(self, params: Mapping[str, np.ndarray], variant_code: np.ndarray, dtype: str, spec: GpuSpec,
                 op: str):
        self.op, self.dtype, self.spec = op, dtype, spec
        self._mod = op_features(op)
        params = {p: np.asarray(params[p], dtype=np.float64) for p in PARAMS}
        variant = np.asarray(variant_code, dtype=np.float64)
        n = len(variant)
        # Any problem will do: "config" features, CONFIG_QUANTITIES and TABLE_SCALARS do not read it.
        ctx = _Ctx(problem_columns(1, 1, 1, dtype, spec, variant, params))
        self._scalars = {q: _scalar(getattr(ctx, q)) for q in TABLE_SCALARS}
        pos = {f.name: j for j, f in enumerate(REGISTRY)}
        cfg = [f for f in REGISTRY if f.uses == "config"]
        # A tiled-only feature varies over the candidates (it is 0 on vendor rows): never a scalar.
        prob = [f for f in REGISTRY if f.uses == "problem" and not f.tiled_only]
        both = [f for f in REGISTRY if f.uses != "config" and f.name not in {g.name for g in prob}]
        # The log2 features first in each part: their log2 is one call over the leading rows.
        prob.sort(key=lambda f: not f.log2)
        both.sort(key=lambda f: not f.log2)
        self._config_cols = np.array([pos[f.name] for f in cfg], dtype=np.intp)
        self._problem_cols = np.array([pos[f.name] for f in prob], dtype=np.intp)
        self._problem_args = [f.arg for f in prob]
        self._problem_nlog = sum(f.log2 for f in prob)
        self._both_cols = np.array([pos[f.name] for f in both], dtype=np.intp)
        self._both_args = [f.arg for f in both]
        self._both_nlog = sum(f.log2 for f in both)
        tiled_rows = [r for r, f in enumerate(both) if f.tiled_only]
        # None: every "both" feature is tiled-only (the shipped registry), zeroed in one call.
        self._both_tiled = None if len(tiled_rows) == len(both) else np.array(tiled_rows, dtype=np.intp)
        # Per candidate: the config features' values, then the context's per-candidate inputs.
        self._names = (*PARAMS, "variant_code", *(q for q in CONFIG_QUANTITIES if q not in ("is_vendor", "tiled")))
        rows = [f.fn(ctx) for f in cfg] + [getattr(ctx, q) for q in self._names]
        self._stack = np.stack([np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)) for v in rows])
        self._nc = len(cfg)
        self._is_vendor = np.asarray(ctx.is_vendor, dtype=bool)
        self._tiled = ~self._is_vendor
        self.width = len(REGISTRY) + (len(self._mod.NAMES) if self._mod is not None else 0)

    def matrix(self, idx: np.ndarray, m: int, n: int, k: int, e: int = 1, top_k: int = 1,
               extra_inputs: Mapping | None = None) -> np.ndarray:
        """Feature rows (len(idx), width), float32, of the candidates idx (table indices) for one
        problem; extra_inputs: the op's own inputs (``op_features(op).problem_inputs``)."""
        idx = np.asarray(idx, dtype=np.intp)
        rows = len(idx)
        g = self._stack.take(idx, axis=1)
        # float64 rows, one conversion to float32 at the end (as compute's per-row casts round).
        out = np.empty((self.width, rows))
        out[self._config_cols] = g[:self._nc]
        ctx = _Ctx.__new__(_Ctx)  # no base columns: every input is set here, a missing one raises
        d = ctx.__dict__
        d.update(self._scalars)
        d.update(zip(self._names, g[self._nc:]))
        vendor = d["is_vendor"] = self._is_vendor[idx]
        d["tiled"] = self._tiled[idx]
        d.update(m=np.float64(m), n=np.float64(n), k=np.float64(k), e=np.float64(e), top_k=np.float64(top_k),
                 n_rows=rows)
        # The problem's features: one value each.
        pv = np.array([a(ctx) for a in self._problem_args], dtype=np.float64)
        _log2_inplace(pv[:self._problem_nlog])
        out[self._problem_cols] = pv[:, None]
        block = np.empty((len(self._both_args), rows))
        for r, a in enumerate(self._both_args):
            block[r] = a(ctx)
        _log2_inplace(block[:self._both_nlog])
        if self._both_tiled is None:
            np.copyto(block, 0.0, where=vendor)
        else:
            block[self._both_tiled] = np.where(vendor, 0.0, block[self._both_tiled])
        out[self._both_cols] = block
        if self._mod is not None:
            out[len(REGISTRY):] = self._mod.compute(ctx, extra_inputs or {}).T
        return out.T.astype(np.float32, order="C")


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
    """The one op of a frame's rows (rows without an op column: registry.LEGACY_OP's); ValueError
    for several."""
    if "op" not in df.columns or len(df) == 0:
        from gemm_costmodel import registry

        return registry.LEGACY_OP
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
