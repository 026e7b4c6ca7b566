"""Exploration (issue 18): two model folders' cold decisions, interleaved problem by problem in one
process, so a host's drift and its neighbours hit both alike (run-to-run noise on a shared GPU
host is larger than the difference measured).

For each of the cold benchmark's problems (``dispatch_cpu``'s, same seed), in ``--rounds`` rounds
with the caches cleared, ``select`` on one dispatcher then the other (the order alternating by
round); per folder: wall and thread-CPU percentiles, and how many picks differ between the two.

    python benchmarks/explore/cold_ab.py --before DIR [--after DIR] [--rounds 6] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from gemm_costmodel.benchmarks.dispatch_cpu import cold_problems
from gemm_costmodel.serving.runtime import Dispatcher


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="model folder A")
    ap.add_argument("--after", default=None, help="model folder B (default: the shipped models)")
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--cold", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    probs = cold_problems(args.cold)
    disp = {"before": Dispatcher(gpu_name=args.gpu, models_dir=args.before),
            "after": Dispatcher(gpu_name=args.gpu, models_dir=args.after)}
    for d in disp.values():
        d.warm_up(("bf16", "fp16", "fp8"))
    wall = {k: [] for k in disp}
    cpu = {k: [] for k in disp}
    picks = {k: [] for k in disp}
    for r in range(args.rounds):
        for d in disp.values():
            d.clear_cache()
        order = list(disp.items()) if r % 2 == 0 else list(reversed(disp.items()))
        for p in probs:
            for name, d in order:
                c, t = time.thread_time_ns(), time.perf_counter()
                pick = d.select(*p).candidate
                wall[name].append((time.perf_counter() - t) * 1e6)
                cpu[name].append((time.thread_time_ns() - c) / 1e3)
                if r == 0:
                    picks[name].append(pick)
    res = {"problems": len(probs), "rounds": args.rounds,
           "differ": [list(p) + [a, b] for p, a, b in zip(probs, picks["before"], picks["after"]) if a != b]}
    for k in disp:
        w, c = np.asarray(wall[k]), np.asarray(cpu[k])
        res[k] = {"p50_us": float(np.percentile(w, 50)), "p90_us": float(np.percentile(w, 90)),
                  "p99_us": float(np.percentile(w, 99)), "max_us": float(w.max()),
                  "cpu_p50_us": float(np.percentile(c, 50)), "cpu_p99_us": float(np.percentile(c, 99)),
                  # Per round: each round's p50, to show the spread between rounds.
                  "round_p50_us": [float(np.median(w[i * len(probs):(i + 1) * len(probs)])) for i in range(args.rounds)]}
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
