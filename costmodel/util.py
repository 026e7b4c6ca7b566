"""Small helpers shared by the cost model (gemm_costmodel.*) and the benchmarks
(gemm_costmodel.benchmarks.*), kept here so that neither side imports the other
for them. Imports numpy only (pandas lazily, where a helper takes a frame): no torch or triton."""
from __future__ import annotations

import os
import subprocess

import numpy as np


def geomean(x) -> float:
    """Geometric mean of the finite positive values (NaN if none)."""
    x = np.asarray(list(x), dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def markdown_table(df) -> str:
    """A pandas frame as a GitHub markdown table (no tabulate dependency)."""
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(out)


def git_sha() -> str:
    """Commit of the measuring code: $COSTMODEL_GIT_SHA if set, else `git rev-parse`."""
    sha = os.environ.get("COSTMODEL_GIT_SHA")
    if sha:
        return sha
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def m_bucket(m):
    """Decode / small / mid / prefill buckets of M (a pandas Series), for the reports."""
    import math

    import pandas as pd

    edges = [0, 16, 64, 256, 1024, math.inf]
    labels = ["1-16", "17-64", "65-256", "257-1024", ">1024"]
    return pd.cut(m, edges, labels=labels)
