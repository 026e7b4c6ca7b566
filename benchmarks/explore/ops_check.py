"""GPU check of the torch custom ops after the op-registry refactor: dispatch + launch
through ``gemm_costmodel.serving.ops`` (eager, torch.compile fullgraph, CUDA-graph replay) on bf16
and fp8 shapes against an fp32 reference. Prints one line per case; exits 1 on a failure.

    python benchmarks/explore/ops_check.py
"""
import sys

import torch

from gemm_costmodel.serving import ops
from gemm_costmodel.kernels.gemm.impl import ERROR_BOUNDS, make_operands, reference
from gemm_costmodel.kernels.gemm.space import Problem


def rel(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def main() -> int:
    bad = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k, dtype in [(1, 4096, 4096, "bf16"), (7, 5120, 8192, "bf16"), (33, 1000, 1048, "bf16"),
                           (512, 4096, 4096, "bf16"), (4097, 1024, 4096, "bf16"), (16, 4096, 4096, "fp8"),
                           (2048, 8192, 4096, "fp8"),
                           # GEMV picks (M <= 2): split-K and plain, bf16, fp16 and fp8.
                           (1, 5120, 8192, "bf16"), (2, 896, 4864, "bf16"), (1, 28672, 4096, "fp16"),
                           (1, 1024, 4608, "fp8"), (1, 1000, 3000, "bf16")]:
        o = make_operands(Problem(m, n, k, dtype), "cuda", gen)
        ref = reference(o)
        fp8 = dtype == "fp8"
        call = (lambda a, b: ops.gemm_fp8(a, b, o.scale_a, o.scale_b)) if fp8 else ops.gemm
        cid = ops.choose(o.x, o.w, o.scale_a, o.scale_b)
        eager = rel(call(o.x, o.w), ref)
        compiled = rel(torch.compile(call, fullgraph=True)(o.x, o.w), ref)
        call(o.x, o.w)  # warm-up outside the capture (split-K counters, workspace)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = call(o.x, o.w)
        g.replay()
        torch.cuda.synchronize()
        graphed = rel(y, ref)
        ok = max(eager, compiled, graphed) <= ERROR_BOUNDS[dtype]
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {dtype}:{m}x{n}x{k} {cid}: eager {eager:.2e}, compiled {compiled:.2e}, "
              f"graph {graphed:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
