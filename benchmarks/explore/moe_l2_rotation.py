"""Does the MoE decode data time weights hot in L2? (issue 17's M = 1 picks)

The harness rotates operand copies until they span 2x L2 (``timing.copies_for``), counting every
byte of the stage's operands. At decode a stage reads only its top_k experts' weights: with E
experts and one copy of (E, N, K) weights over 2x L2, a graph replays the same few experts, whose
weights (under 50 MB on most M = 1 layers) stay in the H100's L2. Serving reads them once per
forward pass, from HBM.

This times the GEMV configs of M = 1 stages twice, in one process, 3 rounds each (median):
- ``hot``: the harness's operand sets (``correctness.operand_sets``), as the dataset was timed;
- ``cold``: one weight tensor, copies whose topk_ids are shifted by a multiple of top_k experts
  (e -> (e + j * top_k) mod E, the same histogram on other experts' weights), as many as span
  2x L2 of the bytes a call reads (capped at E / top_k distinct shifts).

    python benchmarks/explore/moe_l2_rotation.py OUT.jsonl
"""
import dataclasses
import json
import math
import statistics
import sys

import torch

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.kernels.moe import suites as SU

ROUNDS = 3


def cold_sets(first, e: int, top_k: int, l2: int):
    """Copies of ``first`` on other experts: shifted topk_ids, the same weights and activations."""
    active = first.topk_ids.unique().numel()
    per_call = active * first.w.shape[1] * first.w.shape[2] * first.w.element_size() + first.x.numel() * first.x.element_size()
    n = max(1, min(e // max(top_k, 1), math.ceil(2 * l2 / per_call)))
    return [dataclasses.replace(first, topk_ids=((first.topk_ids.long() + j * top_k) % e).to(first.topk_ids.dtype))
            for j in range(n)], per_call


def main():
    out = sys.argv[1]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    timer = GraphTimer()
    gpu = torch.cuda.get_device_name()
    shapes = [s for dt in ("bf16", "fp8") for s in SU.eval_suite(dt) if s.m == 1]
    with open(out, "w") as fh:
        for sh in shapes:
            prob = sh.problem
            gemv = [c for c in S.generate_configs("sm90", prob.dtype)
                    if isinstance(c, S.MoeGemvConfig) and S.check_feasible(c, prob)[0]]
            hot, _ = C.operand_sets(prob, 0, l2, "cuda", "moe")
            cold, per_call = cold_sets(hot[0], prob.e, prob.top_k, l2)
            res = {}
            for mode, sets in (("hot", hot), ("cold", cold)):
                for cfg in gemv:
                    ts = [timer.measure(lambda i, c=cfg, s=sets: s[i].run(c), len(sets), key=cfg.id).p50_us
                          for _ in range(ROUNDS)]
                    res[(mode, cfg.id)] = ts
            for (mode, cid), ts in res.items():
                fh.write(json.dumps({"dtype": prob.dtype, "family": sh.family, "stage": prob.stage, "n": prob.n,
                                     "k": prob.k, "e": prob.e, "top_k": prob.top_k, "mode": mode, "candidate": cid,
                                     "p50_us": statistics.median(ts), "rounds_us": ts, "gpu": gpu,
                                     "n_copies": len(hot) if mode == "hot" else len(cold),
                                     "bytes_per_call": per_call}) + "\n")
            h = {c: statistics.median(res[("hot", c.id)]) for c in gemv}
            co = {c: statistics.median(res[("cold", c.id)]) for c in gemv}
            bh, bc = min(h, key=h.get), min(co, key=co.get)
            print(f"{prob.dtype} {sh.family} {prob.stage} {prob.n}x{prob.k} e{prob.e}k{prob.top_k} "
                  f"{per_call / 2**20:.0f} MB/call copies hot {len(hot)} cold {len(cold)}: best hot {h[bh]:.2f} us "
                  f"({per_call / h[bh] / 1e6:.2f} TB/s) cold {co[bc]:.2f} us ({per_call / co[bc] / 1e6:.2f} TB/s); "
                  f"hot's best under cold {co[bh] / co[bc]:.3f}", flush=True)
            del hot, cold
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
