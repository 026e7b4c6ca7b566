"""Summaries of benchmark rows: oracle vs cuBLAS, HBM-floor fraction, status counts."""
from __future__ import annotations

import pandas as pd

from ..kernels.gemm.space import DTYPE_BYTES, OUT_DTYPE
# Shared with the cost model's reports; summary.geomean / summary.markdown_table stay importable.
from ..util import geomean, markdown_table  # noqa: F401

SHAPE_COLS = ["dtype", "m", "n", "k"]


def problem_cols(df: pd.DataFrame) -> list[str]:
    """The columns of the rows' problem key: the op and, beyond SHAPE_COLS, every problem field (and
    pinned field) the registry declares for the ops present (e.g. MoE's), so two
    problems sharing (M, N, K) stay two. Frames without an op column are dense GEMM rows."""
    from gemm_costmodel import registry

    cols = list(SHAPE_COLS)
    if "op" not in df.columns:
        return cols
    for name in sorted(df["op"].astype(str).unique()):
        if name in registry.names():
            spec = registry.get(name)
            cols += [f for f in (*spec.problem_fields, *spec.fixed) if f not in cols and f in df.columns]
    return ["op"] + cols


def _keyed(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """``df`` with the key columns a mix of ops leaves empty (another op's fields) at their defaults:
    groupby and merge would drop or mismatch NaN keys."""
    from gemm_costmodel.data.dataset import OPTIONAL_DEFAULTS

    gaps = [c for c in cols if df[c].isna().any()]
    return df.fillna({c: OPTIONAL_DEFAULTS.get(c, "") for c in gaps}) if gaps else df


def load_rows(paths) -> pd.DataFrame:
    """Rows of JSONL result files as a frame. A corrupt line or a truncated .gz raises
    store.RowsError (a ValueError naming file:line); a summary of part of a file would
    look whole. The torn last line of an uncompressed shard still being written is skipped."""
    from .store import read_rows

    rows = read_rows(paths)
    if not rows:
        raise ValueError("no rows in " + ", ".join(map(str, paths)))
    return pd.DataFrame(rows)


def per_shape(df: pd.DataFrame) -> pd.DataFrame:
    """One row per shape: oracle (best Triton ok p50), its id, cuBLAS p50, candidate counts."""
    # By the op's full problem key: problems of one (M, N, K) may differ in the op's own fields.
    cols = problem_cols(df)
    df = _keyed(df, cols)
    ok = df[df["status"] == "ok"]
    tri = ok[ok["variant"] != "vendor"]
    idx = tri.groupby(cols)["p50_us"].idxmin()
    best = tri.loc[idx, cols + ["candidate", "p50_us", "variant"]].rename(
        columns={"candidate": "oracle_id", "p50_us": "oracle_us", "variant": "oracle_variant"})
    vend = ok[ok["variant"] == "vendor"][cols + ["p50_us"]].rename(columns={"p50_us": "cublas_us"})
    counts = df.groupby(cols).agg(n_rows=("candidate", "size"),
                                  n_ok=("status", lambda s: int((s == "ok").sum()))).reset_index()
    # Start from every shape, so one where all Triton candidates failed still shows (oracle NaN).
    out = counts.merge(best, on=cols, how="left").merge(vend, on=cols, how="left")
    out["speedup_vs_cublas"] = out["cublas_us"] / out["oracle_us"]
    return out.sort_values(cols).reset_index(drop=True)


def min_bytes(m: int, n: int, k: int, dtype: str) -> int:
    """Fewest bytes a GEMM must move: read x and w once, write y once."""
    e = DTYPE_BYTES[dtype]
    return (m * k + n * k) * e + m * n * DTYPE_BYTES[OUT_DTYPE[dtype]]


def hbm_floor(shapes: pd.DataFrame, copy_gbps: float) -> pd.DataFrame:
    """Add floor_us (bytes / measured copy bandwidth) and fractions of it reached."""
    out = shapes.copy()
    out["weight_mb"] = out["n"] * out["k"] * out["dtype"].map(DTYPE_BYTES) / 2**20
    out["floor_us"] = [min_bytes(r.m, r.n, r.k, r.dtype) / (copy_gbps * 1e3) for r in out.itertuples()]
    out["oracle_floor_frac"] = out["floor_us"] / out["oracle_us"]
    out["cublas_floor_frac"] = out["floor_us"] / out["cublas_us"]
    return out


def summarize(df: pd.DataFrame, copy_gbps: float | None = None) -> str:
    """Markdown summary of a benchmark run."""
    lines = []
    st = df.groupby(["dtype", "status"]).size().unstack(fill_value=0)
    lines.append("### Rows by status\n\n" + markdown_table(st.reset_index()) + "\n")
    ps = per_shape(df)
    lines.append(f"### Oracle (best Triton) vs cuBLAS, {len(ps)} shapes\n")
    lines.append("| dtype | M bucket | shapes | geomean cuBLAS/oracle | Triton wins |")
    lines.append("|---|---|---|---|---|")
    for dt, g in ps.groupby("dtype"):
        for name, sel in (("M <= 64", g["m"] <= 64), ("64 < M < 1024", (g["m"] > 64) & (g["m"] < 1024)),
                          ("M >= 1024", g["m"] >= 1024), ("all", g["m"] > 0)):
            sub = g[sel & g["cublas_us"].notna()]
            if len(sub):
                lines.append(f"| {dt} | {name} | {len(sub)} | {geomean(sub['speedup_vs_cublas']):.3f}x | "
                             f"{int((sub['speedup_vs_cublas'] > 1).sum())}/{len(sub)} |")
    lines.append("")
    wins = ps["oracle_variant"].value_counts()
    lines.append("Oracle variant counts: " + ", ".join(f"{k} {v}" for k, v in wins.items()) + "\n")
    if copy_gbps:
        # The floor's bytes are a dense GEMM's (one weight): rows whose integer problem fields beyond
        # (M, N, K) sit at a dense GEMM's values (an MoE stage of E experts reads up to E weights).
        from gemm_costmodel import registry

        dense = ps["m"] > 0
        for c in registry.key_layout()[0]:
            if c in ps.columns:
                dense &= ps[c] == registry.column_default(c)
        fl = hbm_floor(ps[(ps["m"] <= 64) & dense], copy_gbps)
        lines.append(f"### Decode (M <= 64) vs HBM floor (copy bandwidth {copy_gbps:.0f} GB/s)\n")
        lines.append("| dtype | M | N | K | weight MB | floor us | oracle us | oracle % floor | cuBLAS % floor |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in fl.sort_values(["weight_mb", "m"]).itertuples():
            lines.append(f"| {r.dtype} | {r.m} | {r.n} | {r.k} | {r.weight_mb:.0f} | {r.floor_us:.1f} | "
                         f"{r.oracle_us:.1f} | {100 * r.oracle_floor_frac:.0f}% | {100 * r.cublas_floor_frac:.0f}% |")
        big = fl[fl["weight_mb"] >= 256]
        if len(big):
            lines.append(f"\nWeights >= 256 MB: oracle at {100 * big['oracle_floor_frac'].min():.0f}-"
                         f"{100 * big['oracle_floor_frac'].max():.0f}% of the floor (median "
                         f"{100 * big['oracle_floor_frac'].median():.0f}%), cuBLAS "
                         f"{100 * big['cublas_floor_frac'].min():.0f}-{100 * big['cublas_floor_frac'].max():.0f}%.")
        lines.append("")
    return "\n".join(lines)
