"""Swap-AB decode GEMM: computes y.T = w @ x.T so the weight fills the MMA's M side.

Why: for decode (M <= 64) the tiled and split-K kernels put the tiny M on the
MMA's M side, padded to 16 rows, so Hopper's wgmma (64 rows per warpgroup) is
out of reach and the loads go through the Ampere-style path. cuBLAS instead
swaps the operands on these shapes (`nvjet_sm90_tst_64x8_...`,
`..._64x32_...` in benchmarks/results/vendor/): a tile is BLOCK_N weight rows by
BLOCK_M tokens, where BLOCK_M can be as small as 8 (the config space uses 16-64). Here the same: each program
computes a (BLOCK_N, BLOCK_M) tile of y.T over one slice of K (SPLIT_K slices,
summed in one launch by the last slice to arrive, with the split-K kernel's
epilogue from common.py), loading either through pointers (any K) or through
TMA descriptors (16-byte aligned rows).

Same contract as kernels/gemm/kernel.py: y = x @ w.T, x (M, K), w (N, K), row-major;
fp8 inputs carry per-tensor scales and write bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import _arrival_counters, _mainloop, _splitk_last_arrival, launch_args, splitk_workspace
from .space import SwapABConfig, SwapABTmaConfig


@triton.jit
def _finish_transposed(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, offs_m,
                       tile, pid_s, HAS_SCALE: tl.constexpr, SPLIT_K: tl.constexpr):
    # acc is a (BLOCK_N, BLOCK_M) tile of y.T: element (i, j) goes to y[offs_m[j], offs_n[i]].
    if SPLIT_K == 1:
        mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        if HAS_SCALE:
            acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        _splitk_last_arrival(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_m, offs_n,
                             tile, pid_s, HAS_SCALE, SPLIT_K, True)


@triton.jit(do_not_specialize=["M"])
def gemm_swapab_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, K, stride_xm, stride_wn,
                       stride_ym, HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Program (n-tile, m-tile, slice): pointer loads, any K."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    # The shared main loop with the operands swapped: w's rows play x's part.
    acc = _mainloop(w_ptr, x_ptr, offs_n, offs_m, N, M, K, t0, t1 - t0, stride_wn, stride_xm,
                    BLOCK_N, BLOCK_M, BLOCK_K, EVEN_K)
    tile = pid_m * tl.num_programs(0) + pid_n
    _finish_transposed(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, offs_m,
                       tile, pid_s, HAS_SCALE, SPLIT_K)


@triton.jit(do_not_specialize=["M"])
def gemm_swapab_tma_kernel(x_desc, w_desc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, K, stride_ym,
                           HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """Program (n-tile, m-tile, slice): TMA loads (zero-filled out of range, so no masks)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(t0, t1):
        b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
        a = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
        acc = tl.dot(b, a.T, acc)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tile = pid_m * tl.num_programs(0) + pid_n
    _finish_transposed(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_n, offs_m,
                       tile, pid_s, HAS_SCALE, SPLIT_K)


def launch(cfg: SwapABConfig, x: torch.Tensor, w: torch.Tensor, out=None, scale_a=None, scale_b=None):
    """Run a swap-AB candidate for y = x @ w.T; returns y. Never synchronises."""
    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    grid = (triton.cdiv(N, cfg.block_n), triton.cdiv(M, cfg.block_m), cfg.split_k)
    tiles = grid[0] * grid[1]
    if cfg.split_k > 1:
        ws = splitk_workspace(x.device, cfg.split_k, M, N)
        cnt = _arrival_counters(x.device, tiles)
    else:
        ws, cnt = out, out  # never read without a split
    common = dict(HAS_SCALE=has_scale, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
                  SPLIT_K=cfg.split_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if isinstance(cfg, SwapABTmaConfig):
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
        w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
        gemm_swapab_tma_kernel[grid](x_desc, w_desc, out, ws, cnt, sa, sb, M, N, K, out.stride(0), **common)
    else:
        gemm_swapab_kernel[grid](x, w, out, ws, cnt, sa, sb, M, N, K, x.stride(0), w.stride(0), out.stride(0),
                                 EVEN_K=K % cfg.block_k == 0, **common)
    return out
