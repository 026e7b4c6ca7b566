"""Does a shipped model's cascade pick what the whole model picks? (issues 16 and 17: run after
every retrain; the registry's ``cascade`` keep is the knob.)

Problems: every evaluation (and, for MoE, vLLM-suite stage) shape of each of the op's dtypes, plus
a seeded sample of training-suite ones; for each, ``select`` through the cascade against the whole
model's first (``rank`` scores every candidate with the whole model). Prints the disagreements and,
for each, how far apart the two picks' whole-model scores are.

    python benchmarks/explore/cascade_check.py [--op moe] [--train 300]
    python benchmarks/explore/cascade_check.py --op fp8_blockscale --train 300
    python benchmarks/explore/cascade_check.py --op gemm --cold 500 --keep 16
    python benchmarks/explore/cascade_check.py --op fp8_blockscale --train 300 --gpu "NVIDIA H200"

``--cold N`` adds the cold-decision benchmark's first N problems (``dispatch_cpu``, dense only);
``--keep K`` overrides the loaded models' keep (what a registry change would export).
"""
from __future__ import annotations

import argparse
import random

from gemm_costmodel import registry
from gemm_costmodel.serving.runtime import Dispatcher

GPU = "NVIDIA H100 80GB HBM3"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default=GPU, help="the card whose description the features take (default: %(default)s)")
    ap.add_argument("--op", default="moe", choices=("moe", "fp8_blockscale", "gemm"))
    ap.add_argument("--cold", type=int, default=0, help="the cold-decision benchmark's first N problems too")
    ap.add_argument("--keep", type=int, default=None, help="override the models' keep")
    ap.add_argument("--train", type=int, default=300, help="sampled training problems (all dtypes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    op = registry.get(args.op)
    disp = Dispatcher(gpu_name=args.gpu, op=args.op)
    dtypes = op.dtypes
    probs = []
    for dtype in dtypes:
        probs += [(dtype, s) for name in ("eval", "vllm") if name in op.suites for s in op.suite(name, dtype)]
    train = [(d, s) for d in dtypes for s in op.suite("train", d)]
    random.Random(args.seed).shuffle(train)
    probs += train[:args.train]
    if args.cold:
        from types import SimpleNamespace

        from gemm_costmodel.benchmarks.dispatch_cpu import cold_problems

        cold = cold_problems(args.cold)
        probs += [(d, SimpleNamespace(m=m, n=n, k=k, e=1, top_k=1, key=(m, n, k))) for m, n, k, d in cold]
    probs = list({(d, s.key): (d, s) for d, s in probs}.values())
    if args.keep is not None:
        for d in dtypes:
            c = disp.model_for(d).cascade
            if c:
                disp.model_for(d).cascade = (c[0], c[1], args.keep)
    keep = {d: disp.model_for(d).cascade[2] for d in dtypes if disp.model_for(d).cascade}
    print(f"{len(probs)} problems; cascade keep {keep}")
    miss = 0
    for dtype, s in probs:
        fields = dict(e=s.e, top_k=s.top_k, stage=s.stage, routing=s.routing) if args.op == "moe" else {}
        pick = disp.select(s.m, s.n, s.k, dtype, **fields)
        ranked = disp.rank(s.m, s.n, s.k, dtype, count=200, **fields)
        if pick.candidate != ranked[0].candidate:
            miss += 1
            ids = [c.candidate for c in ranked]
            pos = ids.index(pick.candidate) if pick.candidate in ids else -1
            gap = ranked[pos].score - ranked[0].score if pos >= 0 else float("nan")
            print(f"  {dtype} {s.m}x{s.n}x{s.k} {fields}: cascade {pick.candidate} "
                  f"(whole model's #{pos + 1}, score gap {gap:.3f}), whole model {ranked[0].candidate}")
    print(f"cascade = whole model on {len(probs) - miss} of {len(probs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
