"""Model-guided training rows for the MoE op (issue 17): which configs to measure next on training
problems. Writes the CSV that `costmodel bench --mode pick:CSV` reads (columns key, candidate).

Why: a MoE training problem holds 24-25 randomly sampled configs, so the ranker rarely sees two
good configs of one problem side by side, while its held-out loss (1.0-1.6% per M bucket at M >=
16) is made of near-ties between good configs. Measuring the configs a model ranks best on
training problems (TVM-style model-guided sampling) gives it those pairs.

The choosing model is trained on the training families' rows only (no evaluation or vLLM-suite
shape: those are held out), with the shipped hyperparameters; it ranks every feasible config of a
seeded sample of training-suite problems (balanced routing, M >= --min-m), and each problem gets
its --top best-ranked configs that no committed row of that problem holds yet. --routing skewed
takes the training suite's skewed problems instead; --skip leaves out the problems of earlier picks.

    python benchmarks/explore/moe_active_picks.py --out benchmarks/results/moe/active/picks.csv \\
        --per-dtype 700 --top 10
    python benchmarks/explore/moe_active_picks.py --out benchmarks/results/moe/active/picks2_skewed.csv \
        --routing skewed --per-dtype 700 --top 10
    python benchmarks/explore/moe_active_picks.py --out benchmarks/results/moe/active/picks2_balanced.csv \
        --per-dtype 700 --top 10 --seed 1 --skip benchmarks/results/moe/active/picks.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import tempfile

from gemm_costmodel import registry
from gemm_costmodel.kernels.moe import suites as SU
from gemm_costmodel.kernels.moe.space import Problem
from gemm_costmodel.learning import pipeline
from gemm_costmodel.learning.model import TrainConfig
from gemm_costmodel.serving.runtime import Dispatcher

GPU = "NVIDIA H100 80GB HBM3"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-dtype", type=int, default=700, help="training problems per dtype")
    ap.add_argument("--top", type=int, default=10, help="new configs per problem")
    ap.add_argument("--min-m", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routing", choices=("balanced", "skewed"), default="balanced",
                    help="balanced problems, or the training suite's skewed ones")
    ap.add_argument("--skip", nargs="*", default=[], help="earlier picks CSVs: their problems are not picked again")
    args = ap.parse_args()
    skip = set()
    for path in args.skip:
        with open(path, newline="") as fh:
            skip |= {r["key"] for r in csv.DictReader(fh)}
    df = pipeline.load_training_frame(op="moe", log=print)
    train = df[~df["eval_shape"].astype(bool)]
    print(f"{len(train)} training rows of {len(df)} (no evaluation or vLLM-suite shape)", flush=True)
    cfg = TrainConfig(**registry.get("moe").train_defaults)
    model = pipeline.train(train, cfg)
    folder = tempfile.mkdtemp(prefix="costmodel-active-")
    pipeline.export_model(model, train, folder)
    disp = Dispatcher(gpu_name=GPU, models_dir=folder, op="moe")
    vendor = set(registry.get("moe").vendor_ids)  # the vendor is each sweep's anchor row anyway
    have = {}
    for key, g in train.groupby(["dtype", "m", "n", "k", "e", "top_k", "stage", "routing"], observed=True):
        have[Problem(int(key[1]), int(key[2]), int(key[3]), str(key[0]), int(key[4]), int(key[5]), str(key[6]),
                     str(key[7])).key] = set(g["candidate"].astype(str))
    rows = []
    for dtype in ("bf16", "fp8"):
        shapes = [s for s in SU.training_suite(dtype) if s.m >= args.min_m
                  and (s.routing == "balanced") == (args.routing == "balanced")]
        shapes = sorted(set(shapes), key=lambda s: s.key)
        random.Random(args.seed).shuffle(shapes)
        n = 0
        for s in shapes:
            prob = Problem(s.m, s.n, s.k, dtype, s.e, s.top_k, s.stage, s.routing)
            if prob.key not in have or prob.key in skip:
                continue  # not measured yet (nothing to pair the new rows with), or picked before
            ranked = disp.rank(s.m, s.n, s.k, dtype, count=4 * args.top, e=s.e, top_k=s.top_k,
                               stage=s.stage, routing=s.routing)
            new = [c.candidate for c in ranked if c.candidate not in have[prob.key] and c.source == "model"
                   and c.candidate not in vendor][:args.top]
            rows += [{"key": prob.key, "candidate": c} for c in new]
            n += 1
            if n == args.per_dtype:
                break
        print(f"{dtype}: {n} problems, {sum(r['key'].startswith(dtype) for r in rows)} new configs", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["key", "candidate"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} picks to {args.out}")


if __name__ == "__main__":
    main()
