"""The benchmark dataset: schema, parquet build from harness shards, validating loader.

One row per (shape, candidate) measurement, long format. ``load_dataset``
validates every file against SCHEMA and rejects bad data with a message that
names the file and the column; it then merges duplicate measurements of the
same key by their median and returns a typed frame.
"""
from __future__ import annotations

import functools
import glob
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gemm_costmodel import registry

from .health import STATUS_ORDER, health

# out_of_memory: the device had no memory for the shape's operands or workspace (another
# process held it); a failure of the sweep, not of the config. See demote_oom_eval_shapes.
STATUSES = ("ok", "wrong", "compile_error", "out_of_resources", "out_of_memory", "crash", "unsupported")
# fp8bs: the MoE op's block-scaled fp8 (kernels/moe/space.py).
DTYPES = ("bf16", "fp16", "fp8", "fp32", "fp8bs")
SOURCES = ("harness", "csv", "vllm")

# column -> (kind, description with unit). kind: int, float, bool, str.
# The shared columns, then the columns the ops declare (registry.columns(): e.g. the MoE op's E,
# top_k, stage, routing and routing statistics), then the shared rest; the order is the files'.
SCHEMA: dict[str, tuple[str, str]] = {
    "op": ("str", "operation: gemm (dense) or fused_moe"),
    "m": ("int", "rows of x / tokens"),
    "n": ("int", "output features (rows of the weight)"),
    "k": ("int", "reduction dim"),
    **{c: (kind, doc) for c, (kind, doc, _) in registry.columns().items()},
    "dtype": ("str", "input dtype: bf16, fp16, fp8 (e4m3, bf16 out), fp32"),
    "candidate": ("str", "config id (kernels/gemm/space.py) or 'cublas'"),
    "variant": ("str", "tiled, splitk, persistent, vendor (or the foreign kernel family)"),
    "block_m": ("int", "tile rows (0 = n/a)"),
    "block_n": ("int", "tile cols (0 = n/a)"),
    "block_k": ("int", "tile depth (0 = n/a)"),
    "group_m": ("int", "grouped-order rows (0 = n/a)"),
    "split_k": ("int", "K slices (1 = none, 0 = n/a)"),
    "num_warps": ("int", "warps per program (0 = n/a)"),
    "num_stages": ("int", "software pipeline depth (0 = n/a)"),
    "status": ("str", "ok, wrong, compile_error, out_of_resources, out_of_memory, crash"),
    "p20_us": ("float", "20th percentile latency, microseconds"),
    "p50_us": ("float", "median latency, microseconds"),
    "p80_us": ("float", "80th percentile latency, microseconds"),
    "stable": ("bool", "(p80 - p20) / p50 <= 5%"),
    "eval_shape": ("bool", "every feasible candidate of this shape was measured"),
    "source": ("str", "harness, csv (costmodel import), vllm (tuned tables, winners only)"),
    "arch": ("str", "GPU arch tag, e.g. sm90"),
    "gpu_name": ("str", "GPU name"),
    "gpu_uuid": ("str", "GPU UUID ('unknown' for imports)"),
    "sm_count": ("int", "streaming multiprocessors (0 = unknown)"),
    "driver": ("str", "driver version"),
    "torch_version": ("str", "torch version"),
    "triton_version": ("str", "triton version"),
    "git_sha": ("str", "commit of the measuring code"),
    "timestamp": ("str", "UTC ISO 8601 time of the measurement"),
    "family": ("str", "model family of the first origin ('user' for custom shapes)"),
    "origins": ("str", "family/model/layer/tpN origins, ';'-separated"),
    "rel_err": ("float", "relative Frobenius error vs the fp32 reference (NaN if not run)"),
    "error": ("str", "failure detail ('' when ok)"),
    "n_samples": ("int", "timed CUDA-graph replays"),
    "n_inner": ("int", "launches per replay"),
    "n_copies": ("int", "rotating input copies (L2 policy)"),
    "l2_policy": ("str", "'rotate': inputs rotate over >= 2x L2 of copies; 'rotate_experts' (MoE): copies "
                          "share the weights on shifted experts and span >= 2x L2 of what a launch reads"),
    "seed": ("int", "sweep seed (inputs and candidate sampling)"),
    "suite": ("str", "name of the sweep that measured the row"),
}
OPTIONAL_DEFAULTS = {"op": registry.LEGACY_OP, **{c: v for c, (_, _, v) in registry.columns().items()},
                     "source": "harness", "family": "user", "origins": "",
                     "rel_err": float("nan"), "error": "", "n_samples": 0, "n_inner": 0, "n_copies": 0,
                     "l2_policy": "", "seed": 0, "suite": ""}
