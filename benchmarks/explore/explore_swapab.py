"""Exploration: swap-AB decode kernels (kernels/gemm_swapab.py) on the foundation suite's
decode shapes (M <= 64).

For each shape, times in one process the three best committed candidates of a
previous full sweep (``--base``, same GPU model), cuBLAS, and a grid of swap-AB
configs (weight rows per tile 64/128, tokens per tile = M rounded up to a power
of two >= 8 (and 16 where that is 8), BLOCK_K 64/128/256, split 1/2/4/8, 3/4/6
stages, pointer or TMA loads), each checked against the fp32 reference first.
The swap-AB kernels are compiled beforehand in parallel worker processes.

Before the variant joined the space (c33aaca) its ids read `swapab[tma]_n{rows}m{tokens}...`;
benchmarks/results/explore/swapab_bf16.json keeps those ids. Writes swapab_<dtype>.json and prints the geomean of cuBLAS / best-committed and
cuBLAS / best-of-all, and which parameters the winning swap-AB configs share.

    python benchmarks/explore/explore_swapab.py --out OUT \
        --base benchmarks/results/foundation/foundation.jsonl.gz
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import multiprocessing as mp
import os
import sys
import time

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.benchmarks import summary
from gemm_costmodel.benchmarks.precompile import probe
from gemm_costmodel.kernels.gemm.space import (ARCHS, DTYPE_BYTES, Problem, VendorConfig, config_from_id,
                                                 smem_bytes)


def grid(p: Problem):
    """Swap-AB configs for a decode problem (see module doc); wider than the committed space."""
    from gemm_costmodel.kernels.gemm.space import SwapABConfig, SwapABTmaConfig

    e = DTYPE_BYTES[p.dtype]
    bm0 = max(8, 1 << (p.m - 1).bit_length())
    bms = (bm0, 16) if bm0 == 8 else (bm0,)
    k_tiles = lambda bk: -(-p.k // bk)  # noqa: E731
    out = []
    for bm, bn, bk, split, st, tma in itertools.product(bms, (64, 128), (64, 128, 256), (1, 2, 4, 8),
                                                        (3, 4, 6), (False, True)):
        cfg = (SwapABTmaConfig if tma else SwapABConfig)(bm, bn, bk, split, 4, st)
        if smem_bytes(cfg, p.dtype) > ARCHS["sm90"].smem_per_block or k_tiles(bk) < split:
            continue
        if tma and (p.k * e) % 16:
            continue
        if p.dtype == "fp8" and bk < 32:
            continue
        out.append(cfg)
    return out


def _compile_worker(tasks):
    import torch

    from gemm_costmodel.benchmarks.correctness import make_operands
    from gemm_costmodel.kernels.gemm import swapab as SW

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ops, done = {}, 0
    for cfg, prob in tasks:
        if prob not in ops:
            ops[prob] = make_operands(prob, "cuda", gen)
        o = ops[prob]
        try:
            SW.launch(cfg, o.x, o.w, o.out, o.scale_a, o.scale_b)
            done += 1
        except Exception:  # noqa: BLE001 - the gate meets the failure again and records it
            pass
    torch.cuda.synchronize()
    return done


def precompile(plan, workers: int) -> None:
    seen, tasks = set(), []
    for p, cfgs in plan:
        pr = probe(p)
        for c in cfgs:
            key = (c, pr.n % 16, pr.k)
            if key not in seen:
                seen.add(key)
                tasks.append((c, pr))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        n = sum(pool.map(_compile_worker, [tasks[i::workers] for i in range(workers)]))
    print(f"precompile: {n}/{len(tasks)} in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", required=True, help="full sweep of the foundation suite on this GPU model")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--workers", type=int, default=14)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    rows = summary.load_rows([args.base])
    ok = rows[(rows.status == "ok") & (rows.variant != "vendor") & (rows.dtype == args.dtype)]
    shapes = [sh for sh in S.foundation_suite(args.dtype) if sh.m <= 64]
    plan = [(Problem(sh.m, sh.n, sh.k, sh.dtype), grid(Problem(sh.m, sh.n, sh.k, sh.dtype))) for sh in shapes]
    precompile(plan, args.workers)

    import torch

    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.benchmarks import provenance
    from gemm_costmodel.kernels import timing
    from gemm_costmodel.kernels.gemm import swapab as SW

    prov = provenance.collect(torch.cuda.current_device())
    timer = timing.GraphTimer()
    res = []
    for p, cfgs in plan:
        if time.time() - t_start > args.budget_s:
            print("budget reached", file=sys.stderr)
            break
        mine = ok[(ok.m == p.m) & (ok.n == p.n) & (ok.k == p.k)].nsmallest(3, "p50_us")
        if mine.empty:
            continue
        ops, ref = C.operand_sets(p, 0, int(prov.get("l2_bytes") or 50 << 20))

        def timed(cfg, run):
            return C.gate_and_time(timer, cfg, run, ops, ref, p.dtype)

        row = {"m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype, "committed": {}, "variants": {}, "failures": {}}
        for cid in mine.candidate:
            cfg = config_from_id(cid)
            row["committed"][cid], _ = timed(cfg, lambda o, c=cfg: o.run(c))
        row["cublas_us"], _ = timed(VendorConfig(), lambda o: o.run(VendorConfig()))
        for cfg in cfgs:
            t, why = timed(cfg, lambda o, c=cfg: SW.launch(c, o.x, o.w, o.out, o.scale_a, o.scale_b))
            if t is None:
                row["failures"][cfg.id] = why
            else:
                row["variants"][cfg.id] = t
        committed = [v for v in row["committed"].values() if v is not None]
        if not committed or row["cublas_us"] is None:
            print(f"skip {p.key}: committed candidates or cuBLAS failed the gate", file=sys.stderr)
            continue
        row["base_us"] = min(committed)
        row["variant_best_us"] = min(row["variants"].values(), default=math.inf)
        row["variant_best_id"] = min(row["variants"], key=row["variants"].get, default="")
        res.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("variants", "failures")}),
              f"failures={len(row['failures'])}", file=sys.stderr, flush=True)
        del ops, ref
        json.dump({"provenance": prov, "shapes": res},
                  open(os.path.join(args.out, f"swapab_{args.dtype}.json"), "w"), indent=0)

    if not res:
        return
    gm = lambda f: math.exp(sum(math.log(f(r)) for r in res) / len(res))  # noqa: E731
    print(f"{len(res)} shapes: cuBLAS/committed {gm(lambda r: r['cublas_us'] / r['base_us']):.3f}, "
          f"cuBLAS/best-of(committed, swap-AB) "
          f"{gm(lambda r: r['cublas_us'] / min(r['base_us'], r['variant_best_us'])):.3f}, "
          f"cuBLAS/best swap-AB {gm(lambda r: r['cublas_us'] / r['variant_best_us']):.3f}, "
          f"swap-AB wins {sum(r['variant_best_us'] < r['base_us'] for r in res)}, "
          f"failures {sum(len(r['failures']) for r in res)}")
    # Which configs win tells what a config space would need.
    wins = collections.Counter(r["variant_best_id"] for r in res if r["variant_best_us"] < r["base_us"])
    print("winning swap-AB configs:", json.dumps(wins.most_common(20)))


if __name__ == "__main__":
    main()
