"""Exploration (kept as a record; not in the package): a fast leave-one-family-out loop over the
fp8_blockscale M = 1 problems alone, for screening feature ideas for the M = 1 GEMV picks.

A rank model (the op's shipped hyperparameters: 300 trees, depth 8, eta 0.1, 1% grades, evaluation
shapes weighted 6) is trained on the M = 1 rows of each fold's training families only and picks
on the fold's held-out M = 1 evaluation shapes (37 in all). One variant and seed take about 40 s on
two cores, against about 7 minutes for the whole op's CV, so an idea is screened over several
seeds before a full CV (cv_variants.py) measures it on every M. Features are the op's registered
ones plus optional extras:

- ``gemv``: the GEMV's own work decomposition (programs, K steps, accumulators per thread, a
  register-bound occupancy, waves, bytes in flight, waves x K steps; as the MoE op's);
- ``tail``: the last wave's fill;
- ``pow2``: the power-of-two parts of N and K (now the op's registered features, so this extra
  only matters on a checkout from before them);
- ``odd``: log2 of the odd parts of N and K (N / 2^pow2(N): what tells K = 7168 from 5120 beside
  log2 K);
- ``stride``: the power of two and odd part of a GEMV program's row stride, block_n x K bytes.

    python benchmarks/explore/fp8bs_m1_loop.py --variants '{"base": {}, "gemv": {"_extra": ["gemv"]}}' --seeds 0,1,2
    python benchmarks/explore/fp8bs_m1_loop.py --seeds 0 --train-max-m 2

By default the loop's model is the M = 1 trees fitted on the M = 1 rows alone ("M = 1 trees of
their own" in docs/decisions/). ``--train-max-m`` fits it on the rows with M <= that instead (the
M = 1 shapes are scored either way); the shipped M = 1 trees are ``--train-max-m 100000`` with
``{"_m1w": 20}`` ("A low side fitted on every M"). Per shape it also reports the best-ranked tiled config against the
best tiled one, ranked at M = 1 and as M = 2: what vLLM's M = 1 key would get from such trees.
``--test-m 16`` (with ``--train-min-m``/``--train-max-m``) scores another M's evaluation shapes:
M = 16 fitted on M <= 16 or on 2 <= M <= 32 read as the whole model (docs/decisions/).

Screened this way (M = 1 within 2% of 37, seeds 0-4; docs/decisions/041-power-of-two-features.md, "Power-of-two features"):
shipped features 26 / 25 / 24 / 27 / 25; + pow2 28 / 29 / 24 / 27 / 29; + gemv (seeds 0-1) 23 / 24;
+ pow2, gemv and tail 26 / 27 / 26 / 25 / 27. With pow2 registered (seeds 0-2): 32 pairs per document 25 / 27 / 25;
`mean` pair sampling 17 / 21 / 22; evaluation weight 1: 26 / 29 / 28; 2% rank grades 29 / 27 / 28.
With pow2 registered, seeds 0-4 (shipped: 28 / 29 / 24 / 27 / 29, mean 27.4): + odd 27 / 26 / 26 / 29 / 25
(26.6); + stride 25 / 27 / 26 / 26 / 28 (26.4). Neither is kept. Simpler trees for M = 1 (same seeds):
depth 4 27 / 27 / 26 / 25 / 26 (26.2), depth 6 25 / 25 / 25 / 24 / 25 (24.8), min_child_weight 8
24 / 26 / 26 / 25 / 26 (25.4): none beats depth 8.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pandas as pd


def extra(t: pd.DataFrame, kinds) -> np.ndarray:
    cols = []
    g = (t["variant"].astype(str) == "gemv").to_numpy().astype(float)
    n, k = t["n"].to_numpy(float), t["k"].to_numpy(float)
    bn, bk, w = t["block_n"].to_numpy(float), t["block_k"].to_numpy(float), t["num_warps"].to_numpy(float)
    progs, steps, acc = np.ceil(n / bn), np.ceil(k / bk), bn * bk / (32 * w)
    regs = np.minimum(255.0, 2 * acc + bk / (32 * w) + 32)
    occ = np.clip(np.floor(65536 / (32 * w * regs)), 1, np.floor(64 / w))
    waves = progs / (132 * occ)
    if "gemv" in kinds:
        cols += [np.log2(progs) * g, steps * g, acc * g, occ * g, waves * g,
                 np.log2(np.minimum(occ, np.ceil(progs / 132)) * bn * bk / 1024) * g, np.ceil(waves) * steps * g]
    if "pow2" in kinds:
        from gemm_costmodel.kernels.fp8_blockscale.features import pow2_part

        cols += [pow2_part(t["n"].to_numpy()), pow2_part(t["k"].to_numpy())]
    if "odd" in kinds:
        from gemm_costmodel.kernels.fp8_blockscale.features import pow2_part

        nn, kk = t["n"].to_numpy(), t["k"].to_numpy()
        cols += [np.log2(nn / 2.0 ** pow2_part(nn)), np.log2(kk / 2.0 ** pow2_part(kk))]
    if "stride" in kinds:
        from gemm_costmodel.kernels.fp8_blockscale.features import pow2_part

        # A program's rows start block_n * K bytes apart: that stride's power of two and odd part.
        st = (np.where(g > 0, bn, 1) * k).astype(np.int64)
        p2 = pow2_part(st)
        cols += [p2 * g, np.log2(st / 2.0 ** p2) * g]
    if "tail" in kinds:
        cols += [(waves - np.floor(waves)) * g, (np.ceil(waves) - waves) * g]
    return np.stack(cols, 1) if cols else np.zeros((len(t), 0))


def m1_folds(train_max_m: int = 1, test_m: int = 1, train_min_m: int = 1, add_data=None,
             test_gpu: str = "NVIDIA H100 80GB HBM3"):
    """The family folds of the op's evaluation shapes at M = test_m, trained on the rows with
    train_min_m <= M <= train_max_m (by default the M = 1 rows alone, tested at M = 1).
    add_data: a folder of more parquet files (another card's rows) to train on; the held-out
    shapes are always test_gpu's."""
    import glob
    import os

    from gemm_costmodel.data import dataset
    from gemm_costmodel.learning import evaluate, pipeline

    paths = None
    if add_data:
        paths = dataset.dataset_files("datasets") + sorted(glob.glob(os.path.join(add_data, "**", "*.parquet"),
                                                                     recursive=True))
    df = pipeline.load_training_frame(paths, op="fp8_blockscale")
    folds = evaluate.family_folds(df[(df["m"] >= train_min_m) & (df["m"] <= train_max_m)])
    folds = [dataclasses.replace(f, test=f.test[(f.test["m"] == test_m) & (f.test["gpu_name"] == test_gpu)])
             for f in folds]
    return [f for f in folds if len(f.test)]


def training_rows_of(fold) -> pd.DataFrame:
    """The fold's rows a model learns from (timed ok and stable)."""
    from gemm_costmodel.learning.model import training_rows

    return training_rows(fold.train)


def run_folds(folds, seed: int, feats, params: dict | None = None) -> tuple[np.ndarray, list]:
    """Train on each fold's training rows and pick on its held-out shapes: (slowdowns, one
    DETAIL_COLUMNS tuple per shape). ``feats(rows, fold, train)``: the float feature matrix of rows
    (training rows with train=True, the fold's test rows with False). ``params``: xgboost params
    over the shipped ones, plus _ew (evaluation weight), _m1w (M = 1 queries' weight factor), _step
    (rank grade step), _rounds."""
    import xgboost as xgb

    from gemm_costmodel.learning.model import shape_ids, targets

    params = params or {}
    tot, det = [], []
    for fold in folds:
        rows = training_rows_of(fold)
        rows = rows.assign(_sid=shape_ids(rows)).sort_values("_sid", kind="stable")
        dm = xgb.DMatrix(np.asarray(feats(rows, fold, True), dtype=np.float32),
                         label=targets(rows, "rank", params.get("_step", 1.01)))
        wt = np.where(rows["eval_shape"].astype(bool).to_numpy(), params.get("_ew", 6.0), 1.0)
        # _m1w: the M = 1 queries' weight over the rest (for a low side fitted on every M).
        wt = wt * np.where(rows["m"].to_numpy() == 1, params.get("_m1w", 1.0), 1.0)
        dm.set_group(rows.groupby("_sid", sort=True).size().to_numpy())
        dm.set_weight(rows.assign(_w=wt).groupby("_sid", sort=True)["_w"].max().to_numpy())
        p = {"eta": 0.1, "max_depth": 8, "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 2.0,
             "lambda": 1.0, "max_bin": 256, "nthread": 2, "seed": seed, "tree_method": "hist",
             "objective": "rank:pairwise", "lambdarank_pair_method": "topk", "lambdarank_num_pair_per_sample": 8}
        p.update({k: v for k, v in params.items() if not k.startswith("_")})
        # _nseeds > 1: that many boosters (seeds seed, seed + 1, ...), their margins averaged.
        bs = [xgb.train({**p, "seed": seed + i}, dm, num_boost_round=params.get("_rounds", 300))
              for i in range(params.get("_nseeds", 1))]

        def margin(x):
            return np.mean([b.predict(xgb.DMatrix(x), output_margin=True) for b in bs], axis=0)

        x_test = np.asarray(feats(fold.test, fold, False), dtype=np.float32)
        t = fold.test.assign(score=-margin(x_test))
        # The same rows scored as M = 2 problems: a tiled program at M = 1 and M = 2 is the same work
        # (BLOCK_SIZE_M >= 16), so this is another way to rank the tiled configs for vLLM's M = 1 key.
        # Only M = 1 shapes have that reading; others get none (NaN).
        t["score2"] = np.nan
        one = t["m"].to_numpy() == 1
        if one.any():
            x2 = np.asarray(feats(fold.test[one].assign(m=2), fold, False), dtype=np.float32)
            t.loc[one, "score2"] = -margin(x2)
        for (n, k), g in t.groupby(["n", "k"]):
            i = int(np.argmin(g["score"].to_numpy()))
            s = g["p50_us"].iloc[i] / g["p50_us"].min()
            tot.append(s)
            # What vLLM's file would get at M = 1: the best-ranked tiled config (vLLM's kernel).
            tl = g[g["variant"].astype(str) == "tiled"]
            if not len(tl):  # a frame cut to one variant (fp8bs_gemv_ranker.py) has no tiled rows
                det.append((fold.name, n, k, g["candidate"].iloc[i], s, None, np.nan, np.nan))
                continue
            j = int(np.argmin(tl["score"].to_numpy()))
            s2 = np.nan
            if tl["score2"].notna().all():
                s2 = tl["p50_us"].iloc[int(np.argmin(tl["score2"].to_numpy()))] / tl["p50_us"].min()
            det.append((fold.name, n, k, g["candidate"].iloc[i], s, tl["candidate"].iloc[j],
                        tl["p50_us"].iloc[j] / tl["p50_us"].min(), s2))
    return np.array(tot), det


DETAIL_COLUMNS = ["family", "n", "k", "pick", "slowdown", "tiled_pick", "tiled_slowdown", "tiled_slowdown_at_m2"]


def report(name: str, seed: int, tot: np.ndarray, det=None) -> None:
    tiled = ""
    if det:
        ts, t2 = np.array([d[6] for d in det]), np.array([d[7] for d in det])
        tiled = (f"; best-ranked tiled config vs the best tiled: geomean {np.exp(np.log(ts).mean()):.3f}, worst "
                 f"{ts.max():.2f}")
        if not np.isnan(t2).any():
            tiled += f" (ranked as M = 2: {np.exp(np.log(t2).mean()):.3f}, {t2.max():.2f})"
    print(f"{name} seed {seed}: within 2% {int((tot <= 1.02).sum())} of {len(tot)}, "
          f"geomean {np.exp(np.log(tot).mean()):.4f}, worst {tot.max():.3f}{tiled}", flush=True)


def base_features(t: pd.DataFrame) -> np.ndarray:
    """The op's registered features of a frame."""
    from gemm_costmodel.serving import features as F
    from gemm_costmodel.kernels import hardware

    return F.from_frame(t, hardware.spec_for)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default='{"base": {}}',
                    help="JSON {name: params}: xgboost params, plus _extra (list), _ew (evaluation weight), "
                         "_m1w (M = 1 queries' weight factor), _step (rank grade step), _rounds, _nseeds (boosters averaged)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default=None, help="folder for per-shape CSVs (name_sSEED.csv)")
    ap.add_argument("--train-max-m", type=int, default=1,
                    help="train on the rows with M <= this (the M = 1 picks are scored either way)")
    ap.add_argument("--train-min-m", type=int, default=1, help="and M >= this")
    ap.add_argument("--test-m", type=int, default=1, help="score the evaluation shapes of this M (default 1)")
    ap.add_argument("--add-data", default=None,
                    help="folder of more parquet files to train on (another card's rows); the test stays the H100's")
    ap.add_argument("--test-gpu", default="NVIDIA H100 80GB HBM3", help="whose held-out shapes are scored")
    ap.add_argument("--train-gpu", default=None, help="learn only from this GPU's rows (default: every GPU's)")
    args = ap.parse_args()
    folds = m1_folds(args.train_max_m, args.test_m, args.train_min_m, args.add_data, args.test_gpu)
    if args.train_gpu:
        from gemm_costmodel.learning import evaluate

        folds = evaluate.train_on_gpus(folds, [args.train_gpu])
    for name, params in json.loads(args.variants).items():
        def feats(t, fold, train, kinds=params.get("_extra", [])):
            return np.hstack([base_features(t), extra(t, kinds)])

        for seed in (int(s) for s in args.seeds.split(",")):
            tot, det = run_folds(folds, seed, feats, params)
            report(name, seed, tot, det)
            if args.out:
                pd.DataFrame(det, columns=DETAIL_COLUMNS).to_csv(
                    f"{args.out}/{name}_s{seed}.csv", index=False)


if __name__ == "__main__":
    main()
