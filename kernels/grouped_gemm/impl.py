"""The grouped-GEMM op's implementation (torch, triton; imported lazily by the registry).

G groups, group g owning rows [offs[g-1], offs[g]) of the token operands (offs: the cumulative
int32 row ends, (G,), torch._grouped_mm's ``offs``; offs[-1] = M). One launch per pass:

- ``fwd``:   launch(cfg, "fwd",   x (M, K),  w (G, N, K), offs) -> y (M, N),     y_g  = x_g @ W_g^T
- ``dgrad``: launch(cfg, "dgrad", dy (M, N), w (G, N, K), offs) -> dx (M, K),    dx_g = dy_g @ W_g
- ``wgrad``: launch(cfg, "wgrad", dy (M, N), x (M, K),    offs) -> dW (G, N, K), dW_g = dy_g^T @ x_g

Kernels (Triton; the CPU interpreter runs every one of them, the TMA ones included: it emulates
tensor descriptors, their bounds and their alignment checks):
- ``_gg_rows_kernel`` (fwd, dgrad; one kernel, W read through strides: transposed for fwd, as
  stored for dgrad): the tile schedule is every group's row tiles concatenated (sum_g
  ceil(tokens_g / BLOCK_M)) times the column tiles, in grouped order; each program finds its
  tile's group on the device from offs (a cumulative sum over the padded group count, no host
  sync). ``tiled``: a grid of the worst case (ceil(M / BLOCK_M) + G row tiles; the programs past
  the real schedule exit); ``persistent``: one program per SM looping over the schedule;
  ``splitk``: a second grid axis over slices of the reduction, fp32 partials added atomically.
- ``_gg_wgrad_kernel``: a static schedule of G x (N / BLOCK_M) x (K / BLOCK_N) tiles, each
  reducing over its group's own token range (read from offs on the device: an empty group
  writes zeros); ``splitk`` splits every group's token range into SPLIT_K slices.
- ``_gg_rows_tma_kernel`` / ``_gg_wgrad_tma_kernel`` (``persistent_tma``): the same schedules,
  persistent, every operand loaded and the output stored through TMA tensor descriptors made on
  the device (``tl.make_tensor_descriptor``; their 128-byte tensor maps live in a per-program
  workspace that Triton asks ``triton.set_allocator``'s allocator for at launch). A ragged group
  needs no masks: TMA zero-fills the loads and drops the stores past a descriptor's bounds, so
  where a group's rows end, a descriptor made per tile ends there. fwd/dgrad: x or dy is one
  (M, RED) descriptor per program (rows past the group feed only output rows the store drops), W
  one 3-D (G, rows, cols) descriptor per program (a box is one expert's: the reduction's tail
  reads zeros, not the next expert's rows), y/dx one per tile, cut after the group's last row.
  wgrad: dy and x one per tile, cut after the group's last token (the reduction's tail reads
  zeros), dW one 3-D descriptor per program.
- the vendor ``grouped_mm``: ``torch._grouped_mm`` (2D x 3D with offs for fwd and dgrad, 2D x 2D
  with offs for wgrad).

``launch`` never synchronises the device and reads nothing on the host that depends on data, so
a pass can be captured in a CUDA graph (split-K's zeroed fp32 buffer and the TMA kernels'
descriptor workspace are allocated per launch, which a capture allows). dtypes: bf16; fp16/fp32 for the CPU interpreter tests (it computes
garbage for bf16 dots).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from ..common import _grouped_tile, no_tf32, num_sms
from .space import (MAX_GROUPS, STAGES, TMA_ALIGN_BYTES, GgPersistentConfig, GgPersistentTmaConfig,
                    GgSplitKConfig, GgTiledConfig, Problem, VendorConfig, _pad_groups)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

# Relative Frobenius error bounds against the fp32 reference of the same operands: one rounding of
# the output (bf16 2^-9, fp16 2^-12); fp32 dots may run in TF32 on the GPU.
ERROR_BOUNDS = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 2e-3}


# ----------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------

@triton.jit
def _row_schedule(offs_ptr, G, G_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    # Per group (padded to G_PAD lanes): first row, end row, row tiles, and the inclusive cumulative
    # row tiles, whose sum is the schedule's length. Padding lanes hold no rows and no tiles.
    gi = tl.arange(0, G_PAD)
    live = gi < G
    ends = tl.load(offs_ptr + gi, mask=live, other=0)
    starts = tl.load(offs_ptr + gi - 1, mask=live & (gi > 0), other=0)
    cnt = tl.maximum(ends - starts, 0)
    tiles = (cnt + BLOCK_M - 1) // BLOCK_M
    cum = tl.cumsum(tiles, 0)
    return gi, starts, ends, tiles, cum


@triton.jit
def _rows_tile(t, pid_s, a_ptr, b_ptr, c_ptr, N_OUT, RED, stride_am, stride_bg, stride_bk, stride_bn, stride_cm,
               gi, starts, ends, tiles, cum, num_row_tiles, num_pid_n,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, ALIGNED_OUT: tl.constexpr):
    # One output tile of fwd/dgrad: rows of one group (row tile r of the concatenated schedule),
    # BLOCK_N output columns, the reduction slice pid_s of SPLIT_K.
    r, pid_n = _grouped_tile(t, num_row_tiles, num_pid_n, GROUP_M)
    g = tl.sum((cum <= r).to(tl.int32), 0)  # the first group whose cumulative tiles pass r
    sel = gi == g
    first = tl.sum(tl.where(sel, cum - tiles, 0), 0)
    g_end = tl.sum(tl.where(sel, ends, 0), 0)
    row0 = tl.sum(tl.where(sel, starts, 0), 0) + (r - first) * BLOCK_M
    lm = tl.arange(0, BLOCK_M)
    rows_ok = row0 + lm < g_end
    # Rows past the group are clamped to its first row (always one of its rows) rather than
    # masked: the loads stay unpredicated along M and the store mask drops those lanes.
    lm_c = tl.where(rows_ok, lm, 0)
    col0 = pid_n * BLOCK_N
    ln = tl.arange(0, BLOCK_N)
    cols_ok = col0 + ln < N_OUT
    if ALIGNED_OUT:
        # Columns past N_OUT wrap (modulo) instead of being clamped: the index stays affine with the
        # hints below, so dgrad's B (W_g read along K, its contiguous axis) loads as 16-byte vectors.
        # A clamped index hid the contiguity: dgrad ran at 0.12x of torch._grouped_mm on the H200
        # (benchmarks/results/grouped_gemm/). N_OUT % 8 == 0 keeps every 8-vector on one side of the wrap.
        ln_c = tl.max_contiguous(tl.multiple_of((col0 + ln) % N_OUT, BLOCK_N), BLOCK_N) - col0
    else:
        ln_c = tl.where(cols_ok, ln, 0)
    k_tiles = tl.cdiv(RED, BLOCK_K)
    per = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_s * per
    kt1 = tl.minimum(kt0 + per, k_tiles)
    lk = tl.arange(0, BLOCK_K)
    # Tile bases in int64 (M x K, G x N x K can pass 2**31 elements); offsets within a tile in int32.
    a_ptrs = (a_ptr + row0.to(tl.int64) * stride_am + (kt0 * BLOCK_K).to(tl.int64)
              + (lm_c[:, None] * stride_am + lk[None, :]))
    b_ptrs = (b_ptr + g.to(tl.int64) * stride_bg + (kt0 * BLOCK_K).to(tl.int64) * stride_bk
              + col0.to(tl.int64) * stride_bn + (lk[:, None] * stride_bk + ln_c[None, :] * stride_bn))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt0, kt1):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            left = RED - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=lk[None, :] < left, other=0.0)
            b = tl.load(b_ptrs, mask=lk[:, None] < left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + row0.to(tl.int64) * stride_cm + col0 + (lm[:, None] * stride_cm + ln[None, :])
    mask = rows_ok[:, None] & cols_ok[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit(do_not_specialize=["M", "G"])
def _gg_rows_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N_OUT, RED, G,
                    stride_am, stride_bg, stride_bk, stride_bn, stride_cm,
                    G_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                    PERSISTENT: tl.constexpr, ALIGNED_OUT: tl.constexpr):
    # fwd (B = W_g^T: stride_bk 1, stride_bn K) and dgrad (B = W_g: stride_bk K, stride_bn 1):
    # C[rows of g] = A[rows of g] @ B_g, A (M, RED), B_g (RED, N_OUT), C (M, N_OUT).
    gi, starts, ends, tiles, cum = _row_schedule(offs_ptr, G, G_PAD, BLOCK_M)
    num_row_tiles = tl.sum(tiles, 0)
    num_pid_n = tl.cdiv(N_OUT, BLOCK_N)
    total = num_row_tiles * num_pid_n
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    if PERSISTENT:
        for t in range(pid, total, tl.num_programs(0)):
            _rows_tile(t, pid_s, a_ptr, b_ptr, c_ptr, N_OUT, RED, stride_am, stride_bg, stride_bk, stride_bn,
                       stride_cm, gi, starts, ends, tiles, cum, num_row_tiles, num_pid_n,
                       BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, EVEN_K, ALIGNED_OUT)
    else:
        if pid < total:  # the worst-case grid's programs past the real schedule do nothing
            _rows_tile(pid, pid_s, a_ptr, b_ptr, c_ptr, N_OUT, RED, stride_am, stride_bg, stride_bk, stride_bn,
                       stride_cm, gi, starts, ends, tiles, cum, num_row_tiles, num_pid_n,
                       BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, EVEN_K, ALIGNED_OUT)


@triton.jit
def _wgrad_tile(t, pid_s, dy_ptr, x_ptr, c_ptr, offs_ptr, N, K, stride_dym, stride_xm, stride_cg, stride_cn,
                num_pid_m, num_pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ALIGNED: tl.constexpr):
    # One tile of dW_g (BLOCK_M rows of N by BLOCK_N columns of K), reduced over the slice pid_s of
    # group g's tokens.
    per_group = num_pid_m * num_pid_n
    g = t // per_group
    pid_m, pid_n = _grouped_tile(t % per_group, num_pid_m, num_pid_n, GROUP_M)
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.load(offs_ptr + g)
    cnt = tl.maximum(end - start, 0)
    chunk = tl.cdiv(tl.cdiv(cnt, SPLIT_K), BLOCK_K) * BLOCK_K
    t0 = start + pid_s * chunk
    t1 = tl.minimum(t0 + chunk, start + cnt)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    lm = tl.arange(0, BLOCK_M)
    ln = tl.arange(0, BLOCK_N)
    rows_ok = row0 + lm < N
    cols_ok = col0 + ln < K
    if ALIGNED:
        # Wrapped, not clamped, with contiguity hints: A = dy^T is read along N and B = x along K, both
        # their contiguous axes, so the loads stay 16-byte vectors (see _rows_tile; N % 8 == K % 8 == 0).
        lm_c = tl.max_contiguous(tl.multiple_of((row0 + lm) % N, BLOCK_M), BLOCK_M) - row0
        ln_c = tl.max_contiguous(tl.multiple_of((col0 + ln) % K, BLOCK_N), BLOCK_N) - col0
    else:
        lm_c = tl.where(rows_ok, lm, 0)
        ln_c = tl.where(cols_ok, ln, 0)
    lt = tl.arange(0, BLOCK_K)
    # A = dy[tokens, n]^T (BLOCK_M x BLOCK_K), B = x[tokens, k] (BLOCK_K x BLOCK_N); tokens past the
    # slice load zeros (they are the reduction: clamping would add other rows).
    a_ptrs = dy_ptr + t0.to(tl.int64) * stride_dym + row0 + (lt[None, :] * stride_dym + lm_c[:, None])
    b_ptrs = x_ptr + t0.to(tl.int64) * stride_xm + col0 + (lt[:, None] * stride_xm + ln_c[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tt in range(t0, t1, BLOCK_K):
        left = t1 - tt
        a = tl.load(a_ptrs, mask=lt[None, :] < left, other=0.0)
        b = tl.load(b_ptrs, mask=lt[:, None] < left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_dym
        b_ptrs += BLOCK_K * stride_xm
    c_ptrs = (c_ptr + g.to(tl.int64) * stride_cg + row0.to(tl.int64) * stride_cn + col0
              + (lm[:, None] * stride_cn + ln[None, :]))
    mask = rows_ok[:, None] & cols_ok[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit(do_not_specialize=["G"])
def _gg_wgrad_kernel(dy_ptr, x_ptr, c_ptr, offs_ptr, N, K, G, stride_dym, stride_xm, stride_cg, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     SPLIT_K: tl.constexpr, PERSISTENT: tl.constexpr, ALIGNED: tl.constexpr):
    num_pid_m = tl.cdiv(N, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    total = G * num_pid_m * num_pid_n
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    if PERSISTENT:
        for t in range(pid, total, tl.num_programs(0)):
            _wgrad_tile(t, pid_s, dy_ptr, x_ptr, c_ptr, offs_ptr, N, K, stride_dym, stride_xm, stride_cg, stride_cn,
                        num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, ALIGNED)
    else:
        _wgrad_tile(pid, pid_s, dy_ptr, x_ptr, c_ptr, offs_ptr, N, K, stride_dym, stride_xm, stride_cg, stride_cn,
                    num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, ALIGNED)


# -- TMA (persistent_tma) -------------------------------------------------------------------

@triton.jit(do_not_specialize=["M", "G", "NUM_PROGRAMS"])
def _gg_rows_tma_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, M, N_OUT, RED, G, NUM_PROGRAMS,
                        G_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, FWD: tl.constexpr, FLATTEN: tl.constexpr,
                        WARP_SPEC: tl.constexpr):
    # fwd: C (M, N_OUT) rows of g = A (M, RED) rows of g @ W_g^T, W (G, N_OUT, RED);
    # dgrad: C (M, N_OUT) rows of g = A (M, RED) rows of g @ W_g, W (G, RED, N_OUT).
    # Every tensor is contiguous and row-major (space.PROBLEM_RULES: 16-byte row strides).
    gi, starts, ends, tiles, cum = _row_schedule(offs_ptr, G, G_PAD, BLOCK_M)
    num_row_tiles = tl.sum(tiles, 0)
    num_pid_n = tl.cdiv(N_OUT, BLOCK_N)
    k_tiles = tl.cdiv(RED, BLOCK_K)
    # Made once per program. A: a tile's rows past its group are the next group's (or zeros past M);
    # they reach only output rows that the group's store descriptor drops. W: 3-D, so TMA bounds each
    # expert's own rows and columns (a box of one expert: the K tail of fwd and the reduction tail of
    # dgrad read zeros, never the next expert), loaded straight into the MMA's shared memory.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, RED], strides=[RED, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_stride = N_OUT.to(tl.int64) * RED
    if FWD:
        w_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, N_OUT, RED], strides=[w_stride, RED, 1],
                                           block_shape=[1, BLOCK_N, BLOCK_K])
    else:
        w_desc = tl.make_tensor_descriptor(b_ptr, shape=[G, RED, N_OUT], strides=[w_stride, N_OUT, 1],
                                           block_shape=[1, BLOCK_K, BLOCK_N])
    for t in tl.range(tl.program_id(0), num_row_tiles * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN,
                      warp_specialize=WARP_SPEC):
        r, pid_n = _grouped_tile(t, num_row_tiles, num_pid_n, GROUP_M)
        g = tl.sum((cum <= r).to(tl.int32), 0)
        sel = gi == g
        first = tl.sum(tl.where(sel, cum - tiles, 0), 0)
        g_end = tl.sum(tl.where(sel, ends, 0), 0)
        row0 = tl.sum(tl.where(sel, starts, 0), 0) + (r - first) * BLOCK_M
        col0 = pid_n * BLOCK_N
        # The output cut after the group's last row (made per tile: a program's next tile may be
        # another group's): the tile's rows past it are not written.
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[g_end, N_OUT], strides=[N_OUT, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FWD:
            for kt in range(k_tiles):
                a = a_desc.load([row0, kt * BLOCK_K])
                b = w_desc.load([g, col0, kt * BLOCK_K]).reshape(BLOCK_N, BLOCK_K)
                acc = tl.dot(a, b.T, acc)
        else:
            for kt in range(k_tiles):
                a = a_desc.load([row0, kt * BLOCK_K])
                b = w_desc.load([g, kt * BLOCK_K, col0]).reshape(BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc)
        c_desc.store([row0, col0], acc.to(c_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["G", "NUM_PROGRAMS"])
def _gg_wgrad_tma_kernel(dy_ptr, x_ptr, c_ptr, offs_ptr, N, K, G, NUM_PROGRAMS,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr):
    # dW_g (N, K) = dy[tokens of g]^T (N x T_g) @ x[tokens of g] (T_g x K); dW (G, N, K).
    num_pid_m = tl.cdiv(N, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    per_group = num_pid_m * num_pid_n
    # dW: 3-D, made once per program; a box of one expert, so rows past N are not written.
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[G, N, K], strides=[N.to(tl.int64) * K, K, 1],
                                       block_shape=[1, BLOCK_M, BLOCK_N])
    for t in tl.range(tl.program_id(0), G * per_group, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPEC):
        g = t // per_group
        pid_m, pid_n = _grouped_tile(t % per_group, num_pid_m, num_pid_n, GROUP_M)
        start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
        end = tl.load(offs_ptr + g)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        # dy and x cut after the group's last token (made per tile): the last reduction step's
        # tokens past it load zeros. (At least one row: a descriptor of no rows is never read, as
        # the loop is then empty.)
        rows = tl.maximum(end, 1)
        dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[rows, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_M])
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[rows, K], strides=[K, 1], block_shape=[BLOCK_K, BLOCK_N])
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for tt in range(start, end, BLOCK_K):
            a = dy_desc.load([tt, row0])
            b = x_desc.load([tt, col0])
            acc = tl.dot(a.T, b, acc)
        # An empty group's tiles store zeros.
        if WARP_SPEC:
            # Triton 3.6's warp specialisation pass fails on this kernel with the 3-D dW descriptor
            # and compiles it with this one (benchmarks/explore/gg_tma_compile_check.py): dW as
            # (G * N, K), cut after dW_g, made per tile.
            c2_desc = tl.make_tensor_descriptor(c_ptr, shape=[(g + 1) * N, K], strides=[K, 1],
                                                block_shape=[BLOCK_M, BLOCK_N])
            c2_desc.store([g * N + row0, col0], acc.to(c_ptr.dtype.element_ty))
        else:
            c_desc.store([g, row0, col0], acc.to(c_ptr.dtype.element_ty).reshape(1, BLOCK_M, BLOCK_N))


# ----------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------

def output_shape(stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> tuple:
    """fwd: (M, N); dgrad: (M, K); wgrad: (G, N, K)."""
    if stage == "fwd":
        return a.shape[0], b.shape[1]
    if stage == "dgrad":
        return a.shape[0], b.shape[2]
    return offs.shape[0], a.shape[1], b.shape[1]


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.type == "cuda" and t.device.index is not None else (
        torch.cuda.current_device() if t.device.type == "cuda" else -1)


def _vendor(stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # torch._grouped_mm (CUTLASS grouped GEMM on sm90, bf16): mat_b row- or column-major with
    # 16-byte strides; the wgrad form reduces over each group's slice of the shared dimension.
    if stage == "fwd":
        return torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
    if stage == "dgrad":
        return torch._grouped_mm(a, b, offs=offs)
    return torch._grouped_mm(a.t(), b, offs=offs)


# Loop knobs of the TMA kernels (constexprs, not config fields): FLATTEN lets the software pipeline
# prefetch the next tile's loads during a tile's epilogue (the dense persistent TMA kernel's
# setting); WARP_SPEC asks for Triton's producer/consumer warp specialisation of the tile loop,
# which the dense op measured at no gain on the H100 (docs/decisions/002) and is left off.
TMA_FLATTEN = True
TMA_WARP_SPEC = False


def _tma_workspace(size: int, alignment: int, stream) -> torch.Tensor:
    # The per-program workspace of device-made tensor descriptors (128 bytes each), on the current
    # device (the launch's); allocated through torch, so a CUDA-graph capture takes it from the
    # graph's pool.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_tma_allocator() -> None:
    """Give Triton an allocator for the descriptors' workspace where none is set. Triton keeps it in
    a ContextVar: a thread that never set one (autograd's backward threads) sees none, so every TMA
    launch calls this; one set by someone else (Inductor, a user) is kept."""
    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):  # a Triton without these names: set ours
        pass
    triton.set_allocator(_tma_workspace)


def tma_operands_ok(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the TMA kernels can read these (contiguous) operands: every base address and row
    stride a multiple of 16 bytes. The row strides are space.PROBLEM_RULES' (N and K); the base
    addresses are not seen by the rules (an offset view), so launch checks them on the host."""
    return all(t.data_ptr() % TMA_ALIGN_BYTES == 0
               and (t.dim() < 2 or (t.stride(-2) * t.element_size()) % TMA_ALIGN_BYTES == 0)
               for t in (a, b, out))


def tma_launch_args(cfg: GgPersistentTmaConfig, stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                    sms: int) -> tuple[tuple, dict]:
    """(grid, keyword arguments beyond the tensors) of the TMA kernel of ``stage``: the scalar
    arguments and constexprs a launch passes (what the tests check without a GPU)."""
    G = offs.shape[0]
    common = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                  FLATTEN=TMA_FLATTEN, WARP_SPEC=TMA_WARP_SPEC, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if stage == "wgrad":
        M, N = a.shape
        K = b.shape[1]
        tiles = G * triton.cdiv(N, cfg.block_m) * triton.cdiv(K, cfg.block_n)
        progs = max(1, min(sms, tiles))
        return (progs,), dict(N=N, K=K, G=G, NUM_PROGRAMS=progs, **common)
    M, RED = a.shape
    _, N, K = b.shape
    n_out = N if stage == "fwd" else K
    # The worst case of sum_g ceil(tokens_g / BLOCK_M) bounds the schedule, as for `persistent`.
    tiles = (triton.cdiv(M, cfg.block_m) + G) * triton.cdiv(n_out, cfg.block_n)
    progs = max(1, min(sms, tiles))
    return (progs,), dict(M=M, N_OUT=n_out, RED=RED, G=G, NUM_PROGRAMS=progs, G_PAD=_pad_groups(G),
                          FWD=stage == "fwd", **common)


def _launch_tma(cfg: GgPersistentTmaConfig, stage: str, a, b, offs, out) -> torch.Tensor:
    if a.is_cuda:
        ensure_tma_allocator()
    grid, kw = tma_launch_args(cfg, stage, a, b, offs, num_sms(_device_index(a)))
    kernel = _gg_wgrad_tma_kernel if stage == "wgrad" else _gg_rows_tma_kernel
    kernel[grid](a, b, out, offs, **kw)
    return out


def launch(cfg, stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one pass on candidate ``cfg``; returns the output (``out`` when given, except for the
    vendor, which returns its own tensor). fwd: a = x (M, K), b = w (G, N, K); dgrad: a = dy (M, N),
    b = w; wgrad: a = dy (M, N), b = x (M, K). offs: int32 (G,) cumulative row ends. Does not
    validate (hot path: see check_operands); never synchronises the device."""
    if isinstance(cfg, VendorConfig):
        return _vendor(stage, a, b, offs)
    if not isinstance(cfg, (GgTiledConfig, GgPersistentConfig, GgSplitKConfig, GgPersistentTmaConfig)):
        raise ValueError(f"not a grouped_gemm config: {cfg!r}")
    if out is None:
        out = torch.empty(output_shape(stage, a, b, offs), dtype=a.dtype, device=a.device)
    if isinstance(cfg, GgPersistentTmaConfig):
        if tma_operands_ok(a, b, out):
            return _launch_tma(cfg, stage, a, b, offs, out)
        # An unaligned view (or N, K off the rule, launched directly): the same tile and order
        # through pointer loads.
        cfg = GgPersistentConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps, cfg.num_stages)
    split = getattr(cfg, "split_k", 1)
    persistent = isinstance(cfg, GgPersistentConfig)
    group_m = getattr(cfg, "group_m", 1)
    # Split-K partials are summed in fp32 (atomics into a zeroed buffer), then cast once.
    c = torch.zeros(out.shape, dtype=torch.float32, device=a.device) if split > 1 else out
    G = offs.shape[0]
    sms = num_sms(_device_index(a))
    if stage == "wgrad":
        M, N = a.shape
        K = b.shape[1]
        tiles = G * triton.cdiv(N, cfg.block_m) * triton.cdiv(K, cfg.block_n)
        progs = min(sms, tiles) if persistent else tiles
        _gg_wgrad_kernel[(progs, split)](
            a, b, c, offs, N, K, G, a.stride(0), b.stride(0), c.stride(0), c.stride(1),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=group_m, SPLIT_K=split,
            PERSISTENT=persistent, ALIGNED=N % 8 == 0 and K % 8 == 0, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
    else:
        M, RED = a.shape
        _, N, K = b.shape
        n_out = N if stage == "fwd" else K
        # fwd reads W_g^T (RED = K along W's rows' contiguous axis), dgrad W_g as stored (RED = N).
        stride_bk, stride_bn = (b.stride(2), b.stride(1)) if stage == "fwd" else (b.stride(1), b.stride(2))
        # Worst case of sum_g ceil(tokens_g / BLOCK_M): each group adds at most one partial tile.
        tiles = (triton.cdiv(M, cfg.block_m) + G) * triton.cdiv(n_out, cfg.block_n)
        progs = min(sms, tiles) if persistent else tiles
        _gg_rows_kernel[(progs, split)](
            a, b, c, offs, M, n_out, RED, G, a.stride(0), b.stride(0), stride_bk, stride_bn, c.stride(0),
            G_PAD=_pad_groups(G), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP_M=group_m, SPLIT_K=split, EVEN_K=RED % cfg.block_k == 0, PERSISTENT=persistent,
            ALIGNED_OUT=n_out % 8 == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        out.copy_(c)
    return out


# ----------------------------------------------------------------------------
# Operand checks
# ----------------------------------------------------------------------------

_NAMES = {"fwd": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}


def check_operands(stage: str, a, b, offs, out=None) -> str:
    """'' if ``launch(cfg, stage, a, b, offs, out)`` accepts these operands, else what is wrong,
    naming the argument. Host-side checks only (offs' values are not read: that would sync)."""
    if stage not in STAGES:
        return f"stage must be one of {', '.join(STAGES)}, got {stage!r}"
    an, bn = _NAMES[stage]
    for label, t in ((an, a), (bn, b), ("offs", offs)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            return f"{label} must be a torch tensor, got {type(t).__name__}"
        if t.device != a.device:
            return f"{label} is on {t.device}, {an} on {a.device}: all operands must be on one device"
    for label, t in ((an, a), (bn, b), ("offs", offs)):
        if not t.is_contiguous():
            return f"{label} must be contiguous"
    if offs.dim() != 1 or offs.dtype != torch.int32 or not 1 <= offs.numel() <= MAX_GROUPS:
        return f"offs must be a 1-D int32 tensor of 1..{MAX_GROUPS} cumulative group ends, got {offs.dtype} {tuple(offs.shape)}"
    if a.dtype not in DTYPE_NAMES or b.dtype != a.dtype:
        return f"{an} and {bn} must share one dtype of {sorted(TORCH_DTYPES)}, got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        return f"{an} must be 2-D with M, and its columns, >= 1, got shape {tuple(a.shape)}"
    G = offs.shape[0]
    if stage == "wgrad":
        if b.dim() != 2 or b.shape[0] != a.shape[0] or b.shape[1] < 1:
            return f"x must be 2-D (M, K) with dy's M = {a.shape[0]} rows, got shape {tuple(b.shape)}"
    else:
        if b.dim() != 3 or b.shape[0] != G or min(b.shape) < 1:
            return f"w must be 3-D (G, N, K) with G = offs' {G} groups, got shape {tuple(b.shape)}"
        red = b.shape[2] if stage == "fwd" else b.shape[1]
        if a.shape[1] != red:
            what = "K" if stage == "fwd" else "N"
            return f"{an} must have {what} = {red} columns (w is (G, N, K) = {tuple(b.shape)}), got {a.shape[1]}"
    if out is not None:
        want = tuple(output_shape(stage, a, b, offs))
        if tuple(out.shape) != want or out.dtype != a.dtype or not out.is_contiguous():
            return f"out must be a contiguous {a.dtype} tensor of shape {want}, got {out.dtype} {tuple(out.shape)}"
    return ""


# ----------------------------------------------------------------------------
# Operands, reference
# ----------------------------------------------------------------------------

@dataclass
class Operands:
    """One pass's inputs and preallocated output: fwd (a = x, b = w), dgrad (a = dy, b = w), wgrad
    (a = dy, b = x); offs int32 (G,) cumulative group ends."""

    stage: str
    a: torch.Tensor
    b: torch.Tensor
    offs: torch.Tensor
    out: torch.Tensor

    def run(self, cfg) -> torch.Tensor:
        return launch(cfg, self.stage, self.a, self.b, self.offs, self.out)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, self.b, self.offs, self.out))


def group_offsets(counts, device) -> torch.Tensor:
    """int32 (G,) cumulative ends of the groups' token counts."""
    return torch.from_numpy(np.cumsum(np.asarray(counts, dtype=np.int64)).astype(np.int32)).to(device)


def _randn(shape, scale: float, dtype: torch.dtype, device, generator) -> torch.Tensor:
    # Drawn in the operand dtype (no fp32 copy of a multi-GB weight), then scaled in place.
    return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(scale)


def make_operands(problem: Problem, device, generator: torch.Generator) -> Operands:
    """Fresh random inputs of one pass (never zeros): tokens ~ N(0, 1), weights ~ N(0, 1/K) (fwd) or
    N(0, 1/N) (dgrad); group sizes from the problem's routing (deterministic per problem)."""
    m, n, k, e = problem.m, problem.n, problem.k, problem.e
    dt = TORCH_DTYPES[problem.dtype]
    offs = group_offsets(problem.counts(), device)
    if problem.stage == "fwd":
        a, b = _randn((m, k), 1.0, dt, device, generator), _randn((e, n, k), k ** -0.5, dt, device, generator)
    elif problem.stage == "dgrad":
        a, b = _randn((m, n), 1.0, dt, device, generator), _randn((e, n, k), n ** -0.5, dt, device, generator)
    else:
        a, b = _randn((m, n), 1.0, dt, device, generator), _randn((m, k), 1.0, dt, device, generator)
    out = torch.empty(problem.out_shape, dtype=dt, device=device)
    return Operands(problem.stage, a, b, offs, out)


def pass_reference(stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """fp32 reference of one pass, group by group (reads offs on the host: synchronises); TF32 off.
    Rows past offs[-1] (fwd, dgrad) and empty groups' dW (wgrad) are zeros."""
    ends = [int(v) for v in offs.tolist()]
    out = torch.zeros(output_shape(stage, a, b, offs), dtype=torch.float32, device=a.device)
    start = 0
    with no_tf32(a.device):
        for g, end in enumerate(ends):
            if end > start:
                if stage == "fwd":
                    out[start:end] = a[start:end].float() @ b[g].float().T
                elif stage == "dgrad":
                    out[start:end] = a[start:end].float() @ b[g].float()
                else:
                    out[g] = a[start:end].float().T @ b[start:end].float()
            start = max(start, end)
    return out


def reference(ops: Operands) -> torch.Tensor:
    """fp32 reference of one pass's operand set."""
    return pass_reference(ops.stage, ops.a, ops.b, ops.offs)
