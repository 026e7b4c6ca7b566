"""Model-guided training rows (issues 16 and 17): which configs to measure next on training
problems. Writes the CSV that `costmodel bench --mode pick:CSV` reads (columns key, candidate).

Why: a training problem holds a random sample of configs (MoE 24-25, fp8_blockscale 40-44 of
~300), so the ranker rarely sees two good configs of one problem side by side, while its held-out
loss is made of near-ties between good configs. Measuring the configs a model ranks best on
training problems (TVM-style model-guided sampling) gives it those pairs.

The choosing model is trained on the training families' rows only (no evaluation or vLLM-suite
shape: those are held out), with the op's shipped hyperparameters; it ranks every feasible config
of a seeded sample of the op's training-suite problems with --min-m <= M <= --max-m, and each
problem gets its --top best-ranked configs that no committed row of that problem holds yet.
MoE: --routing balanced (default) or skewed picks from the training suite's balanced or skewed
problems. --skip leaves out the problems of earlier picks.

    python benchmarks/explore/active_picks.py --op moe --out benchmarks/results/moe/active/picks.csv \\
        --per-dtype 700 --top 10
    python benchmarks/explore/active_picks.py --op moe --out benchmarks/results/moe/active/picks2_skewed.csv \\
        --routing skewed --per-dtype 700 --top 10
    python benchmarks/explore/active_picks.py --op moe --out benchmarks/results/moe/active/picks2_balanced.csv \\
        --per-dtype 700 --top 10 --seed 1 --skip benchmarks/results/moe/active/picks.csv
    python benchmarks/explore/active_picks.py --op fp8_blockscale --min-m 2 --max-m 512 --top 8 \\
        --per-dtype 100000 --out benchmarks/results/fp8_blockscale/active/picks.csv
    python benchmarks/explore/active_picks.py --op moe --routing any --per-dtype 100000 --top 10 --seed 2 \\
        --skip benchmarks/results/moe/active/picks.csv benchmarks/results/moe/active/picks2.csv \\
        --out benchmarks/results/moe/active/picks3.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import tempfile

from gemm_costmodel import registry
from gemm_costmodel.learning import pipeline
from gemm_costmodel.learning.model import TrainConfig
from gemm_costmodel.serving.runtime import Dispatcher

GPU = "NVIDIA H100 80GB HBM3"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="moe", choices=registry.names())
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-dtype", type=int, default=700, help="training problems per dtype")
    ap.add_argument("--top", type=int, default=10, help="new configs per problem")
    ap.add_argument("--min-m", type=int, default=16)
    ap.add_argument("--max-m", type=int, default=1 << 30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routing", choices=("balanced", "skewed", "any"), default="balanced",
                    help="MoE: balanced problems, the training suite's skewed ones, or both")
    ap.add_argument("--skip", nargs="*", default=[], help="earlier picks CSVs: their problems are not picked again")
    args = ap.parse_args()
    op = registry.get(args.op)
    skip = set()
    for path in args.skip:
        with open(path, newline="") as fh:
            skip |= {r["key"] for r in csv.DictReader(fh)}
    df = pipeline.load_training_frame(op=args.op, log=print)
    train = df[~df["eval_shape"].astype(bool)]
    print(f"{len(train)} training rows of {len(df)} (no evaluation or vLLM-suite shape)", flush=True)
    model = pipeline.train(train, TrainConfig(**op.train_defaults))
    folder = tempfile.mkdtemp(prefix="costmodel-active-")
    pipeline.export_model(model, train, folder)
    disp = Dispatcher(gpu_name=GPU, models_dir=folder, op=args.op)
    vendor = set(op.vendor_ids)  # the vendor is each sweep's anchor row anyway
    fields = list(op.problem_fields)
    have = {}
    for key, g in train.groupby(fields, observed=True):
        have[op.problem_of(dict(zip(fields, key))).key] = set(g["candidate"].astype(str))
    suites = ["train"] + (["train_skewed"] if "train_skewed" in op.suites else [])
    rows = []
    for dtype in op.dtypes:
        shapes = [s for name in suites for s in op.suite(name, dtype) if args.min_m <= s.m <= args.max_m]
        if "routing" in fields and args.routing != "any":
            shapes = [s for s in shapes if (s.routing == "balanced") == (args.routing == "balanced")]
        shapes = sorted(set(shapes), key=lambda s: op.problem_of({f: getattr(s, f) for f in fields}).key)
        random.Random(args.seed).shuffle(shapes)
        n = 0
        for s in shapes:
            f = {k: getattr(s, k) for k in fields}
            prob = op.problem_of(f)
            if prob.key not in have or prob.key in skip:
                continue  # not measured yet (nothing to pair the new rows with), or picked before
            extra = {k: f[k] for k in op.extra_problem_fields()}
            ranked = disp.rank(s.m, s.n, s.k, dtype, count=4 * args.top, e=getattr(s, "e", 1),
                               top_k=getattr(s, "top_k", 1), **extra)
            new = [c.candidate for c in ranked if c.candidate not in have[prob.key] and c.source == "model"
                   and c.candidate not in vendor][:args.top]
            rows += [{"key": prob.key, "candidate": c} for c in new]
            skip.add(prob.key)  # a suite may list a problem twice (other origins)
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
