"""Exploration: knobs of the GEMV decode kernel (kernels/gemm_gemv.py) at M = 1-2, where the
committed GEMV is at 91-95% of the copy bandwidth on 20-130 MB weights (H100, issue 18).

For each shape, in one process, times (the harness's gate and CUDA-graph timer over rotating
buffers) the committed space's GEMV configs, cuBLAS, and variants of an exploration-only copy of
the kernel (below) with knobs the space lacks: BLOCK_N 1-2, BLOCK_K 2048, 16 warps, the next
weight tile loaded before the current one is used (PREFETCH: two tiles in flight per program),
and an evict-first cache hint on the weight (read once). Also measures the device copy bandwidth
(read + write bytes / time of a large copy) for the HBM floor. Writes gemv_explore.json.

    python benchmarks/explore/explore_gemv.py --out OUT
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch
import triton
import triton.language as tl

# The token-row loader is the committed kernel's: only the weight path differs here.
from gemm_costmodel.kernels.gemm.gemv import _x_row as _gemv_x


@triton.jit
def _gemv_w(w_ptrs, offs_k, K, EVEN_K: tl.constexpr, EVICT: tl.constexpr):
    if EVICT:
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=offs_k[None, :] < K, other=0.0, eviction_policy="evict_first")
    else:
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=offs_k[None, :] < K, other=0.0)
    return w


@triton.jit(do_not_specialize=["M"])
def gemv_explore_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        EVEN_K: tl.constexpr, PREFETCH: tl.constexpr, EVICT: tl.constexpr):
    # No split-K here (the committed space never picked it at M = 1-2 on the H100).
    pid_n = tl.program_id(0)
    r0 = tl.program_id(1) * ROWS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + (offs_n % N)[:, None] * stride_wn + offs_k[None, :]
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if ROWS > 1:
        acc1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    total = tl.cdiv(K, BLOCK_K)
    if PREFETCH:
        w = _gemv_w(w_ptrs, offs_k, K, EVEN_K, EVICT)
    for kt in range(0, total):
        if PREFETCH:
            # The next tile's load is issued before this tile is used (the last one re-reads
            # the tile in hand: in bounds, never used).
            nxt = tl.minimum(kt + 1, total - 1) - kt
            w_next = _gemv_w(w_ptrs + nxt * BLOCK_K, offs_k + nxt * BLOCK_K, K, EVEN_K, EVICT)
            wf = w.to(tl.float32)
        else:
            wf = _gemv_w(w_ptrs, offs_k, K, EVEN_K, EVICT).to(tl.float32)
        acc0 += wf * _gemv_x(x_ptr, r0, 0, M, stride_xm, offs_k, K, EVEN_K)[None, :]
        if ROWS > 1:
            acc1 += wf * _gemv_x(x_ptr, r0, 1, M, stride_xm, offs_k, K, EVEN_K)[None, :]
        if PREFETCH:
            w = w_next
        w_ptrs += BLOCK_K
        offs_k += BLOCK_K
    mask = offs_n < N
    tl.store(y_ptr + r0 * stride_ym + offs_n, tl.sum(acc0, axis=1).to(y_ptr.dtype.element_ty), mask=mask)
    if ROWS > 1:
        tl.store(y_ptr + (r0 + 1) * stride_ym + offs_n, tl.sum(acc1, axis=1).to(y_ptr.dtype.element_ty),
                 mask=mask & (offs_n * 0 + r0 + 1 < M))


class Knob:
    """One exploration config (duck-typed for the gate: an id and a run)."""

    def __init__(self, rows, bn, bk, warps, prefetch, evict):
        self.rows, self.bn, self.bk, self.warps, self.prefetch, self.evict = rows, bn, bk, warps, prefetch, evict
        self.id = f"xgemv_m{rows}n{bn}k{bk}_w{warps}{'_pf' if prefetch else ''}{'_ev' if evict else ''}"
        self.variant = "explore"

    def launch(self, o):
        x, w, out = o.x, o.w, o.out
        M, K = x.shape
        N = w.shape[0]
        gemv_explore_kernel[(triton.cdiv(N, self.bn), triton.cdiv(M, self.rows))](
            x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), ROWS=self.rows, BLOCK_N=self.bn,
            BLOCK_K=self.bk, EVEN_K=K % self.bk == 0, PREFETCH=self.prefetch, EVICT=self.evict,
            num_warps=self.warps, num_stages=1)
        return out


SHAPES = [(1, 5120, 8192), (1, 4096, 14336), (1, 3584, 18944), (1, 8192, 5120), (1, 7168, 4608),
          (1, 14336, 4096), (1, 2048, 4096), (1, 1024, 4608), (1, 28672, 4096), (2, 5120, 8192),
          (2, 4096, 14336), (1, 57344, 8192)]


def knobs(m):
    out = []
    for bn, bk, w, pf, ev in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (4, 8, 16), (False, True),
                                                (False, True)):
        per_thread = bn * bk // (32 * w)
        if per_thread < 8 or m * per_thread > 64 * (2 if not pf else 1):
            continue
        out.append(Knob(m, bn, bk, w, pf, ev))
    return out


def copy_gbps(timer) -> float:
    n = 1 << 28  # 512 MiB of bf16 each way
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    t = timer.measure(lambda i: b.copy_(a), 1)
    del a, b
    return 2 * n * 2 / (t.p50_us * 1e-6) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.benchmarks import provenance
    from gemm_costmodel.kernels import timing
    from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig, feasible_configs

    prov = provenance.collect(torch.cuda.current_device())
    timer = timing.GraphTimer()
    res = {"provenance": prov, "copy_gbps": copy_gbps(timer), "shapes": []}
    print("copy GB/s", res["copy_gbps"], file=sys.stderr, flush=True)
    t0 = time.time()
    for m, n, k in SHAPES:
        if time.time() - t0 > args.budget_s:
            break
        p = Problem(m, n, k, args.dtype)
        ops, ref = C.operand_sets(p, 0, int(prov.get("l2_bytes") or 50 << 20))
        row = {"m": m, "n": n, "k": k, "times": {}, "fail": {}}
        cands = [c for c in feasible_configs(p) if c.variant in ("gemv", "vendor")]
        for c in cands:
            t, why = C.gate_and_time(timer, c, lambda o, c=c: o.run(c), ops, ref, p.dtype)
            (row["times"].__setitem__(c.id, t) if t is not None else row["fail"].__setitem__(c.id, why))
        for kn in knobs(m):
            t, why = C.gate_and_time(timer, kn, kn.launch, ops, ref, p.dtype)
            (row["times"].__setitem__(kn.id, t) if t is not None else row["fail"].__setitem__(kn.id, why))
        wbytes = n * k * 2
        row["floor_us"] = (wbytes + m * k * 2 + m * n * 2) / (res["copy_gbps"] * 1e3)
        best = lambda pre: min(((v, c) for c, v in row["times"].items() if c.startswith(pre)), default=(math.inf, ""))  # noqa: E731
        row["best_space"], row["best_knob"], row["cublas"] = best("gemv_"), best("xgemv_"), row["times"].get("cublas")
        res["shapes"].append(row)
        print(json.dumps({k_: row[k_] for k_ in ("m", "n", "k", "floor_us", "best_space", "best_knob", "cublas")}),
              len(row["fail"]), file=sys.stderr, flush=True)
        del ops, ref
        json.dump(res, open(os.path.join(args.out, "gemv_explore.json"), "w"), indent=0)


if __name__ == "__main__":
    main()
