"""Exploration (kept as a record): do wide split-K configs (128-row tiles, one-launch
reduction) close the prefill gap on small-N shapes? Times extra candidates next to the
committed space's best and cuBLAS on the foundation suite's M >= 1024 shapes."""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

import torch

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import precompile
from gemm_costmodel.kernels import timing
from gemm_costmodel.kernels.gemm.space import (ARCHS, Problem, SplitKConfig, VendorConfig, check_feasible,
                                                 feasible_configs, static_feasible)

EXTRA = [SplitKConfig(bm, bn, bk, sk, w, s)
         for bm, bn, bk, sk, (w, s) in itertools.product((64, 128), (128, 256), (64,), (2, 3, 4),
                                                         ((8, 3), (8, 4), (4, 4)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    timer = timing.GraphTimer()
    plan = []
    for sh in S.foundation_suite("bf16"):
        if sh.m < 1024:
            continue
        p = Problem(sh.m, sh.n, sh.k, sh.dtype)
        base = feasible_configs(p)
        extra = [c for c in EXTRA if c not in base and static_feasible(c, ARCHS["sm90"], p.dtype)[0]
                 and check_feasible(c, p)[0]]
        plan.append((p, base, extra))
    precompile.precompile([(p, b + e) for p, b, e in plan], workers=14, log=lambda m: print(m, file=sys.stderr))
    res = []
    for p, base, extra in plan:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(3)
        first = C.make_operands(p, "cuda", gen)
        ops = [first] + [C.make_operands(p, "cuda", gen) for _ in range(timing.copies_for(first.nbytes, 60 << 20) - 1)]
        ref = C.reference(first)
        best = {"base": (math.inf, ""), "extra": (math.inf, "")}
        cub = None
        for group, cands in (("base", base), ("extra", extra)):
            for c in cands:
                st, _, _ = C.gate(c, first, ref, p.dtype)
                if st != "ok":
                    print(f"FAIL {p.key} {c.id} {st}", file=sys.stderr)
                    continue
                t = timer.measure(lambda i, c=c: ops[i].run(c), len(ops)).p50_us
                if isinstance(c, VendorConfig):
                    cub = t
                elif t < best[group][0]:
                    best[group] = (t, c.id)
        r = {"m": p.m, "n": p.n, "k": p.k, "cublas_us": cub, "base_us": best["base"][0], "base_id": best["base"][1],
             "extra_us": best["extra"][0], "extra_id": best["extra"][1]}
        res.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    json.dump(res, open(os.path.join(args.out, "explore_prefill.json"), "w"), indent=0)
    g = lambda key: math.exp(sum(math.log(r["cublas_us"] / r[key]) for r in res) / len(res))  # noqa: E731
    both = math.exp(sum(math.log(r["cublas_us"] / min(r["base_us"], r["extra_us"])) for r in res) / len(res))
    print(f"{len(res)} shapes: cuBLAS/base {g('base_us'):.3f}, cuBLAS/extra {g('extra_us'):.3f}, "
          f"cuBLAS/best-of-both {both:.3f}; extra wins {sum(r['extra_us'] < r['base_us'] for r in res)}")


if __name__ == "__main__":
    main()
