"""Exploration (kept as a record; issue 16): can a separate model of the M = 1 GEMV rows alone pick
the fp8_blockscale GEMV config better than the whole model? (docs/decisions/032-every-training-weight-s-gemv-training-shards.md, "Every training
weight's GEMV".)

For each family with M = 1 evaluation shapes: train on the other families' M = 1 GEMV rows
(training and evaluation shapes), pick the best-predicted GEMV config of each held-out evaluation
shape, and score it against the shape's oracle over every candidate. Variants: feature sets (the
shape and config; + a register-bound occupancy with its waves, bytes in flight and serial steps;
+ waves at fixed occupancies; + bytes per program and thread), depth 4 or 6, a pairwise ranker on
1% grades or a regression of log(time / oracle). ``--in-sample`` trains on every family (the
held-out shapes included): whether the features can tell the configs apart at all.

    python benchmarks/explore/fp8bs_m1_ranker.py [--in-sample]
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import xgboost as xgb

from gemm_costmodel.learning import pipeline

SETS = ((), ("occ",), ("waves",), ("bytes",), ("occ", "waves", "bytes"))


def gemv_rows() -> pd.DataFrame:
    df = pipeline.load_training_frame(op="fp8_blockscale")
    d = df[(df["m"] == 1) & (df["status"] == "ok")]
    oracle = d.groupby(["n", "k"])["p50_us"].min().rename("oracle")
    g = d[d["variant"] == "gemv"].join(oracle, on=["n", "k"])
    return g.assign(rel=g["p50_us"] / g["oracle"]).reset_index(drop=True)


def features(g: pd.DataFrame, sets) -> pd.DataFrame:
    bn, bk, w = (g[c].to_numpy(float) for c in ("block_n", "block_k", "num_warps"))
    n, k = g["n"].to_numpy(float), g["k"].to_numpy(float)
    steps, progs = np.ceil(k / bk), np.ceil(n / bn)
    x = {"log2_n": np.log2(n), "log2_k": np.log2(k), "log2_bn": np.log2(bn), "log2_bk": np.log2(bk), "warps": w,
         "k_steps": steps, "pad_k": 1 - k / (steps * bk), "log2_programs": np.log2(progs)}
    if "occ" in sets:  # registers bound the programs per SM: accumulator + converted tile + ~32
        acc = bn * bk / (32 * w)
        occ = np.clip(np.floor(65536 / (32 * w * np.minimum(255, 2 * acc + 32))), 1, np.floor(64 / w))
        waves = progs / (132 * occ)
        x.update(acc=acc, occ=occ, waves=waves, wave_fill=waves / np.ceil(waves),
                 log2_inflight=np.log2(np.minimum(occ, np.ceil(progs / 132)) * bn * bk), serial=np.ceil(waves) * steps)
    if "waves" in sets:
        for o in (4, 8, 16):
            wv = progs / (132 * o / (w / 4))
            x[f"waves{o}"], x[f"fill{o}"] = wv, wv / np.ceil(wv)
    if "bytes" in sets:
        x.update(log2_bytes=np.log2(n * k), log2_prog_bytes=np.log2(bn * k), thread_bytes=bn * bk / (32 * w))
    return pd.DataFrame(x, index=g.index)


def run(g, X, objective: str, depth: int, in_sample: bool) -> tuple[float, float, float]:
    fams = g["family"].astype(str).to_numpy()
    ev = g["eval_shape"].to_numpy(bool)
    qid = pd.factorize(g["n"].astype(np.int64) * 1_000_000 + g["k"].astype(np.int64))[0]
    picks = []
    for fam in np.unique(fams[ev]):
        tr = np.ones(len(g), bool) if in_sample else fams != fam
        te = (fams == fam) & ev
        if objective == "rank":
            idx = np.flatnonzero(tr)
            idx = idx[np.argsort(qid[idx], kind="stable")]
            grade = np.clip(np.floor(30 - np.log(g["rel"].to_numpy()[idx]) / np.log(1.01)), 0, 30)
            m = xgb.XGBRanker(n_estimators=300, max_depth=depth, learning_rate=0.05, subsample=0.8, random_state=0,
                              objective="rank:pairwise")
            m.fit(X.iloc[idx], grade, qid=qid[idx])
            score = -m.predict(X[te])
        else:
            m = xgb.XGBRegressor(n_estimators=300, max_depth=depth, learning_rate=0.05, subsample=0.8,
                                 colsample_bytree=0.8, random_state=0)
            m.fit(X[tr], np.log(g["rel"].to_numpy()[tr]))
            score = m.predict(X[te])
        held = g[te].assign(score=score)
        picks += [q.loc[q["score"].idxmin(), "rel"] for _, q in held.groupby(["n", "k"])]
    s = np.asarray(picks)
    return float(np.exp(np.log(s).mean())), float((s <= 1.02).mean()), float(s.max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in-sample", action="store_true")
    args = ap.parse_args()
    g = gemv_rows()
    print(f"{g.groupby(['n', 'k']).ngroups} weights at M = 1, {int(g['eval_shape'].sum())} evaluation rows")
    for sets in SETS:
        X = features(g, sets)
        for objective in ("rank", "reg"):
            for depth in (4, 6):
                geo, match, worst = run(g, X, objective, depth, args.in_sample)
                print(f"{'+'.join(sets) or 'base':<18} {objective:<5} depth {depth}: geomean {geo:.4f}, "
                      f"within 2% {match:.1%}, worst {worst:.3f}", flush=True)


if __name__ == "__main__":
    main()
