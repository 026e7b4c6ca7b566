"""Exploration (kept as a record; not in the package): does a nearest-neighbour feature help the
fp8_blockscale M = 1 GEMV picks? (issue 16)

The M = 1 misses pick between GEMV configs whose order turns on the weight's exact N and K
(docs/decisions/041-power-of-two-features.md, "Power-of-two features"); a neighbouring training weight of the same K often
has the right order (at K = 7168 every yi-1.5 weight with N >= 9216 prefers n1k1024_w4, and the
DeepSeek-V3 fold picks n4k1024_w4 at 12288, 24576 and 36864). Stacking a lookup into the model
gives it that order as an input: for each candidate, log2 of its slowdown on the nearest other
training weight (same K first, then the nearest N; and the second nearest), missing where that
weight lacks the candidate. Training rows take their neighbours among the other training
weights (never their own: that would be the label), test rows among the fold's training weights.

A serving model with this feature would ship a table of training timings beside the ONNX file;
this script only measures whether the feature is worth that, on the fast M = 1 loop's folds
(``fp8bs_m1_loop.py``: the op's shipped hyperparameters, M = 1 rows only, 37 held-out shapes).

    python benchmarks/explore/fp8bs_m1_knn.py --seeds 0,1,2,3,4 [--neighbours 2]
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd


def neighbour_table(train: pd.DataFrame) -> tuple[np.ndarray, dict, list]:
    """The training weights (n, k), per weight {candidate: log2 slowdown} (median of its rows), and
    per weight (in the order of the first) the set of families it comes from."""
    from gemm_costmodel.learning.evaluate import families_of

    t = train.assign(_slow=train["p50_us"] / train.groupby(["n", "k"])["p50_us"].transform("min"))
    tab, fams = {}, {}
    for (n, k), g in t.groupby(["n", "k"]):
        tab[(int(n), int(k))] = np.log2(g.groupby("candidate")["_slow"].median()).to_dict()
        fams[(int(n), int(k))] = set().union(*g["origins"].map(families_of))
    weights = np.array(sorted(tab))
    return weights, tab, [fams[tuple(int(v) for v in w)] for w in weights]


def nearest(weights: np.ndarray, n: int, k: int, count: int, exclude_self: bool, skip=None) -> list[tuple[int, int]]:
    """The count nearest training weights to (n, k): same K ranks first (K distance weighted 4x),
    then the nearest N, both in log2; ``skip``: a mask of weights not to use."""
    d = 4 * np.abs(np.log2(weights[:, 1]) - np.log2(k)) + np.abs(np.log2(weights[:, 0]) - np.log2(n))
    if exclude_self:
        d = np.where((weights[:, 0] == n) & (weights[:, 1] == k), np.inf, d)
    if skip is not None:
        d = np.where(skip, np.inf, d)
    order = np.argsort(d, kind="stable")[:count]
    return [tuple(int(v) for v in weights[i]) for i in order if np.isfinite(d[i])]


def knn_features(rows: pd.DataFrame, weights, tab, count: int, exclude_self: bool, fams=None) -> np.ndarray:
    """With ``fams`` (training rows): neighbours only from other families, as a held-out family's
    shapes have them (a training weight's nearest is often its own family's other TP shard)."""
    from gemm_costmodel.learning.evaluate import families_of

    out = np.full((len(rows), count + 1), np.nan)
    cand = rows["candidate"].astype(str).to_numpy()
    for (n, k), idx in rows.groupby(["n", "k"]).indices.items():
        skip = None
        if fams is not None:
            own = set().union(*rows["origins"].iloc[idx].map(families_of))
            skip = np.array([bool(own & f) for f in fams])
        nb = nearest(weights, int(n), int(k), count, exclude_self, skip)
        for j, w in enumerate(nb):
            out[idx, j] = [tab[w].get(c, np.nan) for c in cand[idx]]
        # How far the first neighbour is (log2 N apart; large when K differs): how much to trust it.
        if nb:
            out[idx, count] = 4 * abs(np.log2(nb[0][1] / k)) + abs(np.log2(nb[0][0] / n))
    return out


def main():
    import fp8bs_m1_loop as loop

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--neighbours", type=int, default=2)
    ap.add_argument("--variants", default="base,knn", help="base, knn (other weights), knnfam (other families)")
    args = ap.parse_args()
    folds = loop.m1_folds()
    tables = {}  # per fold: its training and test rows share one neighbour table
    for name in args.variants.split(","):
        def feats(t, fold, train, name=name):
            x = loop.base_features(t)
            if name == "base":
                return x
            if fold.name not in tables:
                tables[fold.name] = neighbour_table(loop.training_rows_of(fold))
            weights, tab, fams = tables[fold.name]
            own = fams if name == "knnfam" and train else None
            return np.hstack([x, knn_features(t, weights, tab, args.neighbours, train, own)])

        for seed in (int(s) for s in args.seeds.split(",")):
            loop.report(name, seed, loop.run_folds(folds, seed, feats)[0])


if __name__ == "__main__":
    main()
