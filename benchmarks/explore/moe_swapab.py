"""Does a swap-AB (and split-K) grouped GEMM pay for MoE decode on Hopper? (issue 17)

At M <= 64 vLLM's fused_moe kernel (our ``tiled`` MoE space) puts each expert's few tokens on the
MMA's M side, padded to BLOCK_SIZE_M >= 16 rows: Hopper's wgmma (64 rows per warpgroup) is out
of reach and the tile runs on the Ampere-style MMA path. The dense op met the same problem and
its swap-AB kernels (y.T = w @ x.T: weight rows on the MMA's M side, tokens on its N side) won
39 of 40 decode shapes (docs/decisions/003-where-triton-still-loses.md). Here the same for the grouped GEMM: a program is
(BLOCK_N weight rows of one expert) x (BLOCK_M sorted pairs of that expert), with an optional
split over K whose fp32 partials meet in a zeroed fp32 buffer by atomic adds (silu-and-mul and
the top_k sum read fp32 as well as bf16, so they need no change).

Per held-out evaluation shape with M <= 64 (both dtypes, both stages, balanced and zipf routing),
in one process on one GPU: the 3 fastest tiled configs of the committed evaluation run, vLLM's
default, the vendor (bf16) and every swap-AB config below. Every candidate is correctness-gated
against the fp32 reference first. The kernels compile first in worker processes (the harness's
precompile fills Triton's cache), so the measuring process only loads them.

The kernel measured here (the H100 run in benchmarks/results/moe/swapab/) joined the space
unchanged as ``kernels/moe/impl.py: moe_swapab_kernel`` (``MoeSwapABConfig``, variant ``swapab``),
on the grid of the configs that won here; this script now launches it from there.

    python benchmarks/explore/moe_swapab.py --out DIR [--dtypes bf16 fp8] [--max-shapes N]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time

import torch


# (BLOCK_M tokens, BLOCK_N weight rows, BLOCK_K, SPLIT_K, num_warps, num_stages)
SWAP_CONFIGS = [(bm, bn, bk, sk, 4, st)
                for bm in (16, 32) for bn in (64, 128) for bk in (128, 256) for sk in (1, 2, 4) for st in (3, 4)
                if not (bk == 256 and bn == 128 and st == 4)]


def swap_id(c) -> str:
    from gemm_costmodel.kernels.moe import space

    return space.MoeSwapABConfig(*c).id


def launch_swap(c, stage, x, w, topk_weights, topk_ids, out, a_scale=None, w_scale=None):
    """One stage on swap-AB config c (a tuple in MoeSwapABConfig's field order): the op's launch."""
    from gemm_costmodel.kernels.moe import impl, space

    return impl.launch(space.MoeSwapABConfig(*c), stage, x, w, topk_weights, topk_ids, out, a_scale, w_scale)


def _candidates(shape, known, dtype):
    """(kind, id or swap tuple) of one shape: the committed run's 3 fastest tiled, vLLM's default,
    the vendor (bf16), then every swap-AB config whose token tile is the smallest covering M's
    busiest expert or one step larger."""
    from gemm_costmodel.kernels.moe import space

    p = shape.problem
    out = [("space", c) for c in known[:3]]
    dflt = space.vllm_default(p.m, p.e, "fp8" if dtype == "fp8" else "bf16").id
    if dflt not in known[:3]:
        out.append(("space", dflt))
    if dtype == "bf16":
        out.append(("space", space.VENDOR.id))
    busiest = int(p.counts().max())
    smallest = 16 if busiest <= 16 else 32
    smem = space.ARCHS["sm90"].smem_per_block
    out += [("swap", c) for c in SWAP_CONFIGS if c[0] in (smallest, 2 * smallest) and c[0] <= 32
            and c[5] * (c[0] + c[1]) * c[2] * space.DTYPE_BYTES[dtype] <= smem]
    return out


def main() -> int:
    import pandas as pd

    from gemm_costmodel.benchmarks.precompile import precompile
    from gemm_costmodel.kernels.timing import GraphTimer, copies_for
    from gemm_costmodel.kernels.moe import impl, space, suites

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--max-shapes", type=int, default=0, help="per dtype (0: all)")
    ap.add_argument("--workers", type=int, default=12)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_swapab.jsonl")
    done = set()
    if os.path.exists(path):  # resume: a shape is done when its summary line is there
        for line in open(path, encoding="utf-8"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("kind") == "summary":
                done.add(r["shape"])
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    timer = GraphTimer()
    fh = open(path, "a", encoding="utf-8")
    for dtype in args.dtypes:
        df = pd.concat(pd.read_parquet(f, columns=["m", "n", "k", "e", "top_k", "stage", "routing", "candidate",
                                                   "status", "p50_us"])
                       for f in glob.glob(f"datasets/moe/{dtype}/*eval*.parquet"))
        df = df[(df.status == "ok") & df.candidate.str.startswith("moe_")]
        shapes = [s for s in suites.eval_suite(dtype) if s.m <= 64]
        if args.max_shapes:
            shapes = shapes[:args.max_shapes]
        shapes = [s for s in shapes if s.key not in done]
        plan = []
        for s in shapes:
            p = s.problem
            sel = df[(df.m == p.m) & (df.n == p.n) & (df.k == p.k) & (df.e == p.e) & (df.top_k == p.top_k)
                     & (df.stage == p.stage) & (df.routing == p.routing)]
            known = sel.groupby("candidate").p50_us.median().sort_values()
            plan.append((s, known, _candidates(s, list(known.index), dtype)))
        # The harness's parallel precompile (one worker task per config and specialisation).
        cfgs = [(s.problem, [space.config_from_id(c) if kind == "space" else space.MoeSwapABConfig(*c)
                             for kind, c in cands]) for s, _, cands in plan]
        print(json.dumps({"dtype": dtype, "shapes": len(plan)}), flush=True)
        precompile(cfgs, args.workers, op="moe")
        gen = torch.Generator(device=dev).manual_seed(0)
        for s, known, cands in plan:
            p = s.problem
            t_shape = time.perf_counter()
            probe = impl.make_operands(p, dev, gen)
            ncop = copies_for(probe.nbytes, l2, max_copies=8)
            copies = [probe] + [impl.make_operands(p, dev, gen) for _ in range(ncop - 1)]
            ref = impl.reference(probe)
            recs = []
            for kind, c in cands:
                cid = c if kind == "space" else swap_id(c)
                rec = {"shape": s.key, "family": s.family, "dtype": dtype, "m": p.m, "stage": p.stage,
                       "routing": p.routing, "kind": kind, "candidate": cid, "gpu": props.name,
                       "prev_run_p50_us": float(known[c]) if kind == "space" and c in known.index else None}
                try:
                    if kind == "space":
                        cfg = space.config_from_id(c)
                        fn = (lambda cfg: lambda i: copies[i].run(cfg))(cfg)
                    else:
                        fn = (lambda c: lambda i: launch_swap(c, p.stage, copies[i].x, copies[i].w,
                                                              copies[i].topk_weights, copies[i].topk_ids,
                                                              copies[i].out, copies[i].a_scale,
                                                              copies[i].w_scale))(c)
                    probe.out.fill_(float("nan"))
                    y = fn(0)
                    torch.cuda.synchronize()
                    err = float((y.float() - ref).norm() / ref.norm())
                    rec["rel_err"] = err
                    if not err <= impl.ERROR_BOUNDS[dtype]:
                        rec["status"] = "wrong"
                    else:
                        t = timer.measure(fn, len(copies))
                        rec.update(status="ok", p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable)
                except Exception as exc:  # noqa: BLE001 - recorded as the row's status
                    rec.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:200]}")
                recs.append(rec)
                fh.write(json.dumps(rec) + "\n")
            ok = [r for r in recs if r.get("status") == "ok"]
            space_ok = [r for r in ok if r["kind"] == "space"]
            swap_ok = [r for r in ok if r["kind"] == "swap"]
            best_space = min(space_ok, key=lambda r: r["p50_us"]) if space_ok else None
            best_swap = min(swap_ok, key=lambda r: r["p50_us"]) if swap_ok else None
            dflt = space.vllm_default(p.m, p.e, "fp8" if dtype == "fp8" else "bf16").id
            d = [r["p50_us"] for r in space_ok if r["candidate"] == dflt]
            summ = {"kind": "summary", "shape": s.key, "family": s.family, "dtype": dtype, "m": p.m,
                    "stage": p.stage, "routing": p.routing, "gpu": props.name,
                    "statuses": {st: sum(r.get("status") == st for r in recs) for st in ("ok", "wrong", "error")},
                    "best_space": best_space and best_space["candidate"],
                    "best_space_us": best_space and best_space["p50_us"],
                    "best_swap": best_swap and best_swap["candidate"],
                    "best_swap_us": best_swap and best_swap["p50_us"],
                    "vllm_default_us": d[0] if d else None,
                    "seconds": round(time.perf_counter() - t_shape, 2),
                    "reserved_mb": round(torch.cuda.memory_reserved() / 2**20)}
            fh.write(json.dumps(summ) + "\n")
            fh.flush()
            print(json.dumps(summ), flush=True)
            del copies, probe, ref
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
