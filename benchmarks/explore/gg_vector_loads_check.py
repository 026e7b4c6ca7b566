"""Issue 60: does the grouped GEMM's dgrad/wgrad come back from 0.12x of torch._grouped_mm once the
contiguous axis of its loads is no longer clamped (impl.py, ALIGNED_OUT / ALIGNED)? Times, on a few
held-out problems of each pass, the vendor and a handful of Triton configs (the fastest ones of the
pre-fix sweep plus the large persistent/tiled tiles), correctness-gated against the fp32 reference,
CUDA-graph timer, one copy of the operands (each problem's weights exceed L2).

    python benchmarks/explore/gg_vector_loads_check.py OUT.jsonl
"""
from __future__ import annotations

import json
import sys

import torch

from gemm_costmodel.kernels.grouped_gemm import impl as I
from gemm_costmodel.kernels.grouped_gemm import space as S
from gemm_costmodel.kernels.timing import GraphTimer

PROBLEMS = [(32768, 5760, 2880, 16), (8192, 3072, 5120, 8), (16384, 2048, 1536, 40)]
CONFIGS = ["grouped_mm", "gg_m128n256k64_g8_w8s4", "ggpers_m128n256k64_g8_w8s4", "gg_m128n128k64_g8_w4s4",
           "ggpers_m128n128k64_g8_w4s4", "gg_m128n128k64_g8_w8s4", "gg_m64n128k64_g8_w4s4"]


def main() -> None:
    timer = GraphTimer()
    gen = torch.Generator(device="cuda").manual_seed(60)
    out = open(sys.argv[1], "w")
    for m, n, k, e in PROBLEMS:
        for stage in S.STAGES:
            p = S.Problem(m, n, k, "bf16", e, stage, "balanced")
            ops = I.make_operands(p, "cuda", gen)
            ref = I.reference(ops)
            for cid in CONFIGS:
                try:
                    cfg = S.config_from_id(cid)
                except ValueError as exc:
                    print(cid, exc, file=sys.stderr)
                    continue
                ok, why = S.check_feasible(cfg, p)
                if not ok:
                    continue
                y = I.launch(cfg, stage, ops.a, ops.b, ops.offs)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t = timer.measure(lambda i: I.launch(cfg, stage, ops.a, ops.b, ops.offs), 1)
                row = dict(m=m, n=n, k=k, e=e, stage=stage, candidate=cid, us=t.p50_us, rel_err=err,
                           tflops=2 * m * n * k / t.p50_us / 1e6)
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
            del ops, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