# Two GPUs of one arch (H100, H200: both sm90) are different machines to the cost
# model, so their measurements are never merged.
SHAPE_KEY = ["arch", "gpu_name", "op"] + registry.shape_columns()
KEY = SHAPE_KEY + ["candidate"]
MAX_FILE_BYTES = 50 * 2**20
# Config parameters (0 = n/a). A Triton candidate always has a tile, warps and stages;
# group_m and split_k are per variant (see kernels/gemm/space.config_params).
PARAM_COLS = ("block_m", "block_n", "block_k", "group_m", "split_k", "num_warps", "num_stages")
TRITON_REQUIRED = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
# Counts where 0 means unknown or n/a and a negative value means a broken writer.
COUNT_COLS = PARAM_COLS + ("sm_count", "n_samples", "n_inner", "n_copies") + tuple(
    c for c, (kind, _, _) in registry.columns().items() if kind == "int" and c not in registry.problem_columns())
# Problem columns of integers: sizes and counts, all >= 1.
_POSITIVE = tuple(c for c in registry.problem_columns() if registry.column_kind(c) == "int")


def schema_hash() -> str:
    """Hash of the column names and kinds, for manifests."""
    import hashlib

    return hashlib.sha256(json.dumps(sorted((k, v[0]) for k, v in SCHEMA.items())).encode()).hexdigest()[:16]


class DataError(ValueError):
    """Bad benchmark data; the message names the file and the column."""


def _read_jsonl(path: str) -> pd.DataFrame:
    from gemm_costmodel.rows import RowsError, read_rows

    try:
        # Strict: a shard going into the dataset must be whole; even a torn last line
        # means it was copied while a sweep was still writing it.
        return pd.DataFrame(read_rows([path], strict=True))
    except RowsError as exc:
        raise DataError(str(exc)) from None


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Fill optional columns with their defaults and keep the schema's columns, in order."""
    df = df.copy()
    for col, default in OPTIONAL_DEFAULTS.items():
        if col not in df.columns:
            df[col] = default
    return df[[c for c in SCHEMA if c in df.columns]]


