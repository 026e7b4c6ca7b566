"""Unsure mode on the dense GEMM with the graph timer (issue 18), on weights nobody measured.

Unsure mode used to time the dense candidates with eager ``triton.testing.do_bench`` on the call's
operands (1.23x their CUDA-graph time, benchmarks/explore/unsure_timer_check.py); it now times
them as the dataset was timed, in CUDA graphs over rotating synthetic copies (``ops._graph_timer``).
On one GPU, in one process:

1. ops check in unsure mode: ``ops.gemm`` eager, under ``torch.compile(fullgraph=True)`` and
   replayed from a CUDA graph, against the fp32 reference (bf16 and fp8);
2. decisions on 12 bf16 weights of held-out families (Qwen3-32B, Gemma-3-27B, OLMo-2-13B layers
   at TP 1-2; none in the dataset) at M = 1, 16 and 512: the model's top 8, then unsure mode with
   k = 2 and k = 4;
3. evaluation: the model's top 8, every GEMV config (M <= 2), cuBLAS and the registry's default,
   gated, then timed by the harness's CUDA-graph timer over rotating copies in ROUNDS rotated
   rounds (median per candidate); each decision scored against the best of those.

Rows go to OUT (JSON lines, appended; a rerun skips the shapes already there).

    python benchmarks/explore/dense_unsure_check.py OUT.jsonl [--time-budget 300]
"""
import argparse
import json
import os
import sys
import time

import torch

from gemm_costmodel import registry
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.gemm import space as G
from gemm_costmodel.kernels.gemm.impl import ERROR_BOUNDS, make_operands, reference
from gemm_costmodel.serving import ops
from gemm_costmodel.serving.runtime import Dispatcher

import unsure_eval
from unsure_eval import rel

ROUNDS = 3
KS = (2, 4)
NK = [(10240, 5120), (25600, 5120), (5120, 12800), (8192, 5376), (5376, 4096), (21504, 5376), (5376, 10752),
      (15360, 5120), (5376, 5376), (10752, 5376), (12800, 5120), (6400, 5120)]
MS = (1, 16, 512)



def ops_check(cache: str) -> int:
    bad = 0
    ops.enable_unsure_mode(k=2, cache_file=cache)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k, dtype in [(1, 4096, 4096, "bf16"), (16, 5120, 8192, "bf16"), (512, 4096, 4096, "bf16"),
                           (16, 4096, 4096, "fp8"), (1, 1000, 3000, "bf16")]:
        o = make_operands(G.Problem(m, n, k, dtype), "cuda", gen)
        ref = reference(o)
        call = (lambda a, b: ops.gemm_fp8(a, b, o.scale_a, o.scale_b)) if dtype == "fp8" else ops.gemm
        eager = rel(call(o.x, o.w), ref)  # the first call times the top 2
        cid = ops.choose(o.x, o.w, o.scale_a, o.scale_b)
        compiled = rel(torch.compile(call, fullgraph=True)(o.x, o.w), ref)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = call(o.x, o.w)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        graphed = rel(y, ref)
        ok = max(eager, compiled, graphed) <= ERROR_BOUNDS[dtype]
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} unsure gemm:{dtype}:{m}x{n}x{k} {cid}: eager {eager:.2e}, "
              f"compiled {compiled:.2e}, graph {graphed:.2e}", flush=True)
    ops.disable_unsure_mode()
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--time-budget", type=float, default=300.0)
    args = ap.parse_args()
    d = Dispatcher()
    ops.set_dispatcher(d)
    bad = ops_check(args.out + ".tuned.json")
    done = set()
    if os.path.isfile(args.out):
        with open(args.out) as fh:
            done = {(r["m"], r["n"], r["k"]) for r in map(json.loads, fh) if r.get("kind") == "shape"}
    gpu = torch.cuda.get_device_name()
    timer = GraphTimer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    t_start = time.perf_counter()
    op = registry.get("gemm")
    for m in MS:
        for n, k in NK:
            if (m, n, k) in done:
                continue
            if time.perf_counter() - t_start > args.time_budget:
                print("time budget spent; rerun to resume", flush=True)
                return 1 if bad else 0
            t0 = time.perf_counter()
            prob = G.Problem(m, n, k, "bf16")
            o = make_operands(prob, "cuda", torch.Generator(device="cuda").manual_seed(n * 7 + k))
            top = [c.candidate for c in d.rank(m, n, k, "bf16", count=8)]
            unsure = {}
            for kk in KS:
                tuner = ops.enable_unsure_mode(k=kk)
                unsure[kk] = ops.choose(o.x, o.w)
                unsure[f"timed{kk}"] = tuner.entries[f"bf16:{m}x{n}x{k}"]["timed"]
                ops.disable_unsure_mode()
            del o
            gemv = [c.id for c in G.feasible_configs(prob) if isinstance(c, G.GemvConfig)]
            cands = [c for c in dict.fromkeys(top + [unsure[kk] for kk in KS] + gemv + ["cublas", op.default_config])
                     if G.check_feasible(G.config_from_id(c), prob)[0]]
            status, times, p50 = unsure_eval.time_candidates("gemm", prob, cands, ERROR_BOUNDS["bf16"], timer, l2,
                                                             ROUNDS)
            unsure_eval.record(args.out, gpu, (m, n, k), top, unsure, KS, status, times, p50, t0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
