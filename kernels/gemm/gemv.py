"""GEMV decode kernel (the space uses it for M <= 2): CUDA-core dot products, no tensor cores.

Why: at M = 1-4 a GEMM reads the weight once and does 2*M flops per weight
element, so its time is the weight's bytes over HBM bandwidth. Every MMA kernel
(tiled, split-K, swap-AB) pads the tokens to 16 rows or more and pays for the
padding in registers, shared memory and pipeline depth; Inductor's max-autotune
beats them at M = 1 with a plain reduction kernel (issue 18). Here each program
owns BLOCK_N weight rows and one of SPLIT_K slices of K, streams
(BLOCK_N, BLOCK_K) weight tiles with wide vectorised loads, multiplies them
elementwise by the M token rows in fp32 and reduces over K once, after the loop
(the accumulators stay 2-D until then, so the loop has no cross-thread work).
The token rows are a compile-time count ROWS (1, 2 or 4, the power of two that
covers M); rows past M re-read row M-1 and are never stored, so no load needs a
row mask. A larger M takes more programs along the grid's third axis (each
re-reads the weight: correct, but feasibility keeps GEMV to M <= 4). Weight rows past N wrap to row (n % N) for the same reason. With
SPLIT_K > 1, the slices write fp32 partials and the last slice to arrive sums
them (the one-launch scheme of the split-K kernels, common.py), so there is one
launch and it is CUDA-graph safe.

Same contract as kernels/gemm/kernel.py: y = x @ w.T, x (M, K), w (N, K), row-major;
fp8 inputs carry per-tensor scales and write bf16. Unlike the MMA kernels it is compiled for each
weight shape (N, K and the strides are constants; `shape_specialised` in gemm/space.py), so the
first launch on a new weight shape compiles.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import _arrival_counters, launch_args, splitk_workspace
from .space import GemvConfig


@triton.jit
def _x_row(x_ptr, r0, r: tl.constexpr, M, stride_xm, offs_k, K, EVEN_K: tl.constexpr):
    # Row r0 + r of x as fp32, or row M-1 again past M (its result is never stored).
    row = tl.minimum(r0 + r, M - 1)
    if EVEN_K:
        v = tl.load(x_ptr + row * stride_xm + offs_k)
    else:
        v = tl.load(x_ptr + row * stride_xm + offs_k, mask=offs_k < K, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _store_row(acc, r0, r: tl.constexpr, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, pid_s,
               HAS_SCALE: tl.constexpr, SPLIT_K: tl.constexpr):
    # One token row's (BLOCK_N,) result: to y, or (split) to this slice's partials.
    yr = tl.sum(acc, axis=1)
    row = r0 + r
    mask = (offs_n < N) & (offs_n * 0 + row < M)  # a tensor compare: M is a Python int in the interpreter
    if SPLIT_K == 1:
        if HAS_SCALE:
            yr = yr * (tl.load(sa_ptr) * tl.load(sb_ptr))
        tl.store(y_ptr + row * stride_ym + offs_n, yr.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_s * M * N + row * N + offs_n, yr, mask=mask)


@triton.jit
def _reduce_row(r0, r: tl.constexpr, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n,
                HAS_SCALE: tl.constexpr, SPLIT_K: tl.constexpr):
    # The last slice to arrive: the sum of every slice's partial of row r0 + r.
    row = r0 + r
    mask = (offs_n < N) & (offs_n * 0 + row < M)  # a tensor compare: M is a Python int in the interpreter
    out = tl.zeros(offs_n.shape, dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        out += tl.load(ws_ptr + s * M * N + row * N + offs_n, mask=mask, other=0.0, cache_modifier=".cg")
    if HAS_SCALE:
        out = out * (tl.load(sa_ptr) * tl.load(sb_ptr))
    tl.store(y_ptr + row * stride_ym + offs_n, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile(acc0, acc1, acc2, acc3, w_ptrs, offs_k, x_ptr, r0, M, K, stride_xm, ROWS: tl.constexpr,
          MASK: tl.constexpr):
    """One (BLOCK_N, BLOCK_K) weight tile into the ROWS accumulators: unmasked (a full tile) or masked
    at K (the tail). The weight is read once: evict-first keeps x and the other programs' lines in
    cache (1-4% at M = 1-2 on the H100, benchmarks/results/gemv/README.md)."""
    if MASK:
        w = tl.load(w_ptrs, mask=offs_k[None, :] < K, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        w = tl.load(w_ptrs, eviction_policy="evict_first").to(tl.float32)
    acc0 += w * _x_row(x_ptr, r0, 0, M, stride_xm, offs_k, K, not MASK)[None, :]
    if ROWS > 1:
        acc1 += w * _x_row(x_ptr, r0, 1, M, stride_xm, offs_k, K, not MASK)[None, :]
    if ROWS > 2:
        acc2 += w * _x_row(x_ptr, r0, 2, M, stride_xm, offs_k, K, not MASK)[None, :]
        acc3 += w * _x_row(x_ptr, r0, 3, M, stride_xm, offs_k, K, not MASK)[None, :]
    return acc0, acc1, acc2, acc3


# N, K and the strides are compile-time constants (M is not): one compile per weight shape and
# config, which a server pays once per layer shape at warm-up (a model has a handful). With
# them constant the loop's trip count, the masks and the addressing fold away; on the H100 the
# best GEMV of the space got 1.01-1.08x faster at M = 1 (geomean about 1.03x over 11 weights of
# 8-235 MB; K alone constant gave about two thirds of that), the same configs up to 1.3x, and
# it then matches or beats Inductor's static-shape reduction kernel
# (benchmarks/results/gemv/README.md, "Shape specialisation").
@triton.jit(do_not_specialize=["M"])
def gemv_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N: tl.constexpr, K: tl.constexpr,
                stride_xm: tl.constexpr, stride_wn: tl.constexpr, stride_ym: tl.constexpr,
                HAS_SCALE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr, TILES: tl.constexpr):
    """Program (n-block, slice, row block): BLOCK_N outputs of ROWS token rows over one K slice.

    The slice's full K tiles go unmasked, TILES per loop step (the loop body is unrolled TILES
    times, so each thread has TILES weight loads in flight before the first is used: at the
    H200's 4.8 TB/s a load's latency covers more bytes than at the H100's 3.35, and Triton does
    not pipeline a loop without a dot), then the leftover full tiles one at a time, then the tile
    that K ends inside (masked; only where BLOCK_K does not divide K, and only in the last slice)."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    r0 = tl.program_id(2) * ROWS
    total: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    full: tl.constexpr = K // BLOCK_K
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    n_full = tl.maximum(tl.minimum(t1, full) - t0, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = t0 * BLOCK_K + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + (offs_n % N)[:, None] * stride_wn + offs_k[None, :]
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # Rows past ROWS carry a 1x1 placeholder, never read: one tile helper serves every ROWS.
    acc1 = tl.zeros((BLOCK_N, BLOCK_K) if ROWS > 1 else (1, 1), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K) if ROWS > 2 else (1, 1), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_K) if ROWS > 2 else (1, 1), dtype=tl.float32)
    for _g in range(n_full // TILES):
        for u in tl.static_range(TILES):
            acc0, acc1, acc2, acc3 = _tile(acc0, acc1, acc2, acc3, w_ptrs + u * BLOCK_K, offs_k + u * BLOCK_K,
                                           x_ptr, r0, M, K, stride_xm, ROWS, False)
        w_ptrs += TILES * BLOCK_K
        offs_k += TILES * BLOCK_K
    if TILES > 1:
        for _t in range(n_full % TILES):
            acc0, acc1, acc2, acc3 = _tile(acc0, acc1, acc2, acc3, w_ptrs, offs_k, x_ptr, r0, M, K, stride_xm,
                                           ROWS, False)
            w_ptrs += BLOCK_K
            offs_k += BLOCK_K
    if K % BLOCK_K != 0:
        if t1 == total:  # the last slice holds the tile that K ends inside
            acc0, acc1, acc2, acc3 = _tile(acc0, acc1, acc2, acc3, w_ptrs, offs_k, x_ptr, r0, M, K, stride_xm,
                                           ROWS, True)
    _store_row(acc0, r0, 0, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, pid_s, HAS_SCALE, SPLIT_K)
    if ROWS > 1:
        _store_row(acc1, r0, 1, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, pid_s, HAS_SCALE, SPLIT_K)
    if ROWS > 2:
        _store_row(acc2, r0, 2, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, pid_s, HAS_SCALE, SPLIT_K)
        _store_row(acc3, r0, 3, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, pid_s, HAS_SCALE, SPLIT_K)
    if SPLIT_K > 1:
        # Every thread's partial store precedes the release of the arrival count.
        tl.debug_barrier()
        tile = tl.program_id(2) * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            _reduce_row(r0, 0, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, HAS_SCALE, SPLIT_K)
            if ROWS > 1:
                _reduce_row(r0, 1, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, HAS_SCALE, SPLIT_K)
            if ROWS > 2:
                _reduce_row(r0, 2, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, HAS_SCALE, SPLIT_K)
                _reduce_row(r0, 3, y_ptr, ws_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, HAS_SCALE, SPLIT_K)
            # Zero again for the next launch (CUDA graphs replay with the same counters).
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


def launch(cfg: GemvConfig, x: torch.Tensor, w: torch.Tensor, out=None, scale_a=None, scale_b=None):
    """Run a GEMV candidate for y = x @ w.T; returns y. Never synchronises."""
    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    grid = (triton.cdiv(N, cfg.block_n), cfg.split_k, triton.cdiv(M, cfg.block_m))
    if cfg.split_k > 1:
        ws = splitk_workspace(x.device, cfg.split_k, M, N)
        cnt = _arrival_counters(x.device, grid[0] * grid[2])
    else:
        ws, cnt = out, out  # never read without a split
    gemv_kernel[grid](x, w, out, ws, cnt, sa, sb, M, N, K, x.stride(0), w.stride(0), out.stride(0),
                      HAS_SCALE=has_scale, ROWS=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      SPLIT_K=cfg.split_k, TILES=cfg.num_stages, num_warps=cfg.num_warps,
                      # The config's num_stages is the tiles in flight of the unrolled loop (TILES),
                      # not Triton's software pipeline, which a loop without a dot does not get.
                      num_stages=1)
    return out