def validate(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Check one file's frame against SCHEMA; returns it typed. Raises DataError."""
    missing = [c for c in SCHEMA if c not in df.columns]
    if missing:
        raise DataError(f"{name}: missing column {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if len(df) == 0:
        raise DataError(f"{name}: no rows")
    out = df[list(SCHEMA)].copy()
    for col, (kind, _) in SCHEMA.items():
        s = out[col]
        try:
            if kind == "int":
                if s.isna().any():
                    raise ValueError("missing values")
                num = pd.to_numeric(s, errors="raise")
                if not np.all(np.mod(num, 1) == 0):
                    raise ValueError("non-integer values")
                out[col] = num.astype("int64")
            elif kind == "float":
                out[col] = pd.to_numeric(s, errors="raise").astype("float64")
            elif kind == "bool":
                if s.isna().any():
                    raise ValueError("missing values")
                out[col] = s.astype(bool)
            else:
                out[col] = s.fillna("").astype(str)
        except (ValueError, TypeError) as exc:
            raise DataError(f"{name}: column {col!r}: {exc}") from None
    for col in _POSITIVE:
        bad = out[col] <= 0
        if bad.any():
            raise DataError(f"{name}: column {col!r}: non-positive value {int(out.loc[bad, col].iloc[0])} "
                            f"in row {_first(bad)}")
    # Rules across an op's columns (registry frame_check, e.g. the MoE op's top_k <= E).
    for spec in registry.REGISTRY.values():
        if spec.frame_check:
            bad = registry._resolve(spec.frame_check)({c: out[c].to_numpy() for c in spec.columns})
            if bad is not None:
                col, i, what = bad
                raise DataError(f"{name}: column {col!r}: {what} in row {i}")
    for col, allowed in (("dtype", DTYPES), ("status", STATUSES), ("source", SOURCES)):
        bad = ~out[col].isin(allowed)
        if bad.any():
            raise DataError(f"{name}: column {col!r}: unknown value {out.loc[bad, col].iloc[0]!r} "
                            f"(allowed: {', '.join(allowed)})")
    _check_times(out, name)
    out = _repair_params(out)
    _check_params(out, name)
    return out


def _first(mask) -> int:
    """Position of the first True of a boolean mask (the row number in messages)."""
    return int(np.flatnonzero(np.asarray(mask))[0])


def _check_times(out: pd.DataFrame, name: str) -> None:
    ok = out["status"] == "ok"
    # Winners-only tables (vLLM) carry no latency; everything else must.
    timed = ok & (out["source"] != "vllm")
    for col in ("p20_us", "p50_us", "p80_us"):
        t = out[col]
        # NaN is how a failed row says 'not timed'; infinity is no time at all, and
        # would reach XGBoost as a label (log2(inf)) and fail there.
        bad = np.isinf(t)
        if bad.any():
            raise DataError(f"{name}: column {col!r}: infinite time {t.iat[_first(bad)]} in row {_first(bad)}")
        if (t < 0).any():
            raise DataError(f"{name}: column {col!r}: negative time {t[t < 0].iloc[0]} in row {_first(t < 0)}")
        if t[timed].isna().any():
            raise DataError(f"{name}: column {col!r}: NaN time on a row with status 'ok' "
                            f"(row {_first(timed & t.isna())})")
        if (t[timed] == 0).any():
            raise DataError(f"{name}: column {col!r}: zero time on a row with status 'ok' "
                            f"(row {_first(timed & (t == 0))})")
    # Percentiles of one set of replays are ordered; comparisons with NaN are False.
    for lo, hi in (("p20_us", "p50_us"), ("p50_us", "p80_us")):
        bad = out[lo] > out[hi]
        if bad.any():
            i = _first(bad)
            raise DataError(f"{name}: column {lo!r}: {lo} {out[lo].iat[i]} > {hi} {out[hi].iat[i]} in row {i}")


@functools.lru_cache(maxsize=4096)
def _id_params(cid: str) -> dict | None:
    """{variant, *PARAM_COLS} of a config id of this project, None for any other id."""
    from gemm_costmodel.kernels.gemm.space import config_from_id, config_params

    try:
        cfg = config_from_id(cid)
    except ValueError:
        return None
    return {"variant": cfg.variant, **config_params(cfg)}


@functools.lru_cache(maxsize=16384)
def _op_id_params(op: str, cid: str) -> dict | None:
    """{variant, *PARAM_COLS} of a config id in op's own space, None for an id it does not know."""
    from gemm_costmodel import registry

    try:
        spec = registry.get(op)
        cfg = spec.config_from_id(cid)
    except ValueError:
        return None
    return {"variant": cfg.variant, **spec.space_module().config_params(cfg)}


def _repair_params(out: pd.DataFrame) -> pd.DataFrame:
    """Harness rows of ops other than gemm get their parameter columns from the candidate id in the
    op's own space. Until the harness wrote each op's own view (config_params of its space), it wrote
    the dense op's: fp8_blockscale rows carry split_k 0 on tiled configs and group_m 0 on split-K /
    swap-AB configs where the op's runtime computes 1, and the features must be the runtime's."""
    from gemm_costmodel import registry

    sel = (out["source"] == "harness") & (out["op"] != "gemm") & out["op"].isin(registry.names())
    if not sel.any():
        return out
    combos = out.loc[sel, ["op", "candidate"]].drop_duplicates()
    rows = []
    for op, cid in combos.itertuples(index=False):
        want = _op_id_params(str(op), str(cid))
        if want is not None:
            rows.append({"op": op, "candidate": cid, **{c: want[c] for c in PARAM_COLS}})
    if not rows:
        return out
    table = pd.DataFrame(rows).set_index(["op", "candidate"])
    idx = pd.MultiIndex.from_frame(out.loc[sel, ["op", "candidate"]])
    hit = idx.isin(table.index)
    if not hit.any():
        return out
    out = out.copy()
    where = np.flatnonzero(sel.to_numpy())[hit]
    vals = table.loc[idx[hit]]
    for c in PARAM_COLS:
        out.iloc[where, out.columns.get_loc(c)] = vals[c].to_numpy(dtype=np.int64)
    return out


def _check_params(out: pd.DataFrame, name: str) -> None:
    """Config parameters: never negative; set on Triton candidates of the harness; and, for a
    config id of this project, equal to what the id says (features are computed from them)."""
    for col in COUNT_COLS:
        bad = out[col] < 0
        if bad.any():
            raise DataError(f"{name}: column {col!r}: negative value {out[col].iat[_first(bad)]} in row {_first(bad)}")
    harness = out["source"] == "harness"
    triton = harness & (out["variant"] != "vendor")
    for col in TRITON_REQUIRED:
        bad = triton & (out[col] < 1)
        if bad.any():
            i = _first(bad)
            raise DataError(f"{name}: column {col!r}: {out[col].iat[i]} on Triton candidate "
                            f"{out['candidate'].iat[i]!r} in row {i} (must be >= 1)")
    # Imported rows may name foreign kernels (variant 'foreign', vLLM's own ids); a harness
    # row of a dense GEMM was measured from this project's config space. Checked once per
    # distinct (candidate, parameters): a file has a few hundred, against ~10^4 rows.
    cols = ["candidate", "variant", *PARAM_COLS]
    combos = out[cols].reset_index(drop=True)
    combos = combos.assign(need_id=(harness & (out["op"] == "gemm")).to_numpy()).drop_duplicates(cols + ["need_id"])
    for i, r in zip(combos.index, combos.itertuples(index=False)):
        want = _id_params(r.candidate)
        if want is None:
            if r.need_id:
                raise DataError(f"{name}: column 'candidate': unknown config id {r.candidate!r} in row {i} "
                                "(a harness row of op gemm needs an id of kernels/gemm/space.py)")
            continue
        for col in ("variant", *PARAM_COLS):
            if getattr(r, col) != want[col]:
                raise DataError(f"{name}: column {col!r}: {getattr(r, col)} in row {i} disagrees with candidate "
                                f"{r.candidate!r} (its {col} is {want[col]})")


def read_file(path: str) -> pd.DataFrame:
    """One data file (parquet, JSONL or JSONL.gz), normalised and validated."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else _read_jsonl(path)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a data error
        raise DataError(f"{path}: unreadable: {type(exc).__name__}: {exc}") from None
    return validate(normalize(df), path)


# L2 policies whose rows replace, shape by shape, the rows of every other policy, on shapes with
# M <= SUPERSEDE_MAX_M only. The first MoE copies left a decode stage's few experts hot in L2
# (M <= 4: every such problem was measured again whole with expert-rotating copies); from M = 16
# on, a stage reads most experts and both policies' copies span over 2x L2, so the rows of either
# policy time the same thing and sit side by side. Superseding there too had made each training
# problem's model-guided picks replace its random sample, leaving only good configs to rank: with
# picks on every problem (MoE round 3), leave-family-out got worse on all four groups; keeping the
# random rows beside them lowered the four groups' mean (docs/decisions/).
SUPERSEDING_L2_POLICIES = ("rotate_experts",)
SUPERSEDE_MAX_M = 4


def supersede_l2_policies(df: pd.DataFrame) -> pd.DataFrame:
    """Drop every row of a shape (SHAPE_KEY) with M <= SUPERSEDE_MAX_M that has rows under a
    superseding L2 policy, except those rows."""
    new = df["l2_policy"].astype(str).isin(SUPERSEDING_L2_POLICIES)
    superseding = new & (df["m"] <= SUPERSEDE_MAX_M)
    if not superseding.any():
        return df
    # M is part of SHAPE_KEY, so only decode shapes have a superseding row.
    has_new = superseding.groupby([df[c] for c in SHAPE_KEY], sort=False, observed=True, dropna=False).transform("any")
    return df[new | ~has_new]


def merge_duplicates(df: pd.DataFrame) -> pd.DataFrame:
    """One row per KEY: times are the median over ok duplicates; a key with any ok row is ok.

    Rows of complete evaluation runs supersede rows of other sweeps: an evaluation
    shape's oracle must come from runs that timed every candidate together (cards
    differ by a few percent), so once the config space grows, the earlier runs of a
    re-measured shape (now incomplete, hence demoted) stop counting for it.

    Stable measurements supersede unstable ones: where a key has a stable ok row, its
    unstable rows are dropped. Re-measuring showed unstable rows off by up to 5x
    (cuBLAS on 256x1536x4480: 64.5 us unstable, 12.7 us stable), so a median with
    them would keep much of the error.

    Rows timed under a newer L2 policy supersede a decode shape's others (``SUPERSEDING_L2_POLICIES``,
    M <= ``SUPERSEDE_MAX_M``): the MoE rows timed with the harness's first copies re-read a decode
    stage's few experts from L2 (benchmarks/results/moe/README.md), so once such a shape is measured
    again with expert-rotating copies, none of its earlier rows count, whichever candidates either
    run measured. Larger shapes keep the rows of both policies (duplicates: the median)."""
    df = supersede_l2_policies(df)
    if not df.duplicated(KEY).any():
        return df.reset_index(drop=True)
    ev = df["eval_shape"].astype(bool)
    df = df[ev | ~ev.groupby([df[c] for c in KEY], sort=False, observed=True).transform("any")]
    df = df.assign(_ok=df["status"] == "ok")
    # Prefer ok rows: failures of a key that also has ok measurements are dropped.
    has_ok = df.groupby(KEY, sort=False)["_ok"].transform("any")
    df = df[df["_ok"] | ~has_ok]
    df = df.assign(_good=df["_ok"] & df["stable"].fillna(False).astype(bool))
    has_good = df.groupby(KEY, sort=False)["_good"].transform("any")
    df = df[df["_good"] | ~has_good].drop(columns=["_ok", "_good"])
    agg = {c: "first" for c in df.columns if c not in KEY}
    # A key measured by an evaluation sweep belongs to a complete shape, even if a
    # training sweep sampled it too.
    agg.update(p20_us="median", p50_us="median", p80_us="median", stable="all", eval_shape="any")
    out = df.groupby(KEY, sort=False, as_index=False).agg(agg)
    return out[list(SCHEMA)].reset_index(drop=True)


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """Categoricals for the low-cardinality string columns."""
    df = df.copy()
    for col in ("op", "dtype", "variant", "status", "source", "arch", "gpu_name", "family", *registry.str_columns()):
        df[col] = df[col].astype("category")
    return df


def dataset_files(root: str = "datasets") -> list[str]:
    """Parquet files of the dataset under root (recursively), sorted."""
    return sorted(glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True))


def load_dataset(paths=None, root: str = "datasets") -> pd.DataFrame:
    """Validated, de-duplicated, typed frame of the given files (default: all parquet under root)."""
    paths = list(paths) if paths is not None else dataset_files(root)
    if not paths:
        raise DataError(f"{root}: no data files")
    frames = [read_file(str(p)) for p in paths]
    # Across files: a large sweep's shape can straddle two -partNN files.
    df, _ = demote_oom_eval_shapes(pd.concat(frames, ignore_index=True))
    return typed(merge_duplicates(df))


def unresolved_oom(df: pd.DataFrame) -> pd.Series:
    """Out-of-memory rows whose key the same sweep did not measure again. The harness
    retries such a candidate on resume and appends the new row; the old one then tells
    nothing about the shape."""
    from gemm_costmodel.data.health import is_oom

    oom = is_oom(df)
    if not oom.any():
        return oom
    # Frames of raw rows may lack the key columns of ops they hold no rows of.
    redone = (~oom).groupby([df[c] for c in KEY + ["suite"] if c in df.columns], sort=False,
                            observed=True).transform("any")
    return oom & ~redone


def drop_resolved_oom(df: pd.DataFrame) -> pd.DataFrame:
    """The frame without out-of-memory rows that a later row of the same key and sweep replaced."""
    from gemm_costmodel.data.health import is_oom

    oom = is_oom(df)
    if not oom.any():
        return df
    return df[~(oom & ~unresolved_oom(df))].reset_index(drop=True)


def demote_oom_eval_shapes(df: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple]]:
    """Clear ``eval_shape`` on every row of a sweep's shape that has an out-of-memory row.

    Running out of device memory says nothing about the candidate (another process
    held the memory), so the shape's oracle may be missing its true best: the shape
    stays training data until a complete re-run. Per (SHAPE_KEY, suite): another
    sweep's complete run of the shape still counts. Compile errors whose text reports
    out of memory are counted too (the harness's label before ``out_of_memory``).
    Returns the frame and the demoted (gpu_name, dtype, m, n, k) keys.
    """
    oom = unresolved_oom(df)
    if not oom.any():
        return df, []
    keys = [c for c in SHAPE_KEY + ["suite"] if c in df.columns]
    hit = oom.groupby([df[c] for c in keys], sort=False, observed=True).transform("any").to_numpy()
    sel = hit & df["eval_shape"].astype(bool).to_numpy()
    if not sel.any():
        return df, []
    demoted = sorted(set(map(tuple, df.loc[sel, ["gpu_name", "dtype", "m", "n", "k"]].astype(
        {"gpu_name": str, "dtype": str}).itertuples(index=False))))
    df = df.copy()
    df.loc[sel, "eval_shape"] = False
    return df, demoted


def demote_incomplete_eval_shapes(df: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple]]:
    """Clear ``eval_shape`` on harness shapes missing some feasible candidate of their op.

    A sweep stopped mid-shape leaves an evaluation shape whose oracle is not
    exact; so does a later change of the config space. Such a shape keeps its
    rows as training data until a resumed sweep completes it. Returns the frame
    and the demoted (gpu_name, dtype, m, n, k) keys.
    """
    from gemm_costmodel import registry

    sel = (df["eval_shape"].astype(bool) & df["op"].astype(str).isin(registry.names())
           & (df["source"] == "harness"))
    if not sel.any():
        return df, []
    keys = ["op", "arch", "gpu_name"] + registry.shape_columns()
    demoted, demoted_keys = [], []
    for key, present in df[sel].groupby(keys, observed=True)["candidate"]:
        row = dict(zip(keys, key))
        spec = registry.get(str(row["op"]))
        try:
            problem = spec.problem_of(row)
            feasible = spec.feasible_configs(problem, str(row["arch"]))
        except (KeyError, ValueError):
            continue  # an arch or dtype without a generated space: nothing to compare with
        # Grids added to a variant later (the space module's config_generation) are required
        # all or none: a shape measured before a generation existed is complete without it.
        gen = getattr(spec.space_module(), "config_generation", lambda c: "")
        have = set(present)
        by_gen: dict = {}
        for c in feasible:
            by_gen.setdefault(gen(c), set()).add(c.id)
        expected = set(by_gen.pop("", set()))
        for ids in by_gen.values():
            if ids & have:
                expected |= ids
        if not expected <= have:
            demoted.append((row["gpu_name"], row["dtype"], int(row["m"]), int(row["n"]), int(row["k"])))
            demoted_keys.append(tuple(str(v) for v in key))
    if demoted:
        bad = pd.MultiIndex.from_frame(df[keys].astype(str)).isin(demoted_keys)
        df = df.copy()
        df.loc[sel.to_numpy() & bad, "eval_shape"] = False
    return df, demoted


def out_of_space(df: pd.DataFrame, op: str, arch: str) -> np.ndarray:
    """Boolean array over ``df``'s rows (all of one op and arch): the rows whose candidate the op's
    current space does not offer for the row's problem (an id it no longer generates, or a
    problem rule added after the row was measured). Such a row stays in the raw shards as the
    record of what ran; training and evaluation skip it, so the oracle and the model rank the
    same candidates the runtime does."""
    from gemm_costmodel import registry

    spec = registry.get(op)
    S = spec.space_module()
    fields = list(spec.problem_fields)
    bad = np.zeros(len(df), dtype=bool)
    dtypes = df["dtype"].astype(str).to_numpy()
    for dtype in np.unique(dtypes):
        sel = dtypes == dtype
        d = df.loc[sel, fields + ["candidate"]]
        try:
            configs = S.generate_configs(arch, str(dtype))
        except ValueError:
            continue  # no generated space for this (arch, dtype): nothing to compare with
        arrays = S.ConfigArrays(configs)
        index = {c.id: i for i, c in enumerate(configs)}
        cidx = d["candidate"].astype(str).map(index).to_numpy(dtype=float)
        # ngroup(sort=False) numbers problems in order of first appearance, the order in which
        # drop_duplicates keeps them: row i of masks is problem code i.
        code = d.groupby(fields, observed=True, sort=False).ngroup().to_numpy()
        problems = d.drop_duplicates(fields)[fields].to_dict("records")
        masks = np.stack([S.problem_mask(arrays, spec.problem_of(r)) for r in problems])
        known = ~np.isnan(cidx)
        ok = np.zeros(len(d), dtype=bool)
        ok[known] = masks[code[known], cidx[known].astype(int)]
        bad[np.flatnonzero(sel)] = ~ok
    return bad


def build_rules(df: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple], list[tuple]]:
    """What ``build_parquet`` does to a shard's rows before writing them: out-of-memory rows that a
    later row replaced dropped, then evaluation shapes with an out-of-memory row and incomplete
    ones stored as training shapes. Returns the frame and the (gpu_name, dtype, m, n, k) keys
    demoted for each reason (the specific reason first: an OOM shape is incomplete too)."""
    df = drop_resolved_oom(df)
    df, oom = demote_oom_eval_shapes(df)
    df, incomplete = demote_incomplete_eval_shapes(df)
    return df, oom, incomplete


def _status_rank(status: str) -> tuple:
    return (STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER), status)


def build_parquet(raw_paths, out_root: str = "datasets", log=None) -> list[str]:
    """Convert harness shards (JSONL[.gz]) to parquet under out_root/<op>/<dtype>/, split to stay < 50 MB.

    Evaluation shapes that miss a feasible candidate or have an out-of-memory row
    are stored as training shapes (``demote_incomplete_eval_shapes``,
    ``demote_oom_eval_shapes``); ``log`` hears about each file that had some, and
    gets each file's sweep health (``health``: rows per status, overall and per shape
    with failures, and a line starting with "WARNING" per unhealthy shape).
    """
    raw_paths = list(raw_paths)
    written = []
    statuses = pd.Series(dtype="int64")
    for raw in raw_paths:
        # Out-of-memory rows a resume measured again are no failure of the sweep any more (health
        # reads statuses only, not the evaluation flags the rules change).
        df, oom, demoted = build_rules(read_file(raw))
        text, warnings = health(df)
        statuses = statuses.add(df["status"].value_counts(), fill_value=0)
        if log is not None:
            log(f"{raw}: {text}")
            for w in warnings:
                log(w)
        if oom and log is not None:
            log(f"{raw}: {len(oom)} evaluation shape(s) with out-of-memory rows stored as training shapes: "
                + ", ".join(f"{d}:{m}x{n}x{k}" for _, d, m, n, k in oom[:5]))
        if demoted and log is not None:
            log(f"{raw}: {len(demoted)} incomplete evaluation shape(s) stored as training shapes: "
                + ", ".join(f"{d}:{m}x{n}x{k}" for _, d, m, n, k in demoted[:5]))
        stem = Path(raw).name.replace(".jsonl.gz", "").replace(".jsonl", "")
        for (op, dtype), part in df.groupby(["op", "dtype"], observed=True):
            folder = Path(out_root) / str(op) / str(dtype)  # datasets/<op>/<dtype>/
            folder.mkdir(parents=True, exist_ok=True)
            # Rows compress to ~20-40 bytes in parquet; 500k rows per file stays well under 50 MB.
            chunks = max(1, math.ceil(len(part) / 500_000))
            for i in range(chunks):
                sub = part.iloc[i * 500_000:(i + 1) * 500_000]
                path = folder / (f"{stem}.parquet" if chunks == 1 else f"{stem}-part{i:02d}.parquet")
                sub.to_parquet(path, index=False, compression="zstd")
                if path.stat().st_size > MAX_FILE_BYTES:
                    raise DataError(f"{path}: {path.stat().st_size} bytes exceeds the 50 MB file limit")
                written.append(str(path))
    if log is not None and len(raw_paths) > 1:
        log(f"all {len(raw_paths)} shards: rows by status: "
            + ", ".join(f"{k} {int(statuses[k])}" for k in sorted(statuses.index, key=_status_rank)))
    return written
