"""Evaluation shapes whose complete runs disagree (issue 16): the --only list of a third run.

An evaluation shape's oracle is the loader's median of a key over its runs. With two runs that
median is their mean, so one run's glitch on a 3-us kernel (a config reading 1.18x in one run and
best in the other) moves the key by half the glitch and can decide which config is "best". A
third complete run makes the median reject it. The rule reads only the measurements, never a
model's picks: a shape is disputed when some candidate whose median time is within ``--near``
of the shape's best reads more than ``--spread`` apart between two of its runs (a run: one
dataset file on one GPU).

    python benchmarks/explore/disputed_shapes.py --op fp8_blockscale --out FILE.csv
"""
from __future__ import annotations

import argparse
import glob
import os

import pandas as pd


def runs_of(root: str, op: str) -> pd.DataFrame:
    """Every ok row of the op's evaluation shapes, with a run id (file stem + GPU uuid)."""
    frames = []
    for path in sorted(glob.glob(os.path.join(root, op, "**", "*.parquet"), recursive=True)):
        df = pd.read_parquet(path, columns=["m", "n", "k", "dtype", "candidate", "status", "stable", "p50_us",
                                            "eval_shape", "gpu_uuid"])
        df = df[(df["status"] == "ok") & df["stable"].astype(bool) & df["eval_shape"].astype(bool)]
        if len(df):
            frames.append(df.assign(run=os.path.basename(path) + ":" + df["gpu_uuid"].astype(str)))
    return pd.concat(frames, ignore_index=True)


def disputed(df: pd.DataFrame, near: float, spread: float) -> pd.DataFrame:
    out = []
    for (m, n, k, dt), g in df.groupby(["m", "n", "k", "dtype"]):
        t = g.pivot_table(index="candidate", columns="run", values="p50_us", aggfunc="median")
        t = t.dropna(thresh=2)  # a candidate timed in at least two runs
        if t.empty:
            continue
        med = t.median(axis=1)
        top = t[med <= med.min() * near]
        worst = float((top.max(axis=1) / top.min(axis=1)).max())
        out.append({"M": m, "N": n, "K": k, "dtype": dt, "runs": t.shape[1], "near_candidates": len(top),
                    "max_spread": round(worst, 4), "best_us": round(float(med.min()), 3)})
    res = pd.DataFrame(out)
    return res[res["max_spread"] > spread].sort_values(["M", "N", "K"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="fp8_blockscale")
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--near", type=float, default=1.10, help="candidates within this factor of the best")
    ap.add_argument("--spread", type=float, default=1.05, help="max/min over runs above this: disputed")
    ap.add_argument("--out", required=True, help="CSV: M,N,K,dtype (the bench --only format) and the spread")
    args = ap.parse_args(argv)
    res = disputed(runs_of(args.root, args.op), args.near, args.spread)
    res.to_csv(args.out, index=False)
    print(f"{len(res)} disputed shapes -> {args.out}")
    print(res.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
