"""Exploration (kept as a record): why is the fp8 MoE down GEMV slower than the bf16 one on the
same weight shape at M = 1? (issue 17: the fp8 held-out worst cases are M = 1 GEMV picks.)

In the shipped data the best fp8 down stage at M = 1 moves its weights at 0.7-2.2 TB/s against
1.6-2.9 TB/s for bf16 down and 1.8-3.0 for fp8 gate_up; Mixtral-8x7B down (4096x14336, top 2)
takes 54 us in fp8 and 41 us in bf16, which reads twice the bytes. The fp8 down stage is the only
GEMV that quantises its activations in the kernel (gate_up gets fp8 activations): every program
divided its token's whole activation rows by the static scale (IEEE division) again, so the
division ran about once per weight element read. Kernels, each with the space's 10 GEMV configs:

- ``div``: the kernel as it was (bf16 activations, ``div_rn`` per element; a copy here);
- ``recip``: the same copy multiplying by the scale's reciprocal, computed once per program
  (vLLM's static fp8 quantisation multiplies by the inverted scale too);
- ``cur``: the committed kernel (since this run: ``recip``'s arithmetic);
- ``preq``: the committed kernel fed activations already quantised to fp8 (no quantisation in the
  kernel: the floor of what quantising elsewhere could reach).

The first run (``fp8down_h200.jsonl``) had no ``div`` kernel: its ``cur`` was the committed kernel
as it was then, i.e. ``div``.

Problems: the fp8 down stages at M = 1 of the evaluation and vLLM-tuned suites, and a seeded sample
of the training ones. Every candidate is gated against the fp32 reference, then timed with the
harness's graph timer over its expert-shifted copies, 3 rotated rounds (median), one problem's
candidates in one process.

    python benchmarks/explore/moe_gemv_fp8down.py --out DIR [--train 16] [--workers 8]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import random
import statistics
import time

import torch
import triton
import triton.language as tl

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.kernels.moe import suites as SU

ROUNDS = 3
KINDS = ("div", "recip", "cur", "preq")


@triton.jit(do_not_specialize=["num_n", "top_k"])
def down_recip_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N: tl.constexpr,
                      K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                      stride_wn: tl.constexpr, stride_om: tl.constexpr, EVEN_K: tl.constexpr,
                      DIV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """impl.moe_gemv_down_kernel (fp8, bf16 activations): DIV, x / a_scale with IEEE division (the
    kernel as it was); else x * (1 / a_scale)."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_scale = tl.load(a_scale_ptr)
    inv = 1.0 / a_scale
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32) * (a_scale * tl.load(w_scale_ptr + e))
        w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            if EVEN_K:
                v = tl.load(x_ptr + p * stride_xm + offs_k).to(tl.float32)
                wv = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first").to(tl.float32)
            else:
                v = tl.load(x_ptr + p * stride_xm + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
                wv = tl.load(w_rows + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0,
                             eviction_policy="evict_first").to(tl.float32)
            if DIV:
                q = tl.math.div_rn(v, a_scale + tl.zeros_like(v))
            else:
                q = v * inv
            q = tl.clamp(q, -448.0, 448.0).to(tl.float8e4nv).to(tl.float32) * wt
            acc += wv * q[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def launch(kind: str, cfg: S.MoeGemvConfig, ops: impl.Operands):
    if kind in ("cur", "preq"):
        return ops.run(cfg)
    x, w, ids2, tw, out = ops.x, ops.w, ops.topk_ids, ops.topk_weights, ops.out
    E, N, K = w.shape
    num_n = triton.cdiv(N, cfg.block_n)
    down_recip_kernel[(num_n * ids2.shape[0],)](
        x, w, out, ids2.reshape(-1), tw, ops.a_scale, ops.w_scale, N, K, num_n, ids2.shape[1], x.stride(0),
        w.stride(0), w.stride(1), out.stride(0), EVEN_K=K % cfg.block_k == 0, BLOCK_N=cfg.block_n,
        DIV=kind == "div", BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=1)
    return out


def prequantised(sets: list) -> list:
    """The operand sets with the activations quantised to fp8 once (shared x: one copy)."""
    xq = impl.quantize_fp8(sets[0].x, sets[0].a_scale)
    return [dataclasses.replace(s, x=xq) for s in sets]


def problems(n_train: int, seed: int = 0) -> list:
    out, seen = [], set()
    for s in SU.eval_suite("fp8") + SU.vllm_suite("fp8"):
        if s.m == 1 and s.stage == "down":
            p = S.Problem(s.m, s.n, s.k, "fp8", s.e, s.top_k, s.stage, s.routing)
            if p not in seen:
                seen.add(p)
                out.append(("eval", p))
    train = [s for s in SU.training_suite("fp8") if s.m == 1 and s.stage == "down"]
    random.Random(seed).shuffle(train)
    out += [("train", S.Problem(s.m, s.n, s.k, "fp8", s.e, s.top_k, s.stage, s.routing)) for s in train[:n_train]]
    return out


def configs(prob) -> list:
    return [c for c in S.feasible_configs(prob, include_vendor=False) if isinstance(c, S.MoeGemvConfig)]


def _warm(prob) -> int:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ops = impl.make_operands(prob, "cuda", gen)
    pre = prequantised([ops])[0]
    n = 0
    for cfg in configs(prob):
        for kind in KINDS:
            try:
                launch(kind, cfg, pre if kind == "preq" else ops)
                n += 1
            except Exception:  # noqa: BLE001 - the measuring process records it
                pass
    torch.cuda.synchronize()
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_gemv_fp8down.jsonl")
    done = set()
    if os.path.exists(path):
        with open(path) as fh:
            done = {json.loads(line)["problem"] for line in fh if line.strip()}
    probs = [(s, p) for s, p in problems(args.train) if repr(p) not in done]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        compiled = sum(pool.map(_warm, [p for _, p in probs], chunksize=1))
    print(f"warmed {compiled} launches over {len(probs)} problems in {time.perf_counter() - t0:.0f}s", flush=True)
    timer = GraphTimer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gpu = torch.cuda.get_device_name(0)
    for suite, prob in probs:
        t1 = time.perf_counter()
        sets, ref = C.operand_sets(prob, 0, l2, "cuda", "moe")
        pre = prequantised(sets)
        status, times, cands = {}, {}, {}
        for cfg in configs(prob):
            for kind in KINDS:
                label = f"{cfg.id}:{kind}"
                ss = pre if kind == "preq" else sets
                cands[label] = (kind, cfg, ss)
                s, err, why = C.gate(cfg, ss[0], ref, prob.dtype, run=lambda k=kind, c=cfg, o=ss[0]: launch(k, c, o),
                                     bounds=impl.ERROR_BOUNDS)
                status[label] = s if s == "ok" else f"{s}: {why}"
                if s == "ok":
                    times[label] = []
        ok = list(times)
        for r in range(ROUNDS):
            for label in ok[r % len(ok):] + ok[:r % len(ok)]:
                kind, cfg, ss = cands[label]
                t = timer.measure(lambda i, k=kind, c=cfg, o=ss: launch(k, c, o[i]), len(ss), key=label)
                times[label].append(t.p50_us)
        p50 = {k: statistics.median(v) for k, v in times.items()}
        row = {"problem": repr(prob), "suite": suite, "gpu": gpu, "m": prob.m, "n": prob.n, "k": prob.k,
               "dtype": prob.dtype, "e": prob.e, "top_k": prob.top_k, "stage": prob.stage,
               "routing": prob.routing, "n_copies": len(sets), "status": status, "rounds_us": times, "p50_us": p50,
               "mem_gb": torch.cuda.max_memory_allocated() / 2**30, "seconds": time.perf_counter() - t1}
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        sets = pre = ref = None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        best = {kind: min((v for k, v in p50.items() if k.endswith(":" + kind)), default=float("nan")) for kind in KINDS}
        print(f"{suite} down {prob.n}x{prob.k} e{prob.e}k{prob.top_k}: best " +
              ", ".join(f"{k} {v:.2f}" for k, v in best.items()) +
              f" us; {sum(1 for s in status.values() if s != 'ok')} failed; {time.perf_counter() - t1:.1f}s", flush=True)


if __name__ == "__main__":
    main()
