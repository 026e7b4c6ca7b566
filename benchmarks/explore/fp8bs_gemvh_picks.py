"""Exploration (kept as a record; not in the package): the fast M = 1 loop's picks on an H200 with
the shipped fp32-product GEMV's rows against the fp16-product GEMV's rows (issue 16;
benchmarks/results/fp8_blockscale/README.md, "The GEMV's arithmetic"). Per seed: hits within 2%
of each run's own oracle, and the geomean of (pick's time with the fp32 rows) / (pick's time
with the fp16 rows), each time from its own run (two leases, so indicative).

    python benchmarks/explore/fp8bs_gemvh_picks.py
"""
from __future__ import annotations

import glob

import numpy as np
import pandas as pd

R = "benchmarks/results/fp8_blockscale"
O = "benchmarks/results/picks/m1loop/gemv_f16"


def times(path: str) -> pd.Series:
    d = pd.read_json(path, lines=True)
    return d[d.status == "ok"].groupby(["n", "k", "candidate"]).p50_us.median()


def main() -> int:
    old = times(f"{R}/h200/fp8bs-evalgemv-h200-shard00of01.jsonl.gz")
    new = times(f"{R}/gemv_f16/fp8bs-evalgemvh-h200-shard00of01.jsonl.gz")
    for seed in sorted(f.split("_s")[-1][:-4] for f in glob.glob(f"{O}/h200new_s*.csv")):
        a, b = pd.read_csv(f"{O}/h200old_s{seed}.csv"), pd.read_csv(f"{O}/h200new_s{seed}.csv")
        po = np.array([old[(r.n, r.k, r.pick)] for r in a.itertuples()])
        pn = np.array([new[(r.n, r.k, r.pick)] for r in b.itertuples()])
        print(f"seed {seed}: hits {int((a.slowdown <= 1.02).sum())} -> {int((b.slowdown <= 1.02).sum())} of {len(a)}, "
              f"pick time fp32 / fp16 rows {float(np.exp(np.log(po / pn).mean())):.4f}, "
              f"fp16 picks over 2% slower on {int((pn > po * 1.02).sum())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
