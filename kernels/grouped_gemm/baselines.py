"""The grouped_gemm op's held-out report section (pandas, lazily): the issue's acceptance numbers.

The shared evaluation already scores the vendor (``cublas`` method: torch._grouped_mm, the op's
vendor id) and the best single config (``best_static``); this adds no picks of its own
(``picks`` returns {}), only the tables the shared report lacks:

- per pass (fwd, dgrad, wgrad) and routing class (balanced vs skewed): model / oracle geomean and
  worst, torch._grouped_mm / oracle, best_static / oracle;
- per training step of a layer (fwd + dgrad + wgrad at one (M, N, K, E, routing)): the model's
  step time against torch._grouped_mm's (speedup geomean), and the passes where the model is
  slower than torch._grouped_mm by more than 2%.
"""
from __future__ import annotations

import numpy as np

STEP_KEY = ("gpu_name", "dtype", "m", "n", "k", "e", "routing")


def picks(ev, train_ev) -> dict:
    """No op-specific baselines beyond the shared ones (vendor, best_static)."""
    return {}


def _geo(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def report_section(results) -> str:
    """Markdown: per pass and routing class, and per training step, against the oracle and
    torch._grouped_mm."""
    import pandas as pd

    from gemm_costmodel.util import markdown_table

    L = ["## Grouped GEMM: per pass, per routing class, per training step\n"]
    need = [c for c in (*STEP_KEY, "stage", "method", "pick_us", "oracle_us", "cublas_us") if c not in results.columns]
    if need:
        L.append(f"The per-shape results lack the columns {', '.join(need)}: no per-pass table.\n")
        return "\n".join(L)
    r = results.assign(routing_class=np.where(results["routing"].astype(str) == "balanced", "balanced", "skewed"))
    rows = []
    for (stage, rc), g in r.groupby([r["stage"].astype(str), "routing_class"], sort=True):
        row = {"pass": stage, "routing": rc}
        for method in ("model", "best_static"):
            m = g[g["method"] == method]
            if len(m):
                s = m["pick_us"] / m["oracle_us"]
                row[f"{method} vs oracle"] = _geo(s)
                row[f"{method} worst"] = float(s.max())
        m = g[g["method"] == "model"]
        if len(m):
            row["grouped_mm vs oracle"] = _geo(m["cublas_us"] / m["oracle_us"])
            row["n"] = len(m)
        rows.append(row)
    L.append("Geomeans of pick time / oracle time over the held-out shapes.\n")
    L.append(markdown_table(pd.DataFrame(rows).round(3)) + "\n")
    m = r[r["method"] == "model"]
    if len(m):
        key = [c for c in STEP_KEY]
        steps = m.groupby(key, observed=True).agg(passes=("stage", "nunique"), model_us=("pick_us", "sum"),
                                                  vendor_us=("cublas_us", "sum")).reset_index()
        steps = steps[steps["passes"] == 3]
        slower = int((m["pick_us"] > 1.02 * m["cublas_us"]).sum())
        if len(steps):
            sp = steps["vendor_us"] / steps["model_us"]
            L.append(f"Per training step (fwd + dgrad + wgrad, {len(steps)} steps): model speedup vs torch._grouped_mm "
                     f"geomean {_geo(sp):.3f}x (worst {float(sp.min()):.3f}x). Passes where the model's pick is "
                     f"slower than torch._grouped_mm by more than 2%: {slower} of {len(m)}.\n")
    return "\n".join(L)
