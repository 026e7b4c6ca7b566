"""Issue 58: the MoE model's held-out figures on the H200, and what H200 rows do to them.

Leave-one-family-out (the report's scheme: a fold trains on every row whose origins miss the
held-out family, evaluation shapes of other families weighted as usual), with the op's shipped
hyperparameters; every evaluation problem of each card scored against its exact oracle. Variants
name which H200 rows join the H100 rows in training:
  none    no H200 row (the card is new to the model);
  adapt0  the adaptation round's rows (model-guided picks on training problems);
  train0  the random-sampling control (a random sample on one training shard);
  both    adapt0 + train0;
  full    both + the H200 evaluation rows of the other families (a card measured in full).

    python benchmarks/explore/moe_h200_heldout.py --h200 none adapt0 train0 full --h200-dir DIR --out DIR

The H200 parquet files are read from --h200-dir (not under datasets/, so the shipped model and
report do not train on them until a decision says so).
"""
from __future__ import annotations

import argparse
import glob
import os
import time

import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.data import dataset as D
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning.model import CostModel, TrainConfig

H200 = {"adapt0": "moe-adapt0-h200-shard00of01.parquet", "train0": "moe-train-h200-shard00of08.parquet"}
EVAL = ["moe-eval-h200-shard00of01.parquet", "moe-eval-fp8-h200-shard00of01.parquet"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h200", nargs="+", default=["none"], help="variants: none, adapt0, train0, both")
    ap.add_argument("--h200-dir", required=True)
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    op = registry.get("moe")
    base = sorted(glob.glob("datasets/moe/**/*.parquet", recursive=True))
    ev_paths = [os.path.join(args.h200_dir, f) for f in EVAL]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for variant in args.h200:
        extra = {"none": [], "both": list(H200.values()), "full": list(H200.values())}.get(variant, [H200.get(variant, "")])
        paths = base + ev_paths + [os.path.join(args.h200_dir, f) for f in extra]
        df = D.load_dataset(paths)
        df = df[(df["op"] == "moe") & df["dtype"].astype(str).isin(args.dtypes)]
        df = df.assign(**{c: df[c].astype(str) for c in ("dtype", "gpu_name", "variant", "family", "stage", "routing")})
        t0, frames = time.time(), []
        for fold in E.family_folds(df):
            train = fold.train
            if variant != "full":  # the H200's evaluation oracle trains only a card measured in full
                train = train[~((train["gpu_name"] == "NVIDIA H200") & train["eval_shape"].astype(bool))]
            model = CostModel(TrainConfig(**{**op.train_defaults, "n_jobs": args.jobs})).fit(train)
            test = fold.test[~fold.test["suite"].astype(str).str.contains("vllm")]
            test = E.eval_rows(test)
            frames.append(E.per_shape(test, model.score_frame(test)))
        print(f"{variant}: {len(frames)} folds in {time.time() - t0:.0f} s", flush=True)
        ps = pd.concat(frames, ignore_index=True)
        ps.assign(variant=variant).to_csv(os.path.join(args.out, f"per_shape_{variant}.csv"))
        for key, g in ps.groupby(["gpu_name", "dtype", "routing"]):
            s = E.summarize(g)
            rows.append({"variant": variant, "gpu": key[0], "dtype": key[1], "routing": key[2],
                         **{k: s[k] for k in ("shapes", "geomean_slowdown", "match_2pct", "p99_slowdown",
                                              "max_slowdown", "top4_bench_slowdown")}})
        print(pd.DataFrame(rows).to_string(index=False), flush=True)
    pd.DataFrame(rows).to_csv(os.path.join(args.out, "summary.csv"), index=False)


if __name__ == "__main__":
    main()
