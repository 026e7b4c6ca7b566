"""Exploration (kept as a record; issue 18's peer benchmark): do deeper software pipelines (5 or 6
stages) close the mid-M gap to Inductor? Peers run 4 found Inductor's max-autotune template
5% faster than cuBLAS and than every config of our space at 128x4096x14336 and 512x2048x4096;
its picks there were 64x64x128 and 64x128x128 tiles with 5 and 4 stages, 4 warps (our tiled and
persistent families stop at 4 stages). At these shapes a tile grid of about one wave reads the
weight with one CTA per SM, so bytes in flight per SM (stages x tile bytes) bound the bandwidth.

Per shape, in one process: the tiled and persistent configs of every tile shape at 3, 4, 5 and 6
stages (the statically feasible ones), cuBLAS, and torch.compile max-autotune of the same matmul
(its AUTOTUNE pick recorded), each correctness-gated and timed by the harness's CUDA-graph timer
over rotating buffers. Rows go to OUT/deep_stages.jsonl; a per-shape table is printed last.

    python benchmarks/explore/deep_stages.py --out DIR
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
import time

import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import peers, precompile
from gemm_costmodel.kernels import timing
from gemm_costmodel.kernels.gemm.space import (ARCHS, PersistentConfig, Problem, TiledConfig, VendorConfig,
                                                 check_feasible, static_feasible)

# Training-family weights (the peer suite's four, and two more) at mid M.
NK = ((2048, 4096), (6144, 4096), (4096, 14336), (28672, 4096), (5120, 5120), (14336, 4096))
MS = (128, 256, 512)
STAGES = (3, 4, 5, 6)


def candidates(p: Problem) -> list:
    out = []
    for bm, bn, bk, w, s in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (64, 128), (4, 8), STAGES):
        out.append(TiledConfig(bm, bn, bk, 8, w, s))
        if bm >= 64 and bn >= 64:
            out.append(PersistentConfig(bm, bn, bk, 8, w, s))
    spec = ARCHS["sm90"]
    return [c for c in out if static_feasible(c, spec, p.dtype)[0] and check_feasible(c, p)[0]] + [VendorConfig()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "deep_stages.jsonl")
    done = set()
    if os.path.isfile(path):
        done = {(r["m"], r["n"], r["k"]) for r in map(json.loads, open(path)) if r.get("candidate") == "inductor"}
    plan = [(Problem(m, n, k, "bf16"),) for n, k in NK for m in MS if (m, n, k) not in done]
    plan = [(p, candidates(p)) for (p,) in plan]
    precompile.precompile([(p, [c for c in cs if not isinstance(c, VendorConfig)]) for p, cs in plan],
                          workers=14, log=lambda m: print(m, file=sys.stderr, flush=True))
    peers._inductor_setup(tempfile.mkdtemp(prefix="costmodel-deep-stages-"))
    timer = timing.GraphTimer()
    for p, cands in plan:
        ops, ref = C.operand_sets(p, 7, 50 << 20)
        first = ops[0]
        rows = []
        for c in cands:
            st, _, detail = C.gate(c, first, ref, p.dtype)
            r = {"m": p.m, "n": p.n, "k": p.k, "candidate": c.id, "variant": c.variant,
                 "stages": getattr(c, "num_stages", None), "status": st}
            if st == "ok":
                t = timer.measure(lambda i, c=c: ops[i].run(c), len(ops))
                r.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable)
            else:
                r["error"] = str(detail)[:300]
            rows.append(r)
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w: x @ w.t(), mode="max-autotune-no-cudagraphs", dynamic=False)
        t0 = time.perf_counter()
        _, text = peers.capture_stderr(lambda: (fn(first.x, first.w), torch.cuda.synchronize()))
        pick = (peers.parse_autotune(text) or [{}])[0]
        r = {"m": p.m, "n": p.n, "k": p.k, "candidate": "inductor", "variant": "inductor",
             "compile_s": time.perf_counter() - t0, "inductor_choice": pick.get("choice"),
             "inductor_choice_description": pick.get("description")}
        r["status"], _, detail = C.gate(VendorConfig(), first, ref, p.dtype,
                                        run=lambda: first.out.copy_(fn(first.x, first.w)))
        if r["status"] == "ok":
            t = timer.measure(lambda i: fn(ops[i].x, ops[i].w), len(ops))
            r.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable)
        rows.append(r)
        with open(path, "a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
        del ops, first, ref, fn
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        print(summary_line(rows), file=sys.stderr, flush=True)
    all_rows = [json.loads(x) for x in open(path)]
    shapes = sorted({(r["m"], r["n"], r["k"]) for r in all_rows})
    print("shape | cuBLAS | Inductor | best s<=4 | best s>=5 | best/Inductor")
    for s in shapes:
        print(summary_line([r for r in all_rows if (r["m"], r["n"], r["k"]) == s]))


def summary_line(rows) -> str:
    ok = [r for r in rows if r.get("p50_us")]

    def best(pred):
        sel = [r for r in ok if pred(r)]
        return min(sel, key=lambda r: r["p50_us"]) if sel else {"p50_us": math.inf, "candidate": "-"}

    cub = best(lambda r: r["variant"] == "vendor")
    ind = best(lambda r: r["variant"] == "inductor")
    lo = best(lambda r: r.get("stages") in (3, 4))
    hi = best(lambda r: (r.get("stages") or 0) >= 5)
    r0 = rows[0]
    top = min(cub["p50_us"], lo["p50_us"], hi["p50_us"])
    return (f"{r0['m']}x{r0['n']}x{r0['k']} | {cub['p50_us']:.1f} | {ind['p50_us']:.1f} {ind.get('inductor_choice')} | "
            f"{lo['p50_us']:.1f} {lo['candidate']} | {hi['p50_us']:.1f} {hi['candidate']} | {top / ind['p50_us']:.3f}")


if __name__ == "__main__":
    main()
