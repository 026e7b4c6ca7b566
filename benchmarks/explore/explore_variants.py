"""Exploration (kept as a record): one-launch vs two-launch split-K, and flattened vs
nested persistent loops, on the foundation suite. Writes explore.json under --out."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import precompile
from gemm_costmodel.kernels import timing
from gemm_costmodel.kernels.gemm import kernel as gemm
from gemm_costmodel.kernels.gemm.space import (PersistentConfig, Problem, SplitKConfig, VendorConfig,
                                                 feasible_configs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    timer = timing.GraphTimer()
    shapes = S.foundation_suite("bf16")
    res = []
    plan = []
    for sh in shapes:
        p = Problem(sh.m, sh.n, sh.k, sh.dtype)
        cf = feasible_configs(p)
        if sh.m <= 64:
            cands = [c for c in cf if isinstance(c, SplitKConfig) and c.block_m == 16] + [VendorConfig()]
            toggles = [("SPLITK_SERIAL", False), ("SPLITK_SERIAL", True)]
        else:
            cands = [c for c in cf if isinstance(c, PersistentConfig)] + [VendorConfig()]
            toggles = [("PERSISTENT_FLATTEN", False), ("PERSISTENT_FLATTEN", True)]
        plan.append((sh, p, cands, toggles))
    # Workers compile the module defaults (True); the False variants compile in-process.
    precompile.precompile([(p, c) for sh, p, c, t in plan], workers=14, log=lambda m: print(m, file=sys.stderr))
    for sh, p, cands, toggles in plan:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1)
        ops = [C.make_operands(p, "cuda", gen) for _ in range(timing.copies_for(C.make_operands(p, "cuda", gen).nbytes, 60 << 20))]
        ref = C.reference(ops[0])
        for name, val in toggles:
            setattr(gemm, name, val)
            best, best_id, bad = float("inf"), "", 0
            cub = None
            for c in cands:
                st, err, _ = C.gate(c, ops[0], ref, p.dtype)
                if st != "ok":
                    bad += 1
                    continue
                t = timer.measure(lambda i, c=c: ops[i].run(c), len(ops))
                st2, _, _ = C.gate(c, ops[0], ref, p.dtype)  # counters must be left zero after replays
                bad += st2 != "ok"
                if isinstance(c, VendorConfig):
                    cub = t.p50_us
                elif t.p50_us < best:
                    best, best_id = t.p50_us, c.id
            res.append({"m": p.m, "n": p.n, "k": p.k, "toggle": name, "value": val, "best_us": best,
                        "best_id": best_id, "cublas_us": cub, "failures": bad})
            print(json.dumps(res[-1]), file=sys.stderr, flush=True)
    json.dump(res, open(os.path.join(args.out, "explore.json"), "w"), indent=0)
    for name in ("SPLITK_SERIAL", "PERSISTENT_FLATTEN"):
        import math
        for val in (False, True):
            rows = [r for r in res if r["toggle"] == name and r["value"] == val]
            g = math.exp(sum(math.log(r["cublas_us"] / r["best_us"]) for r in rows) / len(rows))
            print(f"{name}={val}: {len(rows)} shapes, geomean cuBLAS/best {g:.3f}, failures {sum(r['failures'] for r in rows)}")


if __name__ == "__main__":
    main()
