"""Held-out results of a CV's per-shape CSV (`results_family.csv`, or a copy under
benchmarks/results/picks/) split by card and by M = 1 / M > 1: shapes, hits within 2%, match,
geomean, p99 and worst of the model's picks.

    python benchmarks/explore/cv_by_card.py CSV [CSV ...]
"""
import sys

import numpy as np
import pandas as pd


def summary(path: str) -> pd.DataFrame:
    d = pd.read_csv(path)
    d = d[d["method"] == "model"]
    rows = []
    for gpu, x in d.groupby("gpu_name"):
        for part, y in (("all", x), ("M = 1", x[x["m"] == 1]), ("M > 1", x[x["m"] > 1])):
            s = y["slowdown"].to_numpy()
            rows.append({"gpu": gpu, "part": part, "shapes": len(s), "hits": int((s <= 1.02).sum()),
                         "match": round(float(np.mean(s <= 1.02)), 3),
                         "geomean": round(float(np.exp(np.log(s).mean())), 4),
                         "p99": round(float(np.quantile(s, 0.99)), 3), "max": round(float(s.max()), 3)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(p)
        print(summary(p).to_string(index=False))
