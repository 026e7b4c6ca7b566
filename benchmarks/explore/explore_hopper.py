"""Exploration: Hopper knobs the committed config space does not use yet.

On the foundation suite's shapes, times in one process the best committed
candidate of a previous full sweep (``--base``, same GPU model), cuBLAS and
variants of that best candidate, each checked against the fp32 reference first:

- prefill (M >= 1024): the persistent TMA kernel with Triton's warp
  specialisation of the tile loop (``warp_specialize=True``), with a split
  epilogue (two half-width TMA stores, which frees shared memory for one more
  stage), and both, over a fixed list of tiles;
- decode (M <= 64): the best config with deeper pipelines (5-6 stages) and
  other warp counts, since these shapes are memory-bound and more bytes in
  flight may help;
- ``--mode composite`` (prefill only): the composite-tile persistent kernel
  (benchmarks/explore/gemm_composite.py), whose BLOCK_N = BN0 + BN1 tiles (144, 160, 192,
  272) can make the tile count land just under a multiple of the SM count.

Writes hopper_<mode>.json (every variant's p50 or failure) and prints, per M bucket,
the geomean of cuBLAS / best-of-committed and cuBLAS / best-of-all.

    python benchmarks/explore/explore_hopper.py --out OUT \
        --base benchmarks/results/foundation/foundation.jsonl.gz
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import provenance, summary
from gemm_costmodel.kernels import timing
from gemm_costmodel.kernels.gemm import kernel as gemm
from gemm_costmodel.kernels.gemm.space import (ARCHS, DTYPE_BYTES, OUT_DTYPE, PersistentConfig, Problem,
                                                 SplitKConfig, TiledConfig, VendorConfig, check_feasible,
                                                 feasible_configs, smem_bytes)

import gemm_composite as GC  # beside this script (benchmarks/explore/ is the script's folder)

# (block_m, block_n, block_k, warps, stages): the tiles that win prefill today plus
# ones that only fit with a split epilogue.
PREFILL_TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
                 (128, 128, 64, 8, 5), (64, 256, 64, 4, 4), (64, 128, 128, 4, 4)]


# (block_m, bn0, bn1, block_k, warps, stages) of the composite-tile exploration.
COMPOSITE = [(128, 128, 16, 64, 8, 4), (128, 128, 16, 64, 8, 5), (128, 128, 32, 64, 8, 4),
             (128, 128, 64, 64, 8, 4), (128, 256, 16, 64, 8, 3), (64, 128, 16, 64, 4, 4),
             (64, 128, 32, 64, 4, 4), (64, 128, 64, 64, 4, 4), (128, 64, 32, 64, 4, 4),
             (64, 256, 64, 64, 8, 3), (128, 128, 16, 64, 4, 4)]


def _smem(cfg, dtype, subtile):
    s = smem_bytes(cfg, dtype)
    if subtile and isinstance(cfg, PersistentConfig):
        s -= cfg.block_m * cfg.block_n * DTYPE_BYTES[OUT_DTYPE[dtype]] // 2
    return s


def prefill_variants(dtype):
    """(label, PersistentConfig, warp_spec, subtile, flatten) for the prefill exploration."""
    out = []
    limit = ARCHS["sm90"].smem_per_block
    for bm, bn, bk, w, s in PREFILL_TILES:
        cfg = PersistentConfig(bm, bn, bk, 8, w, s)
        for ws, st, fl in ((False, False, True), (True, False, True), (True, False, False),
                           (False, True, True), (True, True, False)):
            if _smem(cfg, dtype, st) > limit:
                continue
            out.append((f"{cfg.id}{'_ws' if ws else ''}{'_sub' if st else ''}{'' if fl else '_nofl'}",
                        cfg, ws, st, fl))
    return out


def decode_variants(base_cfg, dtype):
    """Neighbours of the best decode config: deeper pipelines and other warp counts."""
    out = []
    limit = ARCHS["sm90"].smem_per_block
    for w in (2, 4, 8):
        for s in (3, 4, 5, 6):
            c = dataclasses.replace(base_cfg, num_warps=w, num_stages=s)
            if c == base_cfg or smem_bytes(c, dtype) > limit:
                continue
            out.append((c.id, c))
    if isinstance(base_cfg, (TiledConfig, SplitKConfig)) and base_cfg.block_k < 256:
        for s in (3, 4, 5):
            c = dataclasses.replace(base_cfg, block_k=2 * base_cfg.block_k, num_stages=s)
            if smem_bytes(c, dtype) <= limit:
                out.append((c.id, c))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", required=True, help="full sweep of the foundation suite on this GPU model")
    ap.add_argument("--budget-s", type=float, default=500.0)
    ap.add_argument("--mode", choices=("knobs", "composite"), default="knobs")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    prov = provenance.collect(torch.cuda.current_device())
    base = summary.per_shape(summary.load_rows([args.base])).set_index(["dtype", "m", "n", "k"])
    timer = timing.GraphTimer()
    res = []
    shapes = [sh for sh in S.foundation_suite("bf16") if sh.m >= 1024]
    if args.mode == "knobs":
        shapes += [sh for sh in S.foundation_suite("bf16") if sh.m <= 64]
    for sh in shapes:
        if time.time() - t_start > args.budget_s:
            print("budget reached", file=sys.stderr)
            break
        if (sh.dtype, sh.m, sh.n, sh.k) not in base.index:
            continue
        p = Problem(sh.m, sh.n, sh.k, sh.dtype)
        best_id = base.loc[(sh.dtype, sh.m, sh.n, sh.k), "oracle_id"]
        best_cfg = next(c for c in feasible_configs(p) if c.id == best_id)
        ops, ref = C.operand_sets(p, 0, int(prov.get("l2_bytes") or 50 << 20))
        first = ops[0]
        has_scale = p.dtype == "fp8"

        def timed(cfg, run):
            return C.gate_and_time(timer, cfg, run, ops, ref, p.dtype)

        row = {"m": p.m, "n": p.n, "k": p.k, "base_id": best_id, "variants": {}, "failures": {}}
        row["base_us"], _ = timed(best_cfg, lambda o: o.run(best_cfg))
        row["cublas_us"], _ = timed(VendorConfig(), lambda o: o.run(VendorConfig()))
        if args.mode == "composite":
            cands = []
            if (p.k * DTYPE_BYTES[p.dtype]) % 16 == 0 and (p.n * DTYPE_BYTES[OUT_DTYPE[p.dtype]]) % 16 == 0:
                for bm, bn0, bn1, bk, w, st in COMPOSITE:
                    cfg = GC.CompositeConfig(bm, bn0, bn1, bk, 8, w, st)
                    if cfg.smem_bytes(DTYPE_BYTES[p.dtype], DTYPE_BYTES[OUT_DTYPE[p.dtype]]) > \
                            ARCHS["sm90"].smem_per_block:
                        continue
                    cands.append((cfg.id, cfg, lambda o, c=cfg: GC.launch(c, o.x, o.w, o.out, o.scale_a,
                                                                          o.scale_b)))
        elif p.m >= 1024:
            cands = []
            for label, cfg, ws, st, fl in prefill_variants(p.dtype):
                if not check_feasible(cfg, p)[0]:
                    continue
                cands.append((label, cfg, lambda o, c=cfg, ws=ws, st=st, fl=fl: gemm.launch_persistent(
                    c, o.x, o.w, o.out, o.scale_a if has_scale else o.x, o.scale_b if has_scale else o.x,
                    has_scale, warp_spec=ws, epi_subtile=st, flatten=fl)))
        else:
            # Tiled/split-K neighbours run even where the space's static filter would drop
            # them (8 warps on small tiles); the gate decides. Persistent ones need TMA alignment.
            cands = [(label, cfg, lambda o, c=cfg: o.run(c)) for label, cfg in decode_variants(best_cfg, p.dtype)
                     if isinstance(cfg, (TiledConfig, SplitKConfig)) or check_feasible(cfg, p)[0]]
        for label, cfg, run in cands:
            t, why = timed(cfg, run)
            if t is None:
                row["failures"][label] = why
            else:
                row["variants"][label] = t
        if row["base_us"] is None or row["cublas_us"] is None:
            print(f"skip {p.key}: the committed best or cuBLAS failed the gate", file=sys.stderr)
            continue
        row["variant_best_us"] = min(row["variants"].values(), default=math.inf)
        row["variant_best_id"] = min(row["variants"], key=row["variants"].get, default="")
        res.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "variants"}), file=sys.stderr, flush=True)
        del ops, first, ref
        json.dump({"provenance": prov, "shapes": res}, open(os.path.join(args.out, f"hopper_{args.mode}.json"), "w"), indent=0)

    for name, sel in (("M <= 64", lambda r: r["m"] <= 64), ("M >= 1024", lambda r: r["m"] >= 1024)):
        rs = [r for r in res if sel(r)]
        if not rs:
            continue
        gm = lambda f: math.exp(sum(math.log(f(r)) for r in rs) / len(rs))  # noqa: E731
        print(f"{name}: {len(rs)} shapes, cuBLAS/base {gm(lambda r: r['cublas_us'] / r['base_us']):.3f}, "
              f"cuBLAS/best-of(base, variants) "
              f"{gm(lambda r: r['cublas_us'] / min(r['base_us'], r['variant_best_us'])):.3f}, "
              f"variant wins {sum(r['variant_best_us'] < r['base_us'] for r in rs)}, "
              f"failures {sum(len(r['failures']) for r in rs)}")
    # Which variant labels win most (by suffix) tells which knob matters.
    wins = {}
    for r in res:
        if r["variant_best_us"] < r["base_us"]:
            wins[r["variant_best_id"]] = wins.get(r["variant_best_id"], 0) + 1
    print("winning variants:", json.dumps(wins))


if __name__ == "__main__":
    main()
