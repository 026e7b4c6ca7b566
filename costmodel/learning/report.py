"""The evaluation report: markdown tables and PNG plots from held-out results.

Input is the long per-shape frame of ``evaluate.cross_validate`` (one row per
(method, evaluation shape)), optionally the row-level model predictions. Output
is a folder with ``report.md``, ``results.csv`` and the plots.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from gemm_costmodel.util import markdown_table
from gemm_costmodel.learning.evaluate import METHODS, loss_breakdown, m_bucket, metrics_table

HEADLINE = ["shapes", "top1_match", "match_2pct", "geomean_slowdown", "p95_slowdown", "p99_slowdown",
            "max_slowdown", "speedup_vs_cublas"]
TOPK_COLS = ["recall_top1", "recall_top2", "recall_top4", "recall_top8",
             "top1_bench_slowdown", "top2_bench_slowdown", "top4_bench_slowdown", "top8_bench_slowdown"]


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            out[c] = out[c].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdf(results: pd.DataFrame, path: str, title: str) -> None:
    """Slowdown-vs-oracle CDF, one line per method."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in [m for m in METHODS if m in set(results["method"])]:
        s = np.sort(results.loc[results["method"] == method, "slowdown"].to_numpy())
        ax.step(s, np.arange(1, len(s) + 1) / len(s), where="post", label=method)
    ax.set_xscale("log")
    ax.set_xlim(1, max(3.0, 1.05))
    ax.set_xlabel("slowdown vs oracle (log)")
    ax.set_ylabel("fraction of evaluation shapes")
    ax.axvline(1.02, color="grey", lw=0.8, ls="--")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_m_buckets(results: pd.DataFrame, path: str, title: str) -> None:
    """Match-within-2% by M bucket, bars per method."""
    plt = _plt()
    r = results.assign(bucket=m_bucket(results["m"]))
    tab = r.groupby(["bucket", "method"], observed=True)["slowdown"].apply(lambda s: float(np.mean(s <= 1.02)))
    tab = tab.unstack("method")
    cols = [m for m in METHODS if m in tab.columns and m != "oracle"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = 0.8 / max(len(cols), 1)
    x = np.arange(len(tab.index))
    for i, m in enumerate(cols):
        ax.bar(x + i * w, tab[m].to_numpy(), width=w, label=m)
    ax.set_xticks(x + 0.4 - w / 2)
    ax.set_xticklabels([str(b) for b in tab.index])
    ax.set_xlabel("M")
    ax.set_ylabel("match within 2% of oracle")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pred_vs_measured(rows: pd.DataFrame, path: str, title: str) -> None:
    """Predicted vs measured latency (log-log), held-out rows of a log-latency model."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    meas = rows["p50_us"].to_numpy()
    pred = np.exp2(rows["score"].to_numpy())
    ax.scatter(meas, pred, s=2, alpha=0.25)
    lo, hi = float(np.min(meas)), float(np.max(meas))
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured p50 (us)")
    ax.set_ylabel("predicted (us)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_families(results: pd.DataFrame, path: str, title: str) -> None:
    """Geomean slowdown per held-out family, bars per method."""
    plt = _plt()
    cols = [m for m in ("model", "cublas", "best_static", "nearest_neighbor", "heuristic") if m in set(results["method"])]
    tab = results[results["method"].isin(cols)].groupby(["family", "method"], observed=True)["slowdown"].apply(
        lambda s: float(np.exp(np.log(s).mean()))).unstack("method")[cols]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = 0.8 / len(cols)
    x = np.arange(len(tab.index))
    for i, m in enumerate(cols):
        ax.bar(x + i * w, tab[m].to_numpy() - 1, bottom=1, width=w, label=m)
    ax.set_xticks(x + 0.4 - w / 2)
    ax.set_xticklabels(tab.index, rotation=20)
    ax.set_ylabel("geomean slowdown vs oracle")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CARD_COLS = ["shapes", "top1_match", "match_2pct", "geomean_slowdown", "p99_slowdown", "max_slowdown",
             "top8_bench_slowdown"]


def card_section(cards: dict[str, pd.DataFrame], family: pd.DataFrame | None = None,
                 adapted: dict[str, int] | None = None) -> str:
    """The "Leave-one-card-out" section: the model's held-out figures per card under the card
    schemes ({'card': results, 'card_adapt': results} of ``evaluate.cross_validate``), beside the
    leave-one-family-out ones (every other row of the card trains) when ``family`` is given.
    ``adapted``: adaptation rows per card (GPU name -> rows), for the text."""
    adapted = adapted or {}
    what = {"family": "every row of every card but the family's",
            "card": "none of the card's rows",
            "card_adapt": "the card's adaptation rows only"}
    L = ["## Leave-one-card-out\n",
         "The model's held-out figures on each card's evaluation shapes (held out by family in every "
         "scheme), by what it learned of that card: `family` trains on every other row (the card's "
         "other families included), `card` on the other cards' rows only (the card is new to it), "
         "`card_adapt` on the other cards' rows plus the card's adaptation rows (rows of "
         "`costmodel adapt` rounds, by their suite name). A card without adaptation rows has no "
         "`card_adapt` row.\n"]
    by_scheme = ({"family": family} if family is not None and not family.empty else {}) | cards
    gpus = sorted({g for r in cards.values() for g in r["gpu_name"].astype(str).unique()})
    for gpu in gpus:
        n = adapted.get(gpu, 0)
        L.append(f"### {gpu} ({n:,} adaptation rows)\n")
        rows = []
        for scheme, res in by_scheme.items():
            mod = res[(res["method"] == "model") & (res["gpu_name"].astype(str) == gpu)]
            if mod.empty:
                continue
            for r in metrics_table(mod, by=["dtype"]).to_dict("records"):
                rows.append({"scheme": scheme, "card rows trained on": what[scheme], "dtype": r["dtype"],
                             **{c: r[c] for c in CARD_COLS}})
        L.append(markdown_table(_fmt(pd.DataFrame(rows))) + "\n")
    return "\n".join(L)


def write_report(out_dir: str, family: pd.DataFrame | None, nk: pd.DataFrame | None = None,
                 rows: pd.DataFrame | None = None, comparison: pd.DataFrame | None = None,
                 header: str = "", extra_sections: list[str] | None = None,
                 cards: dict[str, pd.DataFrame] | None = None, sampled: bool = False) -> str:
    """Write report.md, results CSVs and the plots (from the family results, else the (N, K)
    ones, else the leave-one-card-out ones); returns the report path. ``cards``: results of the
    card schemes by name (their tables come through ``card_section`` in ``extra_sections``; here
    their CSVs)."""
    cards = {k: v for k, v in (cards or {}).items() if v is not None and not v.empty}
    if (family is None or family.empty) and (nk is None or nk.empty) and not cards:
        raise ValueError("no results to report")
    os.makedirs(out_dir, exist_ok=True)
    if family is not None and not family.empty:
        plots_from, held_out = family, "held-out families"
    elif nk is not None and not nk.empty:
        plots_from, held_out = nk, "held-out (N, K)"
    else:
        plots_from, held_out = next(iter(cards.values())), "held-out card"
    L = ["# Cost model evaluation report\n", header]
    # ``sampled`` (`--sampled-heldout`): the held-out problems were measured on a sample of their candidates.
    L.append(("Held-out problems measured on a sample of their candidates are scored: the 'oracle' is the best "
              "candidate measured on each, not the best of the full space. " if sampled else
              "Only evaluation shapes are scored (every feasible candidate measured: the oracle is exact). ") +
             "Slowdown = latency of the picked candidate / the oracle's. `match_2pct` = picked <= 1.02x oracle. "
             "`topK_bench_slowdown` = best measured latency among the method's top K / oracle ('model top-K "
             "then benchmark'). Baselines (best static, nearest neighbour) are fitted on each fold's training "
             "shapes only.\n")
    for title, res in (("Leave-one-family-out", family), ("Leave-(N,K)-out (5 folds)", nk)):
        if res is None or res.empty:
            continue
        for gpu, g in res.groupby("gpu_name", observed=True):
            L.append(f"## {title}: {gpu}\n")
            m = metrics_table(g, by=["dtype"])
            L.append(markdown_table(_fmt(m[["method", "dtype", *HEADLINE]])) + "\n")
            mod = m[m["method"].isin(["model", "best_static"])]
            L.append("Top-k (model and best static ranking):\n\n" + markdown_table(_fmt(mod[["method", "dtype", *TOPK_COLS]])) + "\n")
    if family is not None and not family.empty and (family["method"] == "model").any():
        L.append("## Where the model loses (leave-one-family-out)\n")
        L.append("Shares of the model's summed log-slowdown vs the oracle: cuBLAS picked where a Triton config "
                 "is faster (`loss_cublas_over_triton`), a Triton config picked where cuBLAS is faster, and the "
                 "wrong Triton config. `triton_pick_slowdown`: the model's best-ranked Triton config vs the best "
                 "Triton config, i.e. how well it ranks the Triton candidates alone.\n")
        mod = family[family["method"] == "model"]
        tab = pd.DataFrame([{"gpu": gpu, "dtype": dt, **loss_breakdown(g)}
                            for (gpu, dt), g in mod.groupby(["gpu_name", "dtype"], observed=True)])
        L.append(markdown_table(_fmt(tab)) + "\n")
    if comparison is not None and not comparison.empty:
        L.append("## Formulations and sizes (leave-one-family-out, model only)\n")
        L.append(markdown_table(_fmt(comparison)) + "\n")
    for sec in extra_sections or []:
        L.append(sec)
    figs = []
    for gpu, g in plots_from.groupby("gpu_name", observed=True):
        tag = str(gpu).replace("NVIDIA ", "").replace(" ", "_")
        for dtype, gd in g.groupby("dtype", observed=True):
            name = f"cdf_{tag}_{dtype}.png"
            plot_cdf(gd, os.path.join(out_dir, name), f"{gpu} {dtype}: slowdown CDF ({held_out})")
            figs.append(name)
        name = f"m_buckets_{tag}.png"
        plot_m_buckets(g, os.path.join(out_dir, name), f"{gpu}: match within 2% by M ({held_out})")
        figs.append(name)
        if plots_from is family:
            name = f"families_{tag}.png"
            plot_families(g, os.path.join(out_dir, name), f"{gpu}: geomean slowdown per held-out family")
            figs.append(name)
    if rows is not None and len(rows):
        name = "pred_vs_measured.png"
        plot_pred_vs_measured(rows, os.path.join(out_dir, name), "held-out rows: predicted (log-latency model) vs measured")
        figs.append(name)
    L.append("## Plots\n")
    L += [f"![{f}]({f})\n" for f in figs]
    if family is not None and not family.empty:
        family.to_csv(os.path.join(out_dir, "results_family.csv"), index=False)
    if nk is not None and not nk.empty:
        nk.to_csv(os.path.join(out_dir, "results_nk.csv"), index=False)
    for scheme, res in cards.items():
        res.to_csv(os.path.join(out_dir, f"results_{scheme}.csv"), index=False)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(L))
    return path


# -- the adaptation curve (issue 58) -------------------------------------------------------------
# A committed curve file (benchmarks/results/<op>/<card>/curve/curve.csv, written by the
# exploration script beside it) holds one row per (point, GPU, dtype): held-out figures of a model
# trained with the new card's rows of the first `device_minutes` of a sweep. Points: 'none' (no row
# of the card: every arm's start), one label per arm ('adapt': model-guided rounds, 'random':
# random sampling), and 'all...' (every row of the card: the reference an arm should reach).
# Markers around the generated section: `costmodel results --curve` rewrites what lies between
# them in a report that already has it (no retraining), so it stays what `costmodel run` writes.
CURVE_BEGIN = "<!-- curve:begin (generated from {path} by `costmodel results --curve`; do not edit) -->"
CURVE_END = "<!-- curve:end -->"
CURVE_PNG = "adaptation_curve.png"
CURVE_ARMS = {"adapt": "model-guided (costmodel adapt)", "random": "random sampling",
              "random_rows": "random rows"}


def read_curve(path: str) -> pd.DataFrame:
    """A curve file, checked: the columns the plot and table read. Raises ValueError naming what
    is missing."""
    df = pd.read_csv(path)
    need = {"point", "device_minutes", "gpu", "dtype", "geomean_slowdown", "match_2pct", "p99_slowdown"}
    missing = sorted(need - set(df.columns))
    if missing:
        raise ValueError(f"{path}: not a curve file (no column {', '.join(missing)})")
    if not (df["point"] == "none").any():
        raise ValueError(f"{path}: no 'none' point (the model without a row of the card)")
    return df


def _rows_col(curve: pd.DataFrame) -> str | None:
    # The card's training rows per point: the one column named '<card>_rows' ('h200_rows').
    cols = [c for c in curve.columns if c.endswith("_rows")]
    return cols[0] if len(cols) == 1 else None


def curve_arms(curve: pd.DataFrame, gpu: str, dtype: str) -> dict[str, pd.DataFrame]:
    """{arm: its points in device-minute order, starting at 'none' (0 minutes)} of one GPU and dtype."""
    g = curve[(curve["gpu"] == gpu) & (curve["dtype"] == dtype)]
    start = g[g["point"] == "none"]
    out = {}
    for arm in [p for p in dict.fromkeys(g["point"]) if p != "none" and not str(p).startswith("all")]:
        out[arm] = pd.concat([start, g[g["point"] == arm]]).sort_values("device_minutes", kind="stable")
    return out


def plot_curve(curve: pd.DataFrame, path: str, title: str) -> None:
    """Held-out geomean slowdown (top) and match within 2% (bottom) vs device-minutes of the new
    card's rows, one column per (GPU, dtype) of the file: a line per arm from the 'none' point, the
    model with every row of the card as a star and a dotted level."""
    plt = _plt()
    keys = list(dict.fromkeys(zip(curve["gpu"], curve["dtype"])))
    fig, axes = plt.subplots(2, len(keys), figsize=(4.6 * len(keys), 6.5), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, (gpu, dtype) in enumerate(keys):
        g = curve[(curve["gpu"] == gpu) & (curve["dtype"] == dtype)]
        alls = g[g["point"].astype(str).str.startswith("all")]
        for i, (col, label) in enumerate((("geomean_slowdown", "held-out geomean slowdown"),
                                          ("match_2pct", "held-out match within 2%"))):
            ax = axes[i][j]
            for c, (arm, pts) in enumerate(curve_arms(curve, gpu, dtype).items()):
                ax.plot(pts["device_minutes"], pts[col], marker="o", color=colors[c % len(colors)],
                        label=CURVE_ARMS.get(arm, arm))
            for _, r in alls.iterrows():
                ax.axhline(r[col], color="grey", lw=0.8, ls=":")
                ax.plot([r["device_minutes"]], [r[col]], marker="*", ms=12, color="k", ls="none",
                        label=f"every row of the card ({r['device_minutes']:g} min)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(f"{gpu} {dtype}", fontsize=10)
            else:
                ax.set_xlabel("device-minutes of the new card's rows")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curve_section(curve_path: str, out_dir: str) -> str:
    """The report's "Adaptation curve" section from a committed curve file: writes the plot
    (CURVE_PNG) into ``out_dir`` and returns the markdown (a table per point, between the curve
    markers). ``curve_path`` is named as given (relative to the repository root, as committed)."""
    curve = read_curve(curve_path)
    os.makedirs(out_dir, exist_ok=True)
    plot_curve(curve, os.path.join(out_dir, CURVE_PNG),
               "adaptation curve: held-out figures vs device-minutes of the new card's rows")
    keys = list(dict.fromkeys(zip(curve["gpu"], curve["dtype"])))
    rows_col = _rows_col(curve)
    table = []
    for (point, minutes), g in curve.groupby(["point", "device_minutes"], sort=False):
        r = {"point": point, "device-minutes": f"{minutes:g}"}
        if rows_col:
            r["card rows"] = f"{int(g[rows_col].iloc[0]):,}"
        for gpu, dtype in keys:
            x = g[(g["gpu"] == gpu) & (g["dtype"] == dtype)]
            tag = f"{gpu.replace('NVIDIA ', '')} {dtype}"
            r[f"{tag} geomean"] = f"{x['geomean_slowdown'].iloc[0]:.4f}" if len(x) else ""
            r[f"{tag} within 2%"] = f"{100 * x['match_2pct'].iloc[0]:.1f}%" if len(x) else ""
        table.append(r)
    readme = os.path.join(os.path.dirname(os.path.dirname(curve_path)), "README.md")
    where = f" Scheme and sweeps: `{readme}`." if os.path.isfile(readme) else ""
    L = [CURVE_BEGIN.format(path=curve_path), "## Adaptation curve\n",
         f"From `{curve_path}`: the held-out figures of one model per point, trained with the new card's "
         "rows measured in the first `device-minutes` of a sweep (`adapt`: model-guided rounds; `random`: "
         "random configs of random training problems; `none`: no row of the card; `all...`: every row of "
         f"it), the other card's beside them.{where}\n",
         markdown_table(pd.DataFrame(table)) + "\n", f"![{CURVE_PNG}]({CURVE_PNG})\n", CURVE_END + "\n"]
    return "\n".join(L)


def splice_curve(report_md: str, section: str) -> str:
    """The report text with its curve section replaced by ``section`` (between the markers), or
    inserted before '## Plots' (where `costmodel run` puts it) if it has none."""
    begin = report_md.find("<!-- curve:begin")
    if begin >= 0:
        end = report_md.index(CURVE_END, begin) + len(CURVE_END) + 1
        return report_md[:begin] + section + report_md[end:]
    at = report_md.find("## Plots\n")
    if at < 0:
        return report_md.rstrip("\n") + "\n" + section
    return report_md[:at] + section + "\n" + report_md[at:]
