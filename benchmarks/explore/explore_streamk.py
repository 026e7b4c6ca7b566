"""Exploration: does stream-K (benchmarks/explore/gemm_streamk.py) close the prefill gap?

On the foundation suite's M >= 1024 shapes, times in one process: the best
committed candidate of a previous full sweep (``--base``, a foundation.jsonl[.gz]
of the same GPU model), cuBLAS and a handful of stream-K configs, each checked
against the fp32 reference first. Writes streamk.json and prints the geomean of
cuBLAS / best-of-committed and cuBLAS / best-of-committed-and-stream-K.

    python benchmarks/explore/explore_streamk.py --out OUT \
        --base benchmarks/results/foundation/foundation.jsonl.gz
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import provenance, summary
from gemm_costmodel.kernels import timing
from gemm_costmodel.kernels.gemm.space import DTYPE_BYTES, Problem, VendorConfig, feasible_configs

import gemm_streamk as SK  # beside this script (benchmarks/explore/ is the script's folder)

# One program per SM only: a 128x256x64 3-stage program uses ~213 KB of shared
# memory, so a second one per SM cannot be resident and p=2 only adds slot traffic.
STREAMK = [SK.StreamKConfig(bm, bn, 64, 8, w, s, 1)
           for (bm, bn, w, s) in ((128, 256, 8, 3), (128, 128, 4, 4), (128, 128, 8, 3), (128, 128, 8, 4),
                                  (64, 256, 4, 4))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", required=True, help="full sweep of the foundation suite on this GPU model")
    ap.add_argument("--min-m", type=int, default=1024)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prov = provenance.collect(torch.cuda.current_device())
    base = summary.per_shape(summary.load_rows([args.base])).set_index(["dtype", "m", "n", "k"])
    timer = timing.GraphTimer()
    res = []
    for sh in S.foundation_suite("bf16"):
        if sh.m < args.min_m or (sh.dtype, sh.m, sh.n, sh.k) not in base.index:
            continue
        p = Problem(sh.m, sh.n, sh.k, sh.dtype)
        best_id = base.loc[(sh.dtype, sh.m, sh.n, sh.k), "oracle_id"]
        best_cfg = next(c for c in feasible_configs(p) if c.id == best_id)
        ops, ref = C.operand_sets(p, 0, int(prov.get("l2_bytes") or 50 << 20))
        first = ops[0]
        row = {"m": p.m, "n": p.n, "k": p.k, "base_id": best_id, "streamk": {}, "failures": {}}
        row["base_us"], _ = C.gate_and_time(timer, best_cfg, lambda o: o.run(best_cfg), ops, ref, p.dtype)
        row["cublas_us"], _ = C.gate_and_time(timer, VendorConfig(), lambda o: o.run(VendorConfig()), ops, ref,
                                               p.dtype)
        for cfg in STREAMK:
            if not SK.feasible(cfg, p.k, DTYPE_BYTES[p.dtype])[0]:
                continue
            t, why = C.gate_and_time(timer, cfg, lambda o, c=cfg: SK.launch(c, o.x, o.w, o.out), ops, ref, p.dtype)
            if t is None:
                row["failures"][cfg.id] = why
            else:
                row["streamk"][cfg.id] = t
        if row["base_us"] is None or row["cublas_us"] is None:
            print(f"skip {p.key}: the committed best or cuBLAS failed the gate", file=sys.stderr)
            continue
        sk = min(row["streamk"].values(), default=math.inf)
        row["streamk_best_us"] = sk
        res.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "streamk"}), file=sys.stderr, flush=True)
        del ops, first, ref
    json.dump({"provenance": prov, "shapes": res}, open(os.path.join(args.out, "streamk.json"), "w"), indent=0)

    def gm(f):
        vals = [f(r) for r in res]
        return math.exp(sum(map(math.log, vals)) / len(vals))

    print(f"{len(res)} shapes (M >= {args.min_m}): cuBLAS/base {gm(lambda r: r['cublas_us'] / r['base_us']):.3f}, "
          f"cuBLAS/best-of(base, stream-K) {gm(lambda r: r['cublas_us'] / min(r['base_us'], r['streamk_best_us'])):.3f}; "
          f"stream-K wins {sum(r['streamk_best_us'] < r['base_us'] for r in res)}, "
          f"failures {sum(len(r['failures']) for r in res)}")


if __name__ == "__main__":
    main()
