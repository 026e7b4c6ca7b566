"""Exploration (kept as a record): the fp8 intermediate of moe_fp8_intermediate.py, stage by stage. Per fp8
layer at M = 1 and 2, with the model's two configs: the gate_up GEMV writing bf16 vs fp8 (out_scale), and
the down stage quantising its bf16 input vs reading it pre-quantised, graph-timed over expert-shifted
routing copies, 3 rotated rounds, one process. Runs only at the commit that added the option
("MoE fp8 layer: with a static a2_scale ..."; launch's out_scale is gone since). Results:
benchmarks/results/moe/fp8_intermediate/stage_diag_h100.jsonl.

    python benchmarks/explore/moe_fp8_intermediate_stages.py OUT_DIR
"""
import statistics, torch, json, os, sys
from gemm_costmodel import registry
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.serving import ops
def main():
    spec = registry.get("moe")
    timer = GraphTimer()
    gen = torch.Generator(device="cuda"); gen.manual_seed(0)
    out = []
    for name, e, hidden, inter, top_k in (("qwen3-30b-a3b", 128, 2048, 768, 8), ("deepseek-v2-lite", 64, 2048, 1408, 6),
                                           ("gpt-oss-20b", 32, 2880, 2880, 4), ("mixtral-8x7b", 8, 4096, 14336, 2)):
        w1, s1 = impl.random_weights(e, 2 * inter, hidden, "fp8", "cuda", gen)
        w2, s2 = impl.random_weights(e, hidden, inter, "fp8", "cuda", gen)
        for m in (1, 2):
            x = torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)
            tw, ids = ops.route(torch.randn(m, e, device="cuda", generator=gen), top_k)
            a1 = impl.dynamic_scale(x)
            h = impl.stage_reference("gate_up", x, w1, tw, ids, a1, s1).to(torch.bfloat16)
            a2 = impl.dynamic_scale(h)
            up_id, down_id = ops.choose_moe(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2)
            up, down = spec.config_from_id(up_id), spec.config_from_id(down_id)
            lo, hi = int(ids.min()), int(ids.max()); stride = hi - lo + 1
            copies = [((ids.long() + j * stride) % e).to(ids.dtype) for j in range(max(1, min(e // stride, 32)))]
            hq = impl.quantize_fp8(h, a2)
            hb = torch.empty_like(h); h8 = torch.empty(h.shape, dtype=torch.float8_e4m3fn, device="cuda")
            y = torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda")
            xq = impl.quantize_fp8(x, a1)
            fns = {
                "up_bf16out": lambda i: impl.launch(up, "gate_up", xq, w1, tw, copies[i], hb, a1, s1),
                "up_fp8out": lambda i: impl.launch(up, "gate_up", xq, w1, tw, copies[i], h8, a1, s1, out_scale=a2),
                "down_bf16x": lambda i: impl.launch(down, "down", h, w2, tw, copies[i], y, a2, s2),
                "down_fp8x": lambda i: impl.launch(down, "down", hq, w2, tw, copies[i], y, a2, s2),
            }
            t = {k: [] for k in fns}
            for r in range(3):
                for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    t[k].append(timer.measure(fns[k], len(copies), key=k).p50_us)
            p = {k: statistics.median(v) for k, v in t.items()}
            row = {"layer": name, "m": m, "up": up_id, "down": down_id, "p50_us": p}
            out.append(row)
            print(name, m, up_id, down_id, {k: round(v, 2) for k, v in p.items()}, flush=True)
    with open(os.path.join(sys.argv[1], "stage_diag.jsonl"), "w") as fh:
        for r in out: fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
