"""GPU check of the fused-MoE torch op (issue 17): route then fused_moe, eager, under
torch.compile(fullgraph=True), and captured in a CUDA graph and replayed twice (the align kernels'
arrival counter must re-arm), against the fp32 reference layer; bf16 and fp8 (static scales);
then the vendor, a few tiled, two swap-AB and two GEMV configs of each stage inside a graph, and a vLLM-format tuned
file's exact-M hit. One line per case; exits 1 on a failure. With --unsure K the layers run in
unsure mode (the first eager call times each stage's top K; compile and graph capture then launch
the winners), and a layer first seen inside a graph capture is decided by the model, untimed.

    python benchmarks/explore/moe_ops_check.py [VLLM_CONFIG_DIR] [--unsure K]
"""
import os
import sys

import torch

from gemm_costmodel.kernels.moe import impl, space
from gemm_costmodel.serving import ops

BOUND = 2e-2  # two stages, each within impl.ERROR_BOUNDS (1e-2)


def rel(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def layer_case(m, e, top_k, inter, hidden, dtype, gen):
    x = torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    logits = torch.randn(m, e, device="cuda", generator=gen)
    w1, s1 = impl.random_weights(e, 2 * inter, hidden, dtype, "cuda", gen)
    w2, s2 = impl.random_weights(e, hidden, inter, dtype, "cuda", gen)
    kw = {}
    if dtype == "fp8":
        kw = dict(w1_scale=s1, w2_scale=s2, a1_scale=impl.dynamic_scale(x),
                  a2_scale=torch.full((1,), 0.02, device="cuda"))
    return x, logits, w1, w2, kw


def main() -> int:
    bad = 0
    args = sys.argv[1:]
    unsure = 0
    if "--unsure" in args:
        i = args.index("--unsure")
        unsure = int(args[i + 1])
        del args[i:i + 2]
        tuner = ops.enable_unsure_mode(k=unsure)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, e, top_k, inter, hidden, dtype in [(1, 128, 8, 768, 2048, "bf16"), (7, 8, 2, 1792, 4096, "bf16"),
                                              (64, 64, 6, 1408, 2048, "bf16"), (1000, 16, 2, 3200, 4096, "bf16"),
                                              (33, 512, 10, 512, 2048, "bf16"), (16, 64, 6, 1408, 2048, "fp8"),
                                              (512, 8, 2, 1792, 4096, "fp8"), (1, 128, 8, 768, 2048, "fp8"),
                                              (4, 64, 6, 1408, 2048, "fp8"), (2, 8, 2, 1792, 4096, "bf16")]:
        x, logits, w1, w2, kw = layer_case(m, e, top_k, inter, hidden, dtype, gen)

        def layer(x, logits):
            tw, ids = ops.route(logits, top_k)
            return ops.fused_moe(x, w1, w2, tw, ids, **kw)

        tw, ids = ops.route(logits, top_k)
        ref = impl.moe_reference(x, w1, w2, tw, ids, **kw)
        up, down = ops.choose_moe(x, w1, w2, tw, ids, **kw)
        eager = rel(layer(x, logits), ref)
        compiled = rel(torch.compile(layer, fullgraph=True)(x, logits), ref)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = layer(x, logits)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        graphed = rel(y, ref)
        ok = max(eager, compiled, graphed) <= BOUND
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {dtype} M={m} E={e} top_k={top_k} I={inter} H={hidden} {up} + {down}: "
              f"eager {eager:.2e}, compiled {compiled:.2e}, graph {graphed:.2e}", flush=True)
    if unsure:
        timed = len(tuner.op_entries["moe"])
        # A layer first seen inside a capture: the model decides, nothing is timed in the capture.
        x, logits, w1, w2, kw = layer_case(5, 64, 6, 1408, 2048, "bf16", gen)
        tw, ids = ops.route(logits, 6)
        ref = impl.moe_reference(x, w1, w2, tw, ids)
        d = ops.dispatcher("moe")
        picks = [space.config_from_id(d.select(5, n, k, "bf16", 64, 6, stage=st).candidate)
                 for st, n, k in (("gate_up", 2 * 1408, 2048), ("down", 2048, 1408))]
        impl.fused_moe(x, w1, w2, tw, ids, *picks)  # the model's configs compiled outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = ops.fused_moe(x, w1, w2, tw, ids)
        g.replay()
        torch.cuda.synchronize()
        err = rel(y, ref)
        new = len(tuner.op_entries["moe"]) - timed
        ok = err <= BOUND and new == 0
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} unsure k={unsure}: {timed} stages timed eagerly; a layer first seen in a "
              f"capture ({picks[0].id} + {picks[1].id}): {err:.2e}, stages timed in it: {new}", flush=True)
    # Every stage variant inside a graph (vendor included), replayed three times.
    # Swap-AB with and without a split (the split zeroes an fp32 buffer inside the graph); the GEMV
    # (no align, fused epilogue) at a decode M, bf16 and fp8 (its inline activation quantisation).
    swap = ("grouped_mm", space.vllm_default(48, 64).id, "moe_m64n128k64_g16_w8s3",
            "moeswap_m16n64k128_s1_w4s3", "moeswap_m16n128k128_s4_w4s4")
    gemv = ("moegemv_n4k512_w4", "moegemv_n1k1024_w8")
    for m, dtype, stage, n, k, cids in ((48, "bf16", "gate_up", 2 * 1408, 2048, swap), (48, "bf16", "down", 2048, 1408, swap),
                                        (3, "bf16", "gate_up", 2 * 1408, 2048, gemv), (3, "bf16", "down", 2048, 1408, gemv),
                                        (3, "fp8", "gate_up", 2 * 1408, 2048, gemv), (3, "fp8", "down", 2048, 1408, gemv)):
        p = space.Problem(m, n, k, dtype, 64, 6, stage, "zipf")
        o = impl.make_operands(p, "cuda", torch.Generator(device="cuda").manual_seed(1))
        ref = impl.reference(o)
        for cid in cids:
            cfg = space.config_from_id(cid)
            o.run(cfg)  # warm-up (compile) outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = o.run(cfg)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            err = rel(y, ref)
            ok = err <= impl.ERROR_BOUNDS[dtype]
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} graph {p.key} {cid}: {err:.2e}", flush=True)
    folder = args[0] if args else ""
    if folder and os.path.isdir(folder):
        n = ops.load_vllm_moe_configs(folder)
        x, logits, w1, w2, kw = layer_case(16, 8, 2, 1792, 4096, "bf16", gen)
        tw, ids = ops.route(logits, 2)
        hit = ops.choose_moe(x, w1, w2, tw, ids)
        print(f"vLLM tables loaded: {n}; E=8, N=1792, M=16 -> {hit}", flush=True)
        ops.clear_vllm_moe_configs()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
