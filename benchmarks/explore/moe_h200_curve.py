"""Issue 58: the MoE adaptation curve on the H200 (held-out bf16 figures vs device-minutes of H200 rows).

Scheme (one model per point, cheap enough for many points): every evaluation family held out at
once. A model trains on the rows of training-suite problems none of whose origins is an evaluation
family (H100 rows, plus the H200 rows of the point), with the op's shipped hyperparameters; it is
scored on every evaluation problem the H200 oracle holds (and the H100's, to watch that card).

Points: "none" (no H200 row: a card new to the model); the adaptation round's rows
(moe-adapt0-h200: the shipped model's top 8 on seeded training problems) and the random-sampling
control (moe-train-h200 shard 0: 8 random configs per problem) cut to the rows measured within the
first B device-minutes of their sweeps (row timestamps from each sweep's start, precompilation
included); "all" = every H200 training row (both sweeps).

    python benchmarks/explore/moe_h200_curve.py --h200-dir DIR --out benchmarks/results/moe/h200/curve
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

# Sweep starts from the driver's log (benchmarks/results/moe/h200/logs.tar.gz, driver.err).
STARTS = {"moe-adapt0-h200": "2026-11-29T05:43:35+00:00", "moe-train-h200": "2026-11-29T05:46:49+00:00"}
FILES = {"moe-adapt0-h200": "moe-adapt0-h200-shard00of01.parquet", "moe-train-h200": "moe-train-h200-shard00of08.parquet"}
EVAL = ["moe-eval-h200-shard00of01.parquet", "moe-eval-fp8-h200-shard00of01.parquet"]
H200 = "NVIDIA H200"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h200-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budgets", nargs="+", type=float, default=[1.0, 2.0])
    ap.add_argument("--dtypes", nargs="+", default=["bf16"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--gpu-weight", type=float, default=1.0, help="weight factor of the H200's queries")
    ap.add_argument("--points", nargs="*", default=None, help="only these labels (none adapt random all_h200_rows)")
    args = ap.parse_args()
    op = registry.get("moe")
    base = sorted(glob.glob("datasets/moe/**/*.parquet", recursive=True))
    df = D.load_dataset(base + [os.path.join(args.h200_dir, f) for f in EVAL + list(FILES.values())])
    df = df[(df["op"] == "moe") & df["dtype"].astype(str).isin(args.dtypes)]
    df = df.assign(**{c: df[c].astype(str) for c in ("dtype", "gpu_name", "variant", "family", "stage", "routing")})
    is_eval = df["eval_shape"].astype(bool)
    eval_fams = set(df.loc[is_eval, "family"].astype(str))
    fams = df["origins"].map(E.families_of)
    clean = ~is_eval & ~fams.map(lambda s: bool(s & eval_fams))
    h100_train = df[clean & (df["gpu_name"] != H200)]
    test = E.eval_rows(df[is_eval & ~df["suite"].astype(str).str.contains("vllm")])
    h200 = {name: df[clean & (df["suite"].astype(str) == name)] for name in FILES}
    for name, g in h200.items():
        ts = pd.to_datetime(g["timestamp"], utc=True)
        h200[name] = g.assign(minute=(ts - pd.Timestamp(STARTS[name])).dt.total_seconds() / 60)
        print(f"{name}: {len(g)} rows, last at {h200[name]['minute'].max():.2f} device-minutes", flush=True)
    points = [("none", 0.0, h100_train)]
    for b in args.budgets + [None]:
        for name, label in (("moe-adapt0-h200", "adapt"), ("moe-train-h200", "random")):
            g = h200[name] if b is None else h200[name][h200[name]["minute"] <= b]
            points.append((label, b if b is not None else round(h200[name]["minute"].max(), 2),
                           pd.concat([h100_train, g])))
    points.append(("all_h200_rows", round(sum(g["minute"].max() for g in h200.values()), 2),
                   pd.concat([h100_train, *h200.values()])))
    os.makedirs(args.out, exist_ok=True)
    rows, frames = [], []
    if args.points:
        points = [p for p in points if p[0] in args.points]
    for label, minutes, train in points:
        t0 = time.time()
        model = CostModel(TrainConfig(**{**op.train_defaults, "n_jobs": args.jobs, "weight_gpu": H200,
                                         "gpu_weight": args.gpu_weight})).fit(train)
        ps = E.per_shape(test, model.score_frame(test)).assign(point=label, minutes=minutes)
        frames.append(ps)
        n_h200 = int((train["gpu_name"] == H200).sum())
        for (gpu, dtype), g in ps.groupby(["gpu_name", "dtype"]):
            s = E.summarize(g)
            rows.append({"point": label, "gpu_weight": args.gpu_weight, "device_minutes": minutes, "h200_rows": n_h200, "gpu": gpu, "dtype": dtype,
                         **{k: round(s[k], 4) for k in ("shapes", "geomean_slowdown", "match_2pct", "p99_slowdown",
                                                          "max_slowdown")}})
        print(f"{label} @ {minutes} min ({n_h200} H200 rows): {time.time() - t0:.0f} s", flush=True)
        print(pd.DataFrame(rows).tail(2).to_string(index=False), flush=True)
    pd.DataFrame(rows).to_csv(os.path.join(args.out, "curve.csv"), index=False)
    pd.concat(frames).to_csv(os.path.join(args.out, "per_shape.csv.gz"), index=False)


if __name__ == "__main__":
    main()
