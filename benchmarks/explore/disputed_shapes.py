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
import os

import pandas as pd


def runs_of(root: str, op: str) -> pd.DataFrame:
    """Every stable ok row of the op's evaluation shapes that the loader would merge, with a run id
    (data file + GPU uuid): the loader's own rules before its merge (out-of-memory shapes demoted,
    decode rows under an older L2 policy superseded) are applied first, so only rows that count
    are compared."""
    from gemm_costmodel.data import dataset

    frames = []
    for path in dataset.dataset_files(os.path.join(root, op)):
        df = dataset.read_file(path)
        frames.append(df.assign(run=os.path.basename(path) + ":" + df["gpu_uuid"].astype(str)))
    df, _ = dataset.demote_oom_eval_shapes(pd.concat(frames, ignore_index=True))
    df = dataset.supersede_l2_policies(df)
    keep = (df["status"] == "ok") & df["stable"].fillna(False).astype(bool) & df["eval_shape"].astype(bool)
    return df[keep]


# A shape's identity beyond (M, N, K, dtype): the GPU (runs of two GPU models are never compared)
# and, for MoE, the experts, the stage and the routing.
GROUP = ["gpu_name", "dtype", "m", "n", "k", "e", "top_k", "stage", "routing"]


def disputed(df: pd.DataFrame, near: float, spread: float, max_runs: int = 2) -> pd.DataFrame:
    """The disputed shapes of df (rows with a ``run`` column); a shape whose every near candidate
    has more than max_runs runs already has a median that rejects one run's glitch, and is left out."""
    out = []
    group = [c for c in GROUP if c in df.columns]
    for key, g in df.groupby(group, observed=True, sort=True):
        t = g.pivot_table(index="candidate", columns="run", values="p50_us", aggfunc="median", observed=True)
        t = t.dropna(thresh=2)  # a candidate timed in at least two runs
        if t.empty:
            continue
        med = t.median(axis=1)
        top = t[med <= med.min() * near]
        if int(top.notna().sum(axis=1).min()) > max_runs:
            continue
        worst = float((top.max(axis=1) / top.min(axis=1)).max())
        k = dict(zip(group, key))
        out.append({"M": k["m"], "N": k["n"], "K": k["k"], "dtype": k["dtype"],
                    **{c: k[c] for c in ("gpu_name", "e", "top_k", "stage", "routing") if c in k},
                    "runs": t.shape[1], "near_candidates": len(top), "max_spread": round(worst, 4),
                    "best_us": round(float(med.min()), 3)})
    res = pd.DataFrame(out)
    if res.empty:
        return res
    return res[res["max_spread"] > spread].reset_index(drop=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="fp8_blockscale")
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--near", type=float, default=1.10, help="candidates within this factor of the best")
    ap.add_argument("--spread", type=float, default=1.05, help="max/min over runs above this: disputed")
    ap.add_argument("--max-runs", type=int, default=2,
                    help="only shapes with a near candidate timed in at most this many runs (a third run's target)")
    ap.add_argument("--out", required=True, help="CSV: M,N,K,dtype (the bench --only format) and the spread")
    args = ap.parse_args(argv)
    res = disputed(runs_of(args.root, args.op), args.near, args.spread, args.max_runs)
    res.to_csv(args.out, index=False)
    print(f"{len(res)} disputed shapes -> {args.out}")
    print(res.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
