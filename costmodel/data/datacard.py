"""Data card of the dataset: counts, candidate space, noise floor, device time, and the
evaluation-shape figures (oracle vs cuBLAS, default and best-static slowdowns, ties)."""
from __future__ import annotations

import pandas as pd

from gemm_costmodel.kernels.gemm.space import generate_configs
from gemm_costmodel.util import geomean
from gemm_costmodel.util import markdown_table as _table

# The config a user gets without tuning: the classic tutorial tile.
DEFAULT_CONFIG = "tiled_m128n128k64_g8_w4s3"
M_BUCKETS = [(1, 1), (2, 16), (17, 64), (65, 256), (257, 1024), (1025, 4096), (4097, 16384)]


def _origins(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, origin): family and tp parsed from 'family/model/layer/tpN'."""
    shapes = df.drop_duplicates(["dtype", "m", "n", "k"])[["dtype", "m", "n", "k", "origins"]]
    rec = []
    for r in shapes.itertuples(index=False):
        for o in str(r.origins).split(";"):
            parts = o.split("/")
            fam = parts[0] if parts and parts[0] else "user"
            tp = parts[3] if len(parts) >= 4 else "-"
            rec.append((r.dtype, r.m, r.n, r.k, fam, tp))
    return pd.DataFrame(rec, columns=["dtype", "m", "n", "k", "family", "tp"])


def noise_floor(remeasure: pd.DataFrame) -> dict:
    """Median and p95 of |new/orig - 1| over re-measured pairs, all and originally-stable only."""
    r = remeasure[remeasure["status"] == "ok"]
    rel = (r["p50_us"] / r["orig_p50_us"] - 1).abs()
    st = rel[r["orig_stable"].astype(bool)]
    return {"pairs": int(len(rel)), "median": float(rel.median()), "p95": float(rel.quantile(0.95)),
            "stable_pairs": int(len(st)), "stable_median": float(st.median()), "stable_p95": float(st.quantile(0.95))}


def eval_figures(df: pd.DataFrame, tie_tol: float) -> dict:
    """Figures on evaluation shapes (every candidate measured), per dtype."""
    out = {}
    ev = df[df["eval_shape"] & (df["status"] == "ok") & (df["op"] == "gemm")]
    for (gpu, dtype), g in ev.groupby(["gpu_name", "dtype"], observed=True):
        g = g.copy()
        shape = ["m", "n", "k"]
        best = g.groupby(shape)["p50_us"].transform("min")
        g["slow"] = g["p50_us"] / best
        tri = g[g["variant"] != "vendor"]
        oracle_tri = tri.groupby(shape)["p50_us"].min()
        cub = g[g["variant"] == "vendor"].set_index(shape)["p50_us"]
        both = pd.concat([oracle_tri.rename("tri"), cub.rename("cub")], axis=1).dropna()
        per_cfg = g.pivot_table(index=shape, columns="candidate", values="slow", observed=True)
        n_shapes = len(per_cfg)
        full = per_cfg.columns[per_cfg.notna().all()]
        static_gm = {c: geomean(per_cfg[c]) for c in full}
        best_static = min(static_gm, key=static_gm.get) if static_gm else None
        tri_gm = {c: v for c, v in static_gm.items() if c != "cublas"}
        best_static_tri = min(tri_gm, key=tri_gm.get) if tri_gm else None
        ties = g[g["slow"] <= 1 + tie_tol].groupby(shape).size()
        out[(str(gpu), str(dtype))] = {
            "eval_shapes": n_shapes,
            "cublas_over_triton_oracle": geomean(both["cub"] / both["tri"]),
            "default_config": DEFAULT_CONFIG,
            "default_slowdown": geomean(per_cfg[DEFAULT_CONFIG]) if DEFAULT_CONFIG in per_cfg else float("nan"),
            "default_coverage": int(per_cfg[DEFAULT_CONFIG].notna().sum()) if DEFAULT_CONFIG in per_cfg else 0,
            "best_static_config": best_static,
            "best_static_slowdown": static_gm.get(best_static, float("nan")),
            "best_static_triton_config": best_static_tri,
            "best_static_triton_slowdown": tri_gm.get(best_static_tri, float("nan")),
            "cublas_slowdown": geomean(cub / g.groupby(shape)["p50_us"].min().reindex(cub.index)),
            "ties_median": float(ties.median()),
            "ties_p90": float(ties.quantile(0.9)),
            "shapes_with_tie": int((ties > 1).sum()),
        }
    return out


def card(df: pd.DataFrame, remeasure: pd.DataFrame | None = None) -> str:
    """The data card, as markdown."""
    L = []
    gemm = df[df["op"] == "gemm"]
    shapes = gemm.drop_duplicates(["gpu_name", "dtype", "m", "n", "k"])
    ev_shapes = gemm[gemm["eval_shape"]].drop_duplicates(["gpu_name", "dtype", "m", "n", "k"])
    L.append("### Counts\n")
    by = ["gpu_name", "dtype"]
    cnt = pd.DataFrame({
        "rows": gemm.groupby(by, observed=True).size(),
        "shapes": shapes.groupby(by, observed=True).size(),
        "evaluation shapes": ev_shapes.groupby(by, observed=True).size(),
        "candidates measured": gemm.groupby(by, observed=True)["candidate"].nunique(),
        "stable rows %": (100 * gemm.groupby(by, observed=True)["stable"].mean()).round(1),
    }).fillna(0).reset_index()
    all_gpus = shapes.drop_duplicates(["dtype", "m", "n", "k"]).groupby("dtype", observed=True).size()
    all_ev = ev_shapes.drop_duplicates(["dtype", "m", "n", "k"]).groupby("dtype", observed=True).size()
    L.append(_table(cnt) + "\n")
    L.append("Distinct (M, N, K) over both GPUs: " + ", ".join(
        f"{d} {int(all_gpus.get(d, 0))} ({int(all_ev.get(d, 0))} evaluation)" for d in all_gpus.index.astype(str)) + ".\n")
    st = gemm.groupby(["gpu_name", "dtype", "status"], observed=True).size().unstack(fill_value=0).reset_index()
    L.append("Rows by status:\n\n" + _table(st) + "\n")
    org = _origins(gemm)
    fam = org.groupby(["family", "dtype"]).size().unstack(fill_value=0).reset_index()
    L.append("Shapes by family (a shape shared by several families counts in each):\n\n" + _table(fam) + "\n")
    tp = org.groupby(["tp", "dtype"]).size().unstack(fill_value=0).reset_index()
    L.append("Shapes by TP degree:\n\n" + _table(tp) + "\n")
    mb = []
    for lo, hi in M_BUCKETS:
        sel = shapes[(shapes["m"] >= lo) & (shapes["m"] <= hi)]
        mb.append({"M": f"{lo}-{hi}" if lo != hi else str(lo),
                   **{d: int((sel["dtype"] == d).sum()) for d in sorted(shapes["dtype"].astype(str).unique())}})
    L.append("Shapes by M range:\n\n" + _table(pd.DataFrame(mb)) + "\n")
    L.append("### Candidate space (sm90)\n")
    L.append(", ".join(f"{d}: {len(generate_configs('sm90', d))}" for d in ("bf16", "fp16", "fp8"))
             + " (Triton configs + cuBLAS).\n")
    tie_tol = 0.01
    if remeasure is not None and len(remeasure):
        L.append("### Noise floor\n")
        L.append("Random (shape, candidate) pairs re-measured in a separate process, on a fresh machine start "
                 "with fresh inputs; |relative difference| of p50:\n")
        nrows, meds = [], []
        for gpu, r in remeasure.groupby("gpu_name"):
            nf = noise_floor(r)
            meds.append(nf["stable_median"])
            nrows.append({"GPU": gpu, "pairs": nf["pairs"], "median %": round(100 * nf["median"], 2),
                          "p95 %": round(100 * nf["p95"], 1), "stable pairs": nf["stable_pairs"],
                          "stable median %": round(100 * nf["stable_median"], 2),
                          "stable p95 %": round(100 * nf["stable_p95"], 1)})
        L.append(_table(pd.DataFrame(nrows)) + "\n")
        tie_tol = round(max(meds), 4) if meds and max(meds) > 0 else tie_tol
        L.append("Unstable rows carry most of the noise, so they are flagged (`stable` = False) and kept out "
                 f"of training. Tie tolerance: {100 * tie_tol:.2f}% (the larger median over stable pairs).\n")
    L.append("### Device time\n")
    tdf = gemm.assign(ts=pd.to_datetime(gemm["timestamp"], errors="coerce", utc=True)).dropna(subset=["ts"])
    def _busy_minutes(ts: pd.Series) -> float:
        # A sweep resumed in a later call leaves a gap between its rows: only the time
        # between consecutive rows up to 2 minutes apart counts as measuring.
        d = ts.sort_values().diff().dt.total_seconds().dropna()
        return float(d[d <= 120].sum() / 60)

    spans = (tdf.groupby(["gpu_name", "suite", "dtype"], observed=True)["ts"]
             .agg(rows="size", minutes=_busy_minutes).reset_index())
    spans["minutes"] = spans["minutes"].round(1)
    L.append(_table(spans[["gpu_name", "suite", "dtype", "rows", "minutes"]]) + "\n")
    L.append(f"Sweep time in all: {spans['minutes'].sum():.1f} minutes of measuring (gaps over 2 minutes "
             "between rows, i.e. separate calls, are left out; precompilation and machine start-up come on top).\n")
    figs = eval_figures(gemm, tie_tol)
    if figs:
        L.append("### Evaluation shapes, from the data alone\n")
        rows = []
        for (gpu, d), f in figs.items():
            rows.append({"gpu": gpu, "dtype": d, "shapes": f["eval_shapes"],
                         "cuBLAS / Triton oracle": round(f["cublas_over_triton_oracle"], 3),
                         "cuBLAS vs oracle": round(f["cublas_slowdown"], 3),
                         f"default ({f['default_config']}) vs oracle": round(f["default_slowdown"], 3),
                         "best static vs oracle": round(f["best_static_slowdown"], 3),
                         "best static config": f["best_static_config"],
                         "best static Triton vs oracle": round(f["best_static_triton_slowdown"], 3),
                         "best static Triton config": f["best_static_triton_config"],
                         "within tie tol. of best (median, p90)": f"{f['ties_median']:.0f}, {f['ties_p90']:.0f}"})
        L.append(_table(pd.DataFrame(rows)) + "\n")
        L.append("Oracle = fastest measured candidate including cuBLAS, except in the 'cuBLAS / Triton oracle' "
                 "column (geomean > 1 means the best Triton config beats cuBLAS). Slowdowns are geomeans of "
                 "candidate p50 / oracle p50 over the evaluation shapes.\n")
    return "\n".join(L)
