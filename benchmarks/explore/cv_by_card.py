"""Held-out results of a CV's per-shape CSV (`results_family.csv`, or a copy under
benchmarks/results/picks/) split by card and by M = 1 / M > 1: the model's shapes, hits within
2%, match, geomean, p99 and worst, through the report's own metrics (`evaluate.metrics_table`).

    python benchmarks/explore/cv_by_card.py CSV [CSV ...]
"""
import sys

import numpy as np
import pandas as pd

from gemm_costmodel.learning.evaluate import metrics_table


def summary(path: str) -> pd.DataFrame:
    d = pd.read_csv(path)
    d = d[d["method"] == "model"]
    parts = pd.concat([d.assign(part="all"), d[d["m"] == 1].assign(part="M = 1"), d[d["m"] > 1].assign(part="M > 1")])
    t = metrics_table(parts, by=["gpu_name", "part"])
    t["hits"] = np.rint(t["match_2pct"] * t["shapes"]).astype(int)
    return t[["gpu_name", "part", "shapes", "hits", "match_2pct", "geomean_slowdown", "p99_slowdown", "max_slowdown"]].round(4)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(p)
        print(summary(p).to_string(index=False))
