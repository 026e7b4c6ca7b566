"""GPU check of the block-scaled fp8 custom ops (issue 16): quantize_fp8_per_token_group then
gemm_fp8_blockscale, eager, under torch.compile(fullgraph=True), and captured in a CUDA graph
and replayed twice (split-K arrival counters must re-arm), against the fp32
dequantise-then-matmul reference; then one config of every variant (the M = 1 GEMV at M = 1)
launched inside a graph.
One line per case; exits 1 on a failure.

    python benchmarks/explore/fp8bs_ops_check.py
"""
import sys

import torch

from gemm_costmodel.kernels.fp8_blockscale import impl, space
from gemm_costmodel.serving import ops

BOUND = impl.ERROR_BOUNDS["fp8"]


def rel(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def main() -> int:
    bad = 0
    torch.manual_seed(0)
    # 100x3072x8192 and 1024x2304x512: vendor picks that became Triton picks with the vendor margin
    # retired (docs/decisions/036-the-vendor-margin-retired.md, "The vendor margin retired").
    for m, n, k in [(1, 7168, 2048), (1, 7168, 128), (7, 576, 7168), (64, 2112, 7168), (100, 4096, 7168),
                    (100, 3072, 8192), (1024, 2304, 512), (4097, 1000, 1000)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda") * k ** -0.5
        wq, ws = impl.quantize_weight_blocks(w)

        def layer(x):
            xq, xs = ops.quantize_fp8_per_token_group(x)
            return ops.gemm_fp8_blockscale(xq, wq, xs, ws)

        xq, xs = ops.quantize_fp8_per_token_group(x)
        ref = impl.reference(impl.Operands(xq, wq, xs, ws, None))
        cid = ops.choose_fp8_blockscale(xq, wq, xs, ws)
        eager = rel(layer(x), ref)
        compiled = rel(torch.compile(layer, fullgraph=True)(x), ref)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = layer(x)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        graphed = rel(y, ref)
        ok = max(eager, compiled, graphed) <= BOUND
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} fp8bs:{m}x{n}x{k} {cid}: eager {eager:.2e}, compiled {compiled:.2e}, "
              f"graph {graphed:.2e}", flush=True)
    # The GEMV runs at M = 1 only (and is compiled per weight shape): its own problem.
    for (m, n, k), cids in [((16, 4096, 7168), ("bstiled_m64n128k128_g32_w4s2", "bssplitk_m16n64k128_s4_w4s3",
                                                 "bsswapab_m16n64k128_s4_w4s3", "bsswapab_m16n64k128_s1_w4s4",
                                                 "cublas")),
                            ((1, 4096, 7168), ("bsgemv_n1k1024_w4", "bsgemv_n8k512_w8"))]:
        o = impl.make_operands(space.Problem(m, n, k, "fp8"), "cuda", torch.Generator(device="cuda").manual_seed(1))
        ref = impl.reference(o)
        for cid in cids:
            cfg = space.config_from_id(cid)
            impl.launch(cfg, o.a, o.b, o.as_, o.bs, o.out)  # warm-up outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = impl.launch(cfg, o.a, o.b, o.as_, o.bs, o.out)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            err = rel(y, ref)
            ok = err <= BOUND
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} graph {m}x{n}x{k} {cid}: {err:.2e}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
