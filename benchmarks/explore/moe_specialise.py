"""Exploration (kept as a record): does the fused-MoE grouped GEMM gain from compiling N, K and the
strides as constants, as the dense tiled kernel did (benchmarks/explore/tiled_hints.py: 1.19-1.54x
with the same config)? vLLM's fused_moe kernel takes N and K at run time too, and a serving engine
knows every expert weight's shape before the first request.

A copy of ``moe_gemm_kernel`` whose only change is ``N, K`` and the four strides annotated
``tl.constexpr`` (benchmarks/kernel_variants.py); per stage shape, the committed stage launch is
timed against the same launch with the copy bound in its place (both CUDA graphs replayed side by
side, GraphTimer.measure_paired via peers.time_rounds), both gated against the fp32 reference.

    python benchmarks/explore/moe_specialise.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import peers
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.kernel_variants import constexpr_copy
from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.kernels.moe.space import Problem, config_from_id

RUNTIME_ARGS = "N, K, EM, num_valid, stride_am, stride_we, stride_wn, stride_cm,"
CONST_ARGS = ("N: tl.constexpr, K: tl.constexpr, EM, num_valid, stride_am: tl.constexpr, "
              "stride_we: tl.constexpr, stride_wn: tl.constexpr, stride_cm: tl.constexpr,")
# (M, N, K, E, top_k, stage) of training families (Mixtral-8x7B, DeepSeek-V3 TP8, Qwen3-235B TP4)
SHAPES = [(4096, 28672, 4096, 8, 2, "gate_up"), (4096, 4096, 14336, 8, 2, "down"),
          (1024, 28672, 4096, 8, 2, "gate_up"), (4096, 512, 7168, 256, 8, "gate_up"),
          (4096, 7168, 256, 256, 8, "down"), (2048, 768, 4096, 128, 8, "gate_up"),
          (256, 28672, 4096, 8, 2, "gate_up")]
CONFIGS = ["moe_m128n256k64_g16_w8s4", "moe_m64n128k128_g1_w4s4", "moe_m128n128k64_g1_w8s5"]


def specialised_kernel():
    return constexpr_copy(impl.moe_gemm_kernel, RUNTIME_ARGS, CONST_ARGS,
                          "from gemm_costmodel.kernels.common import _grouped_tile\n"
                          "from gemm_costmodel.kernels.moe.impl import _k_step, _pair_block")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    orig, spec = impl.moe_gemm_kernel, specialised_kernel()
    timer = timing.GraphTimer()
    rows = []

    def bound(kernel, fn):
        def run(*a):
            impl.moe_gemm_kernel = kernel
            try:
                return fn(*a)
            finally:
                impl.moe_gemm_kernel = orig
        return run

    for m, n, k, e, top_k, stage in SHAPES:
        p = Problem(m, n, k, args.dtype, e, top_k, stage)
        ops, ref = C.operand_sets(p, 5, 50 << 20, op="moe")
        first = ops[0]
        for cid in CONFIGS:
            cfg = config_from_id(cid)
            runs = {}
            for label, kern in (("runtime_nk", orig), ("const_nk", spec)):
                st, err, detail = C.gate(cfg, first, ref, args.dtype, run=bound(kern, lambda c=cfg: first.run(c)))
                rows.append({"m": m, "n": n, "k": k, "e": e, "top_k": top_k, "stage": stage, "dtype": args.dtype,
                             "config": cid, "label": label, "status": st, "rel_err": err})
                if st == "ok":
                    runs[label] = bound(kern, lambda i, c=cfg: ops[i].run(c))
                else:
                    rows[-1]["error"] = str(detail)[:200]
            got = peers.time_rounds(runs, timer, len(ops), rounds=3)
            for r in rows[-2:]:
                if r["label"] in got:
                    r.update(us=got[r["label"]]["us"], rounds_us=got[r["label"]]["rounds_us"])
            if len(got) == 2:
                a, b = got["runtime_nk"]["us"], got["const_nk"]["us"]
                print(f"{stage} {m}x{n}x{k} e{e}k{top_k} {cid}: runtime {a:.1f} us, constant {b:.1f} us, "
                      f"gain {a / b:.3f}", flush=True)
        del ops, first, ref
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"moe_specialise_{args.dtype}.jsonl"), "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print(f"{len(rows)} rows, {sum(r['status'] != 'ok' for r in rows)} not ok", file=sys.stderr)


if __name__ == "__main__":
    main()
