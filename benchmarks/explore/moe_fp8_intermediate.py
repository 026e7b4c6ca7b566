"""Exploration (kept as a record): the fp8 MoE layer at decode with its intermediate kept in fp8.

With a static a2_scale and a GEMV gate_up config, ``impl.fused_moe`` has the gate_up GEMV write the
intermediate already quantised (``fp8_intermediate=True``, the default), so the down stage reads
fp8 and quantises nothing; before, the intermediate was bf16 and the down stage quantised it as it
loaded it, once per weight element read (benchmarks/results/moe/README.md, "The fp8 down GEMV's
division": that quantisation still cost up to 1.2x at M = 1 on large K). Per fp8 layer at M = 1, 2, 4
(the model's two configs for it, ``ops.choose_moe``), both paths are checked against the fp32
reference layer (static scales) and timed with the harness's graph timer over expert-shifted
routing copies, 3 rotated rounds, in one process.

    python benchmarks/explore/moe_fp8_intermediate.py --out DIR

Result (benchmarks/results/moe/fp8_intermediate/, one H100 lease): the fp8 intermediate was slower
(1.00-1.15x the layer's time, 23 of 24 layers slower) and further from the reference (1e-2 against
1.7e-3: quantising the fp32 value directly differs from quantising its bf16 rounding, which the
down stage's own quantisation and the reference do, on a few percent of the elements), so the
option (``fused_moe(fp8_intermediate=...)``, ``launch(out_scale=...)``) was removed again; this
script runs only at the commit that added it ("MoE fp8 layer: with a static a2_scale ...").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from gemm_costmodel import registry
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.serving import ops

# (name, E, hidden, intermediate per shard, top_k)
LAYERS = (("mixtral-8x7b", 8, 4096, 14336, 2), ("mixtral-8x7b-tp4", 8, 4096, 3584, 2),
          ("qwen2-57b-a14b", 64, 3584, 2560, 8), ("gpt-oss-20b", 32, 2880, 2880, 4),
          ("phi-3.5-moe", 16, 4096, 6400, 2), ("qwen3-30b-a3b", 128, 2048, 768, 8),
          ("deepseek-v2-lite", 64, 2048, 1408, 6), ("qwen3-235b-a22b-tp4", 128, 4096, 384, 8))
MS = (1, 2, 4)
ROUNDS = 3


def rel(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_fp8_intermediate.jsonl")
    spec = registry.get("moe")
    timer = GraphTimer()
    gpu = torch.cuda.get_device_name(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    for name, e, hidden, inter, top_k in LAYERS:
        w1, s1 = impl.random_weights(e, 2 * inter, hidden, "fp8", "cuda", gen)
        w2, s2 = impl.random_weights(e, hidden, inter, "fp8", "cuda", gen)
        for m in MS:
            x = torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)
            tw, ids = ops.route(torch.randn(m, e, device="cuda", generator=gen), top_k)
            a1 = impl.dynamic_scale(x)
            h = impl.stage_reference("gate_up", x, w1, tw, ids, a1, s1).to(torch.bfloat16)
            a2 = impl.dynamic_scale(h)
            up_id, down_id = ops.choose_moe(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2)
            up, down = spec.config_from_id(up_id), spec.config_from_id(down_id)
            ref = impl.moe_reference(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2)
            kw = dict(w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2)
            errs = {kind: rel(impl.fused_moe(x, w1, w2, tw, ids, up, down, fp8_intermediate=kind == "fp8", **kw), ref)
                    for kind in ("bf16", "fp8")}
            # Expert-shifted routing copies, as the harness times a decode stage (impl.timing_copies):
            # as many as span 2x L2 of the bytes a layer reads, at most as many as E holds.
            lo, hi = int(ids.min()), int(ids.max())
            stride = hi - lo + 1
            active = int(ids.unique().numel()) * (w1.shape[1] * w1.shape[2] + w2.shape[1] * w2.shape[2])
            n = max(1, min(e // stride, -(-2 * l2 // active), 32))
            copies = [((ids.long() + j * stride) % e).to(ids.dtype) for j in range(n)]
            outs = torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda")
            times = {"bf16": [], "fp8": []}
            for r in range(ROUNDS):
                for kind in (("bf16", "fp8") if r % 2 == 0 else ("fp8", "bf16")):
                    t = timer.measure(lambda i, k=kind: impl.fused_moe(
                        x, w1, w2, tw, copies[i], up, down, out=outs, check=False, fp8_intermediate=k == "fp8", **kw),
                        len(copies), key=f"{name}{m}{kind}")
                    times[kind].append(t.p50_us)
            p50 = {k: statistics.median(v) for k, v in times.items()}
            row = {"gpu": gpu, "layer": name, "m": m, "e": e, "hidden": hidden, "inter": inter, "top_k": top_k,
                   "up": up_id, "down": down_id, "n_copies": n, "rel_err": errs, "rounds_us": times, "p50_us": p50}
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{name} M={m} {up_id} + {down_id}: bf16 intermediate {p50['bf16']:.2f} us, fp8 {p50['fp8']:.2f} us "
                  f"({p50['fp8'] / p50['bf16']:.3f}x); err {errs['bf16']:.2e} / {errs['fp8']:.2e}", flush=True)
        del w1, w2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
