"""Exploration (kept as a record): does the MoE decode GEMV lose its K tail? (issue 17: the held-out
worst cases are M = 1 GEMV picks on hidden sizes no training family has, gpt-oss-20b's 2880 and
Phi-3.5-MoE's 3200.)

The committed GEMV (kernels/moe/impl.py) walks K in BLOCK_K tiles; when BLOCK_K does not divide K,
every tile's loads are masked and the last tile is partly empty. In the data the configs' times at
such K follow the tile slots they walk more than the bytes they read: gpt-oss-20b fp8 gate_up
(K = 2880) takes 24.3 us with 512-wide tiles (94% of the slots used) and 32.6 us with 2048-wide
ones (70%). Kernels, each with the space's 10 GEMV configs:

- ``cur``: the committed kernel;
- ``tail2`` / ``tail4`` / ``tail128``: the same arithmetic, the K // BLOCK_K full tiles unmasked,
  then the remainder in masked chunks of BLOCK_K / 2, BLOCK_K / 4 (at least 64) or 128 columns, so
  at most one chunk is partly empty.

Problems: the M = 1 stage shapes of the evaluation and vLLM-tuned suites (both dtypes, both stages)
with a K that some GEMV config's tile does not divide, plus (as a control) those whose K every
tile divides, where the variants should time as ``cur``. Every launch is gated against the fp32
reference, then timed with the harness's graph timer over its expert-shifted copies, 3 rotated
rounds (median), one problem's candidates in one process.

    python benchmarks/explore/moe_gemv_ktail.py --out DIR [--workers 8] [--control 6]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
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
from gemm_costmodel.kernels.moe.impl import _gemv_w, _gemv_x

ROUNDS = 3
KINDS = ("cur", "tail2", "tail4", "tail128")


def tail_width(kind: str, block_k: int) -> int:
    if kind == "tail2":
        return max(block_k // 2, 64)
    if kind == "tail4":
        return max(block_k // 4, 64)
    return min(128, block_k)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def gate_up_tail_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, a_scale_ptr, w_scale_ptr, I: tl.constexpr,
                        K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                        stride_wn: tl.constexpr, stride_om: tl.constexpr,
                        HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TAIL_K: tl.constexpr):
    """impl.moe_gemv_gate_up_kernel with the full tiles unmasked and the K remainder in TAIL_K chunks."""
    NFULL: tl.constexpr = K // BLOCK_K
    REM: tl.constexpr = K - NFULL * BLOCK_K
    pid = tl.program_id(0)
    pid_n = pid % num_n
    p = (pid // num_n).to(tl.int64)
    e = tl.load(ids_ptr + p).to(tl.int64)
    t = p // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < I, offs_n, 0)
    g_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
    u_rows = g_rows + I * stride_wn
    a_inv = 1.0
    if QUANT_X:
        a_inv = 1.0 / tl.load(a_scale_ptr)
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(0, NFULL):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _gemv_x(x_ptr, t, stride_xm, offs_k, K, a_inv, QUANT_X, True)[None, :]
        acc_g += _gemv_w(g_rows, offs_k, K, True) * x
        acc_u += _gemv_w(u_rows, offs_k, K, True) * x
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    if REM > 0:
        tg = tl.zeros((BLOCK_N, TAIL_K), dtype=tl.float32)
        tu = tl.zeros((BLOCK_N, TAIL_K), dtype=tl.float32)
        for kt in range(0, (REM + TAIL_K - 1) // TAIL_K):
            offs_k = NFULL * BLOCK_K + kt * TAIL_K + tl.arange(0, TAIL_K)
            x = _gemv_x(x_ptr, t, stride_xm, offs_k, K, a_inv, QUANT_X, False)[None, :]
            tg += _gemv_w(g_rows, offs_k, K, False) * x
            tu += _gemv_w(u_rows, offs_k, K, False) * x
        g += tl.sum(tg, axis=1)
        u += tl.sum(tu, axis=1)
    if HAS_SCALE:
        s = tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e)
        g = g * s
        u = u * s
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + p * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < I)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def down_tail_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N: tl.constexpr,
                     K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                     stride_wn: tl.constexpr, stride_om: tl.constexpr,
                     HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TAIL_K: tl.constexpr):
    """impl.moe_gemv_down_kernel with the full tiles unmasked and the K remainder in TAIL_K chunks."""
    NFULL: tl.constexpr = K // BLOCK_K
    REM: tl.constexpr = K - NFULL * BLOCK_K
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_inv = 1.0
    if QUANT_X:
        a_inv = 1.0 / tl.load(a_scale_ptr)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    tacc = tl.zeros((BLOCK_N, TAIL_K), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        if HAS_SCALE:
            wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
        w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
        for kt in range(0, NFULL):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            wv = _gemv_w(w_rows, offs_k, K, True)
            x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_inv, QUANT_X, True) * wt
            acc += wv * x[None, :]
        if REM > 0:
            for kt in range(0, (REM + TAIL_K - 1) // TAIL_K):
                offs_k = NFULL * BLOCK_K + kt * TAIL_K + tl.arange(0, TAIL_K)
                wv = _gemv_w(w_rows, offs_k, K, False)
                x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_inv, QUANT_X, False) * wt
                tacc += wv * x[None, :]
    y = tl.sum(acc, axis=1)
    if REM > 0:
        y += tl.sum(tacc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def launch(kind: str, cfg: S.MoeGemvConfig, ops: impl.Operands):
    if kind == "cur":
        return ops.run(cfg)
    x, w, ids2, tw, out = ops.x, ops.w, ops.topk_ids, ops.topk_weights, ops.out
    E, N, K = w.shape
    top_k = ids2.shape[1]
    fp8 = w.dtype == torch.float8_e4m3fn
    quant = fp8 and x.dtype != torch.float8_e4m3fn
    scales = (ops.a_scale if fp8 else x, ops.w_scale if fp8 else x)
    common = dict(HAS_SCALE=fp8, QUANT_X=quant, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  TAIL_K=tail_width(kind, cfg.block_k), num_warps=cfg.num_warps, num_stages=1)
    ids = ids2.reshape(-1)
    if ops.stage == "gate_up":
        i = N // 2
        num_n = triton.cdiv(i, cfg.block_n)
        gate_up_tail_kernel[(num_n * ids.numel(),)](
            x, w, out, ids, *scales, i, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
            **common)
    else:
        num_n = triton.cdiv(N, cfg.block_n)
        down_tail_kernel[(num_n * ids2.shape[0],)](
            x, w, out, ids, tw, *scales, N, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), **common)
    return out


def configs(prob) -> list:
    return [c for c in S.feasible_configs(prob, include_vendor=False) if isinstance(c, S.MoeGemvConfig)]


def problems(n_control: int) -> list:
    odd, even, seen = [], [], set()
    for dtype in ("bf16", "fp8"):
        for suite, shapes in (("eval", SU.eval_suite(dtype)), ("vllm", SU.vllm_suite(dtype))):
            for s in shapes:
                if s.m != 1:
                    continue
                p = S.Problem(s.m, s.n, s.k, dtype, s.e, s.top_k, s.stage, s.routing)
                if p in seen:
                    continue
                seen.add(p)
                if any(p.k % c.block_k for c in configs(p)):
                    odd.append((suite, p))
                else:
                    even.append((suite, p))
    return odd + even[:n_control]


def _warm(prob) -> int:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ops = impl.make_operands(prob, "cuda", gen)
    n = 0
    for cfg in configs(prob):
        for kind in KINDS:
            try:
                launch(kind, cfg, ops)
                n += 1
            except Exception:  # noqa: BLE001 - the measuring process records it
                pass
    torch.cuda.synchronize()
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--control", type=int, default=6)
    ap.add_argument("--limit", type=int, default=0, help="at most this many problems (0: all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_gemv_ktail.jsonl")
    done = set()
    if os.path.exists(path):
        with open(path) as fh:
            done = {json.loads(line)["problem"] for line in fh if line.strip()}
    probs = [(s, p) for s, p in problems(args.control) if repr(p) not in done]
    if args.limit:
        probs = probs[:args.limit]
    print(f"{len(probs)} problems", flush=True)
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
        status, times, cands = {}, {}, {}
        for cfg in configs(prob):
            for kind in KINDS:
                label = f"{cfg.id}:{kind}"
                cands[label] = (kind, cfg)
                s, err, why = C.gate(cfg, sets[0], ref, prob.dtype,
                                     run=lambda k=kind, c=cfg: launch(k, c, sets[0]), bounds=impl.ERROR_BOUNDS)
                status[label] = s if s == "ok" else f"{s}: {why}"
                if s == "ok":
                    times[label] = []
        ok = list(times)
        for r in range(ROUNDS):
            for label in ok[r % len(ok):] + ok[:r % len(ok)]:
                kind, cfg = cands[label]
                t = timer.measure(lambda i, k=kind, c=cfg: launch(k, c, sets[i]), len(sets), key=label)
                times[label].append(t.p50_us)
        p50 = {k: statistics.median(v) for k, v in times.items()}
        row = {"problem": repr(prob), "suite": suite, "gpu": gpu, "m": prob.m, "n": prob.n, "k": prob.k,
               "dtype": prob.dtype, "e": prob.e, "top_k": prob.top_k, "stage": prob.stage,
               "routing": prob.routing, "n_copies": len(sets), "status": status, "rounds_us": times, "p50_us": p50,
               "mem_gb": torch.cuda.max_memory_allocated() / 2**30, "seconds": time.perf_counter() - t1}
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        sets = ref = None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        best = {kind: min((v for k, v in p50.items() if k.endswith(":" + kind)), default=float("nan")) for kind in KINDS}
        print(f"{suite} {prob.dtype} {prob.stage} {prob.n}x{prob.k} e{prob.e}k{prob.top_k}: best " +
              ", ".join(f"{k} {v:.2f}" for k, v in best.items()) +
              f" us; {sum(1 for s in status.values() if s != 'ok')} failed; {time.perf_counter() - t1:.1f}s", flush=True)


if __name__ == "__main__":
    main()
