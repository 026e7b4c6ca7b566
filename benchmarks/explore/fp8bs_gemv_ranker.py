"""Exploration (kept as a record; not in the package): a GEMV-only ranker for fp8_blockscale at M = 1.

Why: on every held-out M = 1 shape but one (K = 128, where no GEMV runs) the best candidate is a
GEMV config, and every M = 1 miss of the shipped model picks a GEMV too: the misses are the order
among the 24 GEMV configs (block_n x block_k x warps), where only one or two configs are within 2%
of the best. The shipped M = 1 trees learn that order beside every tiled, split-K and swap-AB
config's, from pairs drawn across all of them. A ranker fitted on the M = 1 GEMV rows alone
spends every pair on the order that decides the pick.

The screen: leave-one-family-out, the op's registered features and the shipped hyperparameters
(the M = 1 loop's ``run_folds``), on the M = 1 GEMV rows only; each held-out M = 1 shape's GEMV
pick is scored against the shape's best candidate of any kind (the K = 128 shape has no GEMV and
is reported apart). Compare with the shipped M = 1 picks of the same seed (the loop's
``m1w20_sS.csv`` files).

    python benchmarks/explore/fp8bs_gemv_ranker.py --seeds 0,1,2 --variants '{"gemv": {}}' --out DIR
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os

import numpy as np
import pandas as pd


def _loop():
    spec = importlib.util.spec_from_file_location("fp8bs_m1_loop", os.path.join(os.path.dirname(__file__),
                                                                               "fp8bs_m1_loop.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gemv_folds(loop):
    """The M = 1 family folds with both sides cut to GEMV rows; also the best time of any kind per
    held-out (N, K), to score the GEMV pick against the true oracle."""
    folds = loop.m1_folds(1, 1, 1)
    best = {}
    for f in folds:
        for (n, k), g in f.test.groupby(["n", "k"]):  # eval_rows: ok rows only
            best[(int(n), int(k))] = float(g["p50_us"].min())
    out = []
    for f in folds:
        tr = f.train[f.train["variant"].astype(str) == "gemv"]
        te = f.test[f.test["variant"].astype(str) == "gemv"]
        if len(te):
            out.append(dataclasses.replace(f, train=tr, test=te))
    return out, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default='{"gemv": {}}', help="JSON {name: params} as in fp8bs_m1_loop.py")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    loop = _loop()
    folds, best = gemv_folds(loop)
    for name, params in json.loads(args.variants).items():
        def feats(t, fold, train, kinds=params.get("_extra", [])):
            return np.hstack([loop.base_features(t), loop.extra(t, kinds)])

        for seed in (int(s) for s in args.seeds.split(",")):
            _, det = loop.run_folds(folds, seed, feats, params)
            rows = []
            for d in det:
                fam, n, k, pick = d[0], int(d[1]), int(d[2]), d[3]
                fold = next(f for f in folds if f.name == fam)
                g = fold.test[(fold.test["n"] == n) & (fold.test["k"] == k)]
                t = float(g.loc[g["candidate"] == pick, "p50_us"].iloc[0])
                rows.append((fam, n, k, pick, t / best[(n, k)]))
            r = pd.DataFrame(rows, columns=["family", "n", "k", "pick", "slowdown"])
            s = r["slowdown"].to_numpy()
            print(f"{name} seed {seed}: within 2% {int((s <= 1.02).sum())} of {len(s)} GEMV shapes, "
                  f"geomean {np.exp(np.log(s).mean()):.4f}, worst {s.max():.3f}", flush=True)
            if args.out:
                r.to_csv(f"{args.out}/{name}_s{seed}.csv", index=False)


if __name__ == "__main__":
    main()
