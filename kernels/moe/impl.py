"""The fused-MoE op's implementation (torch, triton; imported lazily by the registry).

vLLM's ``fused_experts`` as two stages, each one registry problem with its own config:

- ``gate_up``: x (M, hidden) and w1 (E, 2I, hidden) (nn.Linear layout, rows [0:I] gate, [I:2I]
  up) -> the intermediate (M * top_k, I), row t * top_k + j = silu(x[t] @ g_e.T) * (x[t] @ u_e.T)
  with e = topk_ids[t, j];
- ``down``: the intermediate and w2 (E, hidden, I) -> y (M, hidden) = sum_j topk_weights[t, j] *
  (intermediate[t * top_k + j] @ w2[topk_ids[t, j]].T).

Candidates:
- a ``MoeTiledConfig`` (vLLM's fused_moe_kernel scheme): ``align`` sorts the token-expert pairs by
  expert and pads each expert's group to BLOCK_M rows (two Triton launches, no host sync), then one
  grouped GEMM launch over (BLOCK_M rows of one expert) x (BLOCK_N weight rows) tiles in grouped
  order; then silu-and-mul (gate_up) or the sum over top_k (down).
- a ``MoeSwapABConfig`` (decode): the same align, then the grouped GEMM with the operands swapped
  (``moe_swapab_kernel``: weight rows on the MMA's M side, a block of sorted pairs on its N side),
  optionally split over K into a zeroed fp32 buffer that silu-and-mul or the sum then read;
- a ``MoeGemvConfig`` (decode, M <= 4): one launch per stage, no align: CUDA-core dot products
  of each pair's activation row with its expert's weight rows read straight from topk_ids, the
  silu-and-mul (gate_up) or the weighted sum over top_k (down) fused (``moe_gemv_*_kernel``);
- the vendor ``grouped_mm``: the pairs permuted expert-contiguous with torch ops, then
  ``torch._grouped_mm``, then the same silu-and-mul / weighted sum kernels, scattering back.

dtypes: bf16; fp8 (w8a8, per-tensor activation scale, one scale per expert for the weights,
bf16 output; the down stage quantises its bf16 input inside its launch with a static scale);
fp16/fp32 for the Triton CPU interpreter (which computes garbage for bf16/fp8 dots).
``launch`` never synchronises the device and allocates its scratch itself, so a whole stage can
be captured in a CUDA graph (after one warm-up call: align's arrival counter is allocated on
first use). The counter is per device: one stream at a time, as for the dense split-K.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from ..common import _grouped_tile, no_tf32, zeroed_buffer
# The block-scale quantisation is the dense block-fp8 op's (vLLM's per-token-group and 128x128 rules).
from ..fp8_blockscale.impl import (expand_block_scales, expand_group_scales, quantize_per_token_group,
                                   quantize_weight_blocks)
from . import routing as R
from .space import (BLOCK_DTYPE, GROUP_K, GROUP_N, MAX_EXPERTS, STAGES, MoeGemvConfig, MoeSwapABConfig, MoeTiledConfig,
                    Problem, VendorConfig)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp16": torch.float16, "fp32": torch.float32}
# A tensor's dtype names its storage: fp8bs is fp8 storage with block scales (a 3-D w_scale), so it
# is not a key here (``problem_dtype`` tells the two fp8 dtypes apart).
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
TORCH_DTYPES[BLOCK_DTYPE] = torch.float8_e4m3fn
OUT_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                    BLOCK_DTYPE: torch.bfloat16}

# Relative Frobenius error bounds against the fp32 reference of the same (quantised) operands.
# Rounding dominates: the gate_up GEMM output is stored in the output dtype before silu-and-mul
# and the down stage's pair outputs before their sum (bf16 2^-9, fp16 2^-12 per rounding), fp32
# dots may run in TF32 on the GPU. fp8: the reference dequantises exactly what the kernel
# consumes, the down stage's own quantisation of its bf16 input included (same scale, same
# round-to-nearest-even: the same fp8 values, but for the GEMV's rare last-bit ties from multiplying
# by the reciprocal), hence the bf16 bound.
# fp8bs: the reference quantises the down stage's bf16 input per token group with the kernel's own
# rule (IEEE division, round-to-nearest-even), so it sees the same fp8 values: the bf16 bound too.
ERROR_BOUNDS = {"bf16": 1e-2, "fp8": 1e-2, BLOCK_DTYPE: 1e-2, "fp16": 2e-3, "fp32": 2e-3}

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_SCALE_MIN = 1e-10  # floor of a dynamic scale: an all-zero tensor quantises to zeros, not NaN

# align: pairs per step of a chunk, most chunks (programs) of the counting pass.
_ALIGN_SUB = 128
_ALIGN_MAX_CHUNKS = 64
# Weights are generated this many elements at a time (fp32 scratch: 256 MiB).
_GEN_ELEMS = 1 << 26


# ----------------------------------------------------------------------------
# align: pairs sorted by expert, padded per expert to BLOCK_M
# ----------------------------------------------------------------------------

@triton.jit(do_not_specialize=["P", "CHUNK", "num_chunks"])
def _align_count_kernel(ids_ptr, ws_ptr, meta_ptr, ntpp_ptr, cnt_ptr, P, CHUNK, num_chunks,
                        E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, SUB: tl.constexpr, ROWS: tl.constexpr):
    """Program c: per-expert counts of pairs [c * CHUNK, (c + 1) * CHUNK) into ws row c. The last
    program to arrive turns the rows into each chunk's first slot per expert (in place), and writes
    every expert's padded end and real end (meta) and the padded total (ntpp)."""
    c = tl.program_id(0)
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, P)
    lane = tl.arange(0, SUB)
    cols = tl.arange(0, E_PAD)
    hist = tl.zeros((E_PAD,), dtype=tl.int32)
    for s in range(start, end, SUB):
        m = s + lane < end
        ids = tl.load(ids_ptr + s + lane, mask=m, other=0).to(tl.int32)
        hist += tl.histogram(ids, E_PAD, mask=m)
    tl.store(ws_ptr + c * E_PAD + cols, hist)
    # Every thread's row store precedes the release of the arrival count.
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == num_chunks - 1:
        tl.debug_barrier()
        # ROWS chunk rows per load: a serial loop over rows would pay one load latency per chunk.
        rr = tl.arange(0, ROWS)
        total = tl.zeros((E_PAD,), dtype=tl.int32)
        for r0 in range(0, num_chunks, ROWS):
            rows = ws_ptr + (r0 + rr)[:, None] * E_PAD + cols[None, :]
            total += tl.sum(tl.load(rows, mask=(r0 + rr < num_chunks)[:, None], other=0, cache_modifier=".cg"), 0)
        padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # 0 for an expert without pairs
        pad_end = tl.cumsum(padded, 0)
        running = pad_end - padded
        tl.store(meta_ptr + cols, pad_end)
        tl.store(meta_ptr + E_PAD + cols, running + total)
        tl.store(ntpp_ptr, tl.sum(padded, 0))
        for r0 in range(0, num_chunks, ROWS):
            rows = ws_ptr + (r0 + rr)[:, None] * E_PAD + cols[None, :]
            live = (r0 + rr < num_chunks)[:, None]
            part = tl.load(rows, mask=live, other=0, cache_modifier=".cg")
            tl.store(rows, running[None, :] + tl.cumsum(part, 0) - part, mask=live)
            running += tl.sum(part, 0)
        # Zero again for the next launch (CUDA graphs replay with the same counter).
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["P", "CHUNK", "num_chunks", "max_padded"])
def _align_place_kernel(ids_ptr, ws_ptr, meta_ptr, ntpp_ptr, sorted_ptr, expert_ids_ptr, P, CHUNK, num_chunks,
                        max_padded, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, SUB: tl.constexpr,
                        TILE: tl.constexpr):
    """Programs < num_chunks: write chunk c's pairs to their slots, in pair order within an expert
    (stable). The others: TILE slots each, the padding slots (sentinel P) and expert_ids of the
    blocks starting there. The two sets of slots are disjoint, so the order does not matter."""
    pid = tl.program_id(0)
    cols = tl.arange(0, E_PAD)
    if pid < num_chunks:
        row_ptr = ws_ptr + pid * E_PAD  # this chunk's next slot per expert, advanced per step
        start = pid * CHUNK
        end = tl.minimum(start + CHUNK, P)
        lane = tl.arange(0, SUB)
        for s in range(start, end, SUB):
            m = s + lane < end
            ids = tl.load(ids_ptr + s + lane, mask=m, other=0).to(tl.int32)
            # Rank among this step's pairs of the same expert (masked lanes are all at the end).
            before = (ids[:, None] == ids[None, :]) & (lane[None, :] < lane[:, None])
            rank = tl.sum(before.to(tl.int32), axis=1)
            slot = tl.load(row_ptr + ids, mask=m, other=0) + rank
            tl.store(sorted_ptr + slot, (s + lane).to(tl.int32), mask=m)
            cur = tl.load(row_ptr + cols)
            # All reads of the row (replicated lanes included) before anyone updates it.
            tl.debug_barrier()
            tl.store(row_ptr + cols, cur + tl.histogram(ids, E_PAD, mask=m))
            tl.debug_barrier()
    else:
        pos = (pid - num_chunks) * TILE + tl.arange(0, TILE)
        inb = pos < max_padded
        ntpp = tl.load(ntpp_ptr)
        live = pos < ntpp
        # Whose padded range holds pos: the number of experts ending at or before it.
        pad_end = tl.load(meta_ptr + cols)
        e = tl.sum((pad_end[None, :] <= pos[:, None]).to(tl.int32), axis=1)
        real_end = tl.load(meta_ptr + E_PAD + tl.minimum(e, E_PAD - 1))
        pad = (pos >= real_end) | (~live)
        tl.store(sorted_ptr + pos, tl.zeros((TILE,), dtype=tl.int32) + P, mask=inb & pad)
        # Blocks at or past ntpp are never run (the GEMM exits early); expert 0 keeps them valid.
        first = (pos % BLOCK_M == 0) & (pos + BLOCK_M <= max_padded)
        tl.store(expert_ids_ptr + pos // BLOCK_M, tl.where(live, e, 0), mask=first)


def max_padded_pairs(pairs: int, num_experts: int, block_m: int) -> int:
    """Slots of the sorted pair list: each of the (at most min(E, pairs)) experts with pairs pads
    fewer than BLOCK_M slots (vLLM's bound, with its cap pairs * BLOCK_M when pairs < E)."""
    return pairs + min(num_experts, pairs) * (block_m - 1)


def _align_plan(pairs: int, num_experts: int):
    e_pad = max(16, triton.next_power_of_2(num_experts))
    chunk = _ALIGN_SUB * triton.cdiv(pairs, _ALIGN_SUB * _ALIGN_MAX_CHUNKS)
    tile = min(1024, max(64, 16384 // e_pad))  # the slot tile's (TILE, E_PAD) expert search
    n_chunks = triton.cdiv(pairs, chunk)
    # Scan tile: <= 8K counts, fixed per E (one compiled variant for every M).
    rows = min(triton.next_power_of_2(_ALIGN_MAX_CHUNKS), max(1, 8192 // e_pad))
    return e_pad, chunk, n_chunks, tile, rows


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """vLLM's moe_align_block_size: (sorted_token_ids int32 (max_padded,), expert_ids int32
    (max_padded // block_m,), num_tokens_post_padded int32 (1,)).

    The pairs (flat index t * top_k + j of topk_ids) grouped by expert in pair order, each
    expert's group padded to a multiple of block_m with the sentinel M * top_k; experts without
    pairs take no block; expert_ids[b] is block b's expert (0 past num_tokens_post_padded).
    Two launches, no host synchronisation (CUDA-graph safe); topk_ids int32 or int64."""
    ids = topk_ids.reshape(-1)
    pairs = ids.numel()
    dev = ids.device
    max_padded = max_padded_pairs(pairs, num_experts, block_m)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_padded // block_m, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    e_pad, chunk, n_chunks, tile, rows = _align_plan(pairs, num_experts)
    ws = torch.empty(n_chunks * e_pad, dtype=torch.int32, device=dev)
    meta = torch.empty(2 * e_pad, dtype=torch.int32, device=dev)
    cnt = zeroed_buffer("moe_align", dev, 1, torch.int32, 1)
    _align_count_kernel[(n_chunks,)](ids, ws, meta, ntpp, cnt, pairs, chunk, n_chunks,
                                     E_PAD=e_pad, BLOCK_M=block_m, SUB=_ALIGN_SUB, ROWS=rows, num_warps=4)
    _align_place_kernel[(n_chunks + triton.cdiv(max_padded, tile),)](
        ids, ws, meta, ntpp, sorted_ids, expert_ids, pairs, chunk, n_chunks, max_padded,
        E_PAD=e_pad, BLOCK_M=block_m, SUB=_ALIGN_SUB, TILE=tile, num_warps=4)
    return sorted_ids, expert_ids, ntpp


def align_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """``align`` in plain torch (synchronises): the tests' known answer."""
    flat = topk_ids.reshape(-1).long()
    pairs = flat.numel()
    dev = flat.device
    max_padded = max_padded_pairs(pairs, num_experts, block_m)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    slot = pad_start[e_sorted] + torch.arange(pairs, device=dev) - first_of_expert[e_sorted]
    sorted_ids = torch.full((max_padded,), pairs, dtype=torch.int32, device=dev)
    sorted_ids[slot] = order.to(torch.int32)
    ntpp = int(padded.sum())
    expert_ids = torch.zeros(max_padded // block_m, dtype=torch.int32, device=dev)
    starts = torch.arange(0, ntpp, block_m, device=dev)
    expert_ids[: len(starts)] = torch.searchsorted(pad_end, starts, right=True).to(torch.int32)
    return sorted_ids, expert_ids, torch.tensor([ntpp], dtype=torch.int32, device=dev)


# ----------------------------------------------------------------------------
# The grouped GEMM and the small kernels around it
# ----------------------------------------------------------------------------

@triton.jit
def _pair_block(sorted_ptr, expert_ids_ptr, pid_m, pid_n, N, num_valid, A_DIV,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Both grouped GEMMs' view of a program: its BLOCK_M sorted slots (pair ids; padding slots hold
    a sentinel >= num_valid), which are real, their expert, the A rows they read (pair // A_DIV),
    and its BLOCK_N weight rows (rn: out-of-range rows read row 0; the store mask drops them)."""
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pair < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    rows = tl.where(valid, pair // A_DIV, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    return pair, valid, expert, rows, offs_n, rn


@triton.jit
def _k_step(a_ptrs, w_ptrs, valid, offs_k, k_left, EVEN_K: tl.constexpr):
    """One K step's (A, W) tiles: padding slots load zeros, and so does the K tail (k_left
    columns remain) unless K is a multiple of BLOCK_K."""
    if EVEN_K:
        a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
        b = tl.load(w_ptrs)
    else:
        k_mask = offs_k[None, :] < k_left
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask, other=0.0)
        b = tl.load(w_ptrs, mask=k_mask, other=0.0)
    return a, b


@triton.jit
def _block_scale_rows(a_scale_ptr, w_scale_ptr, rows, expert, rn, stride_as, stride_wse, stride_wsn,
                      GROUP_N: tl.constexpr):
    """Block scales (fp8bs): each A row's row of activation group scales (rows, ceil(K/128)), and each
    weight row's row of its expert's 128x128 block scales (E, ceil(N/128), ceil(K/128))."""
    return a_scale_ptr + rows * stride_as, w_scale_ptr + expert * stride_wse + (rn // GROUP_N) * stride_wsn


@triton.jit
def _block_scales_at(as_rows, ws_rows, valid, kt, BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr):
    """K tile kt's scales: BLOCK_K divides GROUP_K (space.static_feasible), so the tile lies in one
    scale group, and one scale per A row and one per weight row multiply its partial product."""
    kg = kt * BLOCK_K // GROUP_K
    return tl.load(as_rows + kg, mask=valid, other=0.0), tl.load(ws_rows + kg)


@triton.jit(do_not_specialize=["EM", "num_valid"])
def moe_gemm_kernel(a_ptr, w_ptr, c_ptr, a_scale_ptr, w_scale_ptr, tw_ptr, sorted_ptr, expert_ids_ptr, ntpp_ptr,
                    N, K, EM, num_valid, stride_am, stride_we, stride_wn, stride_cm,
                    stride_as, stride_wse, stride_wsn,
                    A_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr, HAS_SCALE: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, BLOCK_SCALE: tl.constexpr = False,
                    GROUP_N: tl.constexpr = 128, GROUP_K: tl.constexpr = 128):
    """Program: BLOCK_M slots of the sorted pairs (one expert) x BLOCK_N weight rows, grouped
    order. A rows are slot's pair // A_DIV (gate_up: the token; down: the pair); the result goes
    to row `pair` of c. Padding slots (sentinel >= num_valid) load nothing and store nothing.
    HAS_SCALE: per-tensor fp8 scales applied once after the loop; BLOCK_SCALE (fp8bs): each K tile's
    partial product times its activation group scales (per A row) and weight block scales (per
    weight row), added to the fp32 accumulator, as vLLM's fused_moe_kernel does with a block_shape."""
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
        return
    pair, valid, expert, rows, offs_n, rn = _pair_block(sorted_ptr, expert_ids_ptr, pid_m, pid_n, N, num_valid, A_DIV,
                                                        BLOCK_M, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + rn[:, None] * stride_wn + offs_k[None, :]
    as_rows, ws_rows = _block_scale_rows(a_scale_ptr, w_scale_ptr, rows, expert, rn, stride_as, stride_wse,
                                         stride_wsn, GROUP_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = _k_step(a_ptrs, w_ptrs, valid, offs_k, K - kt * BLOCK_K, EVEN_K)
        if BLOCK_SCALE:
            a_s, w_s = _block_scales_at(as_rows, ws_rows, valid, kt, BLOCK_K, GROUP_K)
            acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * w_s[None, :]
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + expert))
    if MUL_WEIGHT:
        acc = acc * tl.load(tw_ptr + pair, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


@triton.jit(do_not_specialize=["EM", "num_valid", "A_DIV"])
def moe_swapab_kernel(a_ptr, w_ptr, c_ptr, a_scale_ptr, w_scale_ptr, tw_ptr, sorted_ptr, expert_ids_ptr, ntpp_ptr,
                      N, K, EM, num_valid, A_DIV, stride_am, stride_we, stride_wn, stride_cm,
                      stride_as, stride_wse, stride_wsn,
                      MUL_WEIGHT: tl.constexpr, HAS_SCALE: tl.constexpr, EVEN_K: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      BLOCK_SCALE: tl.constexpr = False, GROUP_N: tl.constexpr = 128, GROUP_K: tl.constexpr = 128):
    """Program (n-tile, pair block, K slice): acc (BLOCK_N, BLOCK_M) = w_e[n-tile] @ a[pairs].T, so
    the weight rows fill wgmma's 64-row M side and the few pairs of a decode step its N side (the
    unswapped kernel pads them to BLOCK_M >= 16 MMA rows on the Ampere-style path). With SPLIT_K
    > 1 the slices add fp32 partials into c (zeroed, fp32). A_DIV (gate_up's top_k) is a runtime
    argument: one compiled kernel for every top_k."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
        return
    pair, valid, expert, rows, offs_n, rn = _pair_block(sorted_ptr, expert_ids_ptr, pid_m, pid_n, N, num_valid, A_DIV,
                                                        BLOCK_M, BLOCK_N)
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + (t0 * BLOCK_K + offs_k)[None, :]
    w_ptrs = w_ptr + expert * stride_we + rn[:, None] * stride_wn + (t0 * BLOCK_K + offs_k)[None, :]
    as_rows, ws_rows = _block_scale_rows(a_scale_ptr, w_scale_ptr, rows, expert, rn, stride_as, stride_wse,
                                         stride_wsn, GROUP_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(t0, t1):
        a, b = _k_step(a_ptrs, w_ptrs, valid, offs_k, K - kt * BLOCK_K, EVEN_K)
        if BLOCK_SCALE:
            # The slices' partials are scaled tile by tile, so the split's fp32 sum needs nothing after.
            a_s, w_s = _block_scales_at(as_rows, ws_rows, valid, kt, BLOCK_K, GROUP_K)
            acc += tl.dot(b, tl.trans(a)) * w_s[:, None] * a_s[None, :]
        else:
            acc = tl.dot(b, tl.trans(a), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + expert))
    if MUL_WEIGHT:
        acc = acc * tl.load(tw_ptr + pair, mask=valid, other=0.0)[None, :]
    c_ptrs = c_ptr + pair[None, :] * stride_cm + offs_n[:, None]
    mask = valid[None, :] & (offs_n[:, None] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc, mask=mask, sem="relaxed")


# ----------------------------------------------------------------------------
# GEMV (decode): no align, no MMA
# ----------------------------------------------------------------------------
#
# At M <= 4 a stage's GEMM reads top_k experts' weights once and does 2 flops per weight element:
# its floor is those bytes over HBM bandwidth, a few microseconds on small layers. The MMA
# variants also launch align's two kernels and silu-and-mul or the combine, four launches in a
# row, which on the H100 left the best tiled or swap-AB config at 0.9-2.6 TB/s at M = 1 (13-17 us
# on 4-12 MB layers). The GEMV reads each pair's expert straight from topk_ids (no sort, no
# padding) and fuses the stage's epilogue, so a stage is one launch (fp8 included: it quantises
# its activations with the static scale as it loads them, multiplying by the scale's reciprocal as
# vLLM's static fp8 quantisation does, which gives quantize_fp8's values but where x / scale lies
# within an fp32 rounding of an fp8 rounding boundary). Each pair re-reads its expert, so it is a
# decode variant (space.GEMV_MAX_M).
#
# Why the reciprocal: the down stage quantises its bf16 input in the kernel, and every program
# quantises its token's whole activation rows again, so the quantisation runs about once per weight
# element read. With an IEEE division there, the fp8 down GEMV was bound by its arithmetic, not by
# HBM: at M = 1 it took 1.1-1.9x the time of the same kernel multiplying by the reciprocal
# (benchmarks/results/moe/README.md, "The fp8 down GEMV's division"), slower than the bf16 down
# GEMV on the same weight shape, which reads twice the bytes.
#
# Both kernels compile per weight shape: N (gate_up: I), K and the strides are constants, as the
# dense GEMV's are (kernels/gemm/gemv.py), and M, E and top_k stay at run time. Measured at M = 1
# on the H100 (benchmarks/results/moe/README.md, "Compiled per weight shape"), the best config got
# 1.9% (bf16 gate_up), 4.6% (bf16 down) and 3.3% (fp8 gate_up) faster, fp8 down unchanged; a server
# pays one compile per (layer shape, config) at warm-up.


@triton.jit
def _gemv_x(x_ptr, row, stride_x, offs_k, K, a_inv, QUANT_X: tl.constexpr, EVEN_K: tl.constexpr):
    """Activation row ``row`` at columns offs_k as fp32; QUANT_X: rounded to fp8 first, times a_inv
    (1 / the static scale; the scale is applied after the dot)."""
    if EVEN_K:
        v = tl.load(x_ptr + row * stride_x + offs_k).to(tl.float32)
    else:
        v = tl.load(x_ptr + row * stride_x + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    if QUANT_X:
        q = tl.clamp(v * a_inv, -448.0, 448.0)
        v = q.to(tl.float8e4nv).to(tl.float32)
    return v


@triton.jit
def _gemv_w(w_rows, offs_k, K, EVEN_K: tl.constexpr):
    # The weights are read once: evict-first keeps the activations in cache.
    if EVEN_K:
        return tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first").to(tl.float32)
    return tl.load(w_rows + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0,
                   eviction_policy="evict_first").to(tl.float32)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def moe_gemv_gate_up_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, a_scale_ptr, w_scale_ptr, I: tl.constexpr,
                            K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                            stride_wn: tl.constexpr, stride_om: tl.constexpr,
                            HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr, EVEN_K: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (pair p, n-block): out[p, n] = silu(g) * u for BLOCK_N columns n of the
    intermediate, g / u = x[p // top_k] . w[e, n] / w[e, I + n] (e = topk_ids[p]), both in fp32
    (the fused epilogue never rounds them to the output dtype). Rows past I wrap to row 0 and are
    never stored. A 1-D grid: pairs x n-blocks can exceed the 65,535 of a second grid axis."""
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
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _gemv_x(x_ptr, t, stride_xm, offs_k, K, a_inv, QUANT_X, EVEN_K)[None, :]
        acc_g += _gemv_w(g_rows, offs_k, K, EVEN_K) * x
        acc_u += _gemv_w(u_rows, offs_k, K, EVEN_K) * x
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    if HAS_SCALE:
        s = tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e)
        g = g * s
        u = u * s
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + p * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < I)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def moe_gemv_down_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N: tl.constexpr,
                         K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                         stride_wn: tl.constexpr, stride_om: tl.constexpr,
                         HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr, EVEN_K: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (token t, n-block): out[t, n] = sum_j tw[t, j] * (x[t * top_k + j] . w[e_j, n]) over
    the token's top_k experts, the routing weight (and the fp8 scales) folded into the activation
    row, one fp32 accumulator for all of them: the combine is fused, no atomics, no scratch."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_inv = 1.0
    if QUANT_X:
        a_inv = 1.0 / tl.load(a_scale_ptr)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        if HAS_SCALE:
            wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
        w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            if QUANT_X:
                # The weight tile's load issued before the activations' quantisation, so the two
                # overlap: in the other order the fp8 down GEMV took up to 1.4x as long
                # (benchmarks/results/moe/README.md, "The fp8 down GEMV's division").
                wv = _gemv_w(w_rows, offs_k, K, EVEN_K)
                x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_inv, QUANT_X, EVEN_K) * wt
                acc += wv * x[None, :]
            else:
                x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_inv, QUANT_X, EVEN_K) * wt
                acc += _gemv_w(w_rows, offs_k, K, EVEN_K) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def _launch_gemv(cfg: MoeGemvConfig, stage: str, x, w, topk_weights, topk_ids, out, a_scale, w_scale, fp8: bool):
    E, N, K = w.shape
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1)
    quant = fp8 and x.dtype != torch.float8_e4m3fn
    scales = (a_scale if fp8 else x, w_scale if fp8 else x)
    common = dict(HAS_SCALE=fp8, QUANT_X=quant, EVEN_K=K % cfg.block_k == 0, BLOCK_N=cfg.block_n,
                  BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=1)
    if stage == "gate_up":
        i = N // 2
        num_n = triton.cdiv(i, cfg.block_n)
        moe_gemv_gate_up_kernel[(num_n * ids.numel(),)](
            x, w, out, ids, *scales, i, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
            **common)
    else:
        num_n = triton.cdiv(N, cfg.block_n)
        moe_gemv_down_kernel[(num_n * topk_ids.shape[0],)](
            x, w, out, ids, topk_weights, *scales, N, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), **common)
    return out


# The block-scale (fp8bs) GEMVs: the same programs over fp8 activations already quantised per token
# group (the down stage's bf16 input by ``quantize_fp8_groups`` first: a dynamic per-group scale
# needs the group's amax, which every program would otherwise recompute). A K tile is whole 128-column
# groups (space.static_feasible), viewed as (BLOCK_N, G, 128) as the dense block-fp8 GEMV does, so
# each (weight row, group) scale is one load per tile that multiplies 128 products.


@triton.jit
def _gemv_bs_x(x_ptr, as_ptr, row, stride_x, stride_as, k, g, K, KG, EVEN_K: tl.constexpr):
    """Activation row ``row`` at the (G, 128) columns k, dequantised: times its group scales."""
    if EVEN_K:
        v = tl.load(x_ptr + row * stride_x + k).to(tl.float32)
        s = tl.load(as_ptr + row * stride_as + g)
    else:
        v = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
        s = tl.load(as_ptr + row * stride_as + g, mask=g < KG, other=0.0)
    return v * s[:, None]


@triton.jit
def _gemv_bs_w(w_rows, s_rows, k, g, K, KG, EVEN_K: tl.constexpr):
    """(BLOCK_N, G, 128) weight tile times each row's block scale of each group, in fp32."""
    if EVEN_K:
        w = tl.load(w_rows + k[None, :, :], eviction_policy="evict_first")
        s = tl.load(s_rows + g[None, :])
    else:
        w = tl.load(w_rows + k[None, :, :], mask=(k < K)[None, :, :], other=0.0, eviction_policy="evict_first")
        s = tl.load(s_rows + g[None, :], mask=(g < KG)[None, :], other=0.0)
    return w.to(tl.float32) * s[:, :, None]


@triton.jit(do_not_specialize=["num_n", "top_k"])
def moe_gemv_bs_gate_up_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, as_ptr, ws_ptr, I: tl.constexpr, K: tl.constexpr,
                               num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                               stride_wn: tl.constexpr, stride_om: tl.constexpr, stride_as: tl.constexpr,
                               stride_wse: tl.constexpr, stride_wsn: tl.constexpr, EVEN_K: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr,
                               GROUP_K: tl.constexpr):
    """moe_gemv_gate_up_kernel with block scales: gate rows n and up rows I + n each take their own
    128-row block's scales (I need not be a multiple of 128)."""
    KG: tl.constexpr = (K + GROUP_K - 1) // GROUP_K
    G: tl.constexpr = BLOCK_K // GROUP_K
    pid = tl.program_id(0)
    pid_n = pid % num_n
    p = (pid // num_n).to(tl.int64)
    e = tl.load(ids_ptr + p).to(tl.int64)
    t = p // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < I, offs_n, 0)
    offs_g = tl.arange(0, G)
    offs_j = tl.arange(0, GROUP_K)
    g_rows = w_ptr + e * stride_we + rn[:, None, None] * stride_wn
    u_rows = g_rows + I * stride_wn
    gs_rows = ws_ptr + e * stride_wse + (rn // GROUP_N)[:, None] * stride_wsn
    us_rows = ws_ptr + e * stride_wse + ((I + rn) // GROUP_N)[:, None] * stride_wsn
    acc_g = tl.zeros((BLOCK_N, G, GROUP_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, G, GROUP_K), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        g = kt * G + offs_g
        k = g[:, None] * GROUP_K + offs_j[None, :]
        x = _gemv_bs_x(x_ptr, as_ptr, t, stride_xm, stride_as, k, g, K, KG, EVEN_K)[None, :, :]
        acc_g += _gemv_bs_w(g_rows, gs_rows, k, g, K, KG, EVEN_K) * x
        acc_u += _gemv_bs_w(u_rows, us_rows, k, g, K, KG, EVEN_K) * x
    gv = tl.sum(tl.sum(acc_g, axis=2), axis=1)
    uv = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    y = gv * tl.sigmoid(gv) * uv
    tl.store(out_ptr + p * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < I)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def moe_gemv_bs_down_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, as_ptr, ws_ptr, N: tl.constexpr,
                            K: tl.constexpr, num_n, top_k, stride_xm: tl.constexpr, stride_we: tl.constexpr,
                            stride_wn: tl.constexpr, stride_om: tl.constexpr, stride_as: tl.constexpr,
                            stride_wse: tl.constexpr, stride_wsn: tl.constexpr, EVEN_K: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr,
                            GROUP_K: tl.constexpr):
    """moe_gemv_down_kernel with block scales: the routing weight folded into the dequantised
    activation row, one fp32 accumulator over the token's top_k experts."""
    KG: tl.constexpr = (K + GROUP_K - 1) // GROUP_K
    G: tl.constexpr = BLOCK_K // GROUP_K
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    offs_g = tl.arange(0, G)
    offs_j = tl.arange(0, GROUP_K)
    acc = tl.zeros((BLOCK_N, G, GROUP_K), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        w_rows = w_ptr + e * stride_we + rn[:, None, None] * stride_wn
        s_rows = ws_ptr + e * stride_wse + (rn // GROUP_N)[:, None] * stride_wsn
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            g = kt * G + offs_g
            k = g[:, None] * GROUP_K + offs_j[None, :]
            wv = _gemv_bs_w(w_rows, s_rows, k, g, K, KG, EVEN_K)
            x = _gemv_bs_x(x_ptr, as_ptr, p, stride_xm, stride_as, k, g, K, KG, EVEN_K) * wt
            acc += wv * x[None, :, :]
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def _launch_gemv_bs(cfg: MoeGemvConfig, stage: str, x, w, topk_weights, topk_ids, out, a_scale, w_scale):
    E, N, K = w.shape
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1)
    common = dict(EVEN_K=K % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_N=GROUP_N,
                  GROUP_K=GROUP_K, num_warps=cfg.num_warps, num_stages=1)
    strides = (x.stride(0), w.stride(0), w.stride(1), out.stride(0), a_scale.stride(0), w_scale.stride(0),
               w_scale.stride(1))
    if stage == "gate_up":
        i = N // 2
        num_n = triton.cdiv(i, cfg.block_n)
        moe_gemv_bs_gate_up_kernel[(num_n * ids.numel(),)](
            x, w, out, ids, a_scale, w_scale, i, K, num_n, top_k, *strides, **common)
    else:
        num_n = triton.cdiv(N, cfg.block_n)
        moe_gemv_bs_down_kernel[(num_n * topk_ids.shape[0],)](
            x, w, out, ids, topk_weights, a_scale, w_scale, N, K, num_n, top_k, *strides, **common)
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, map_ptr, I, stride_x, stride_y, HAS_MAP: tl.constexpr, BLOCK: tl.constexpr):
    """y[dst, :] = silu(x[r, :I]) * x[r, I:2I] in fp32, dst = map[r] (the vendor's scatter back to
    pair order) or r."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(x_ptr + r * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + r * stride_x + I + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_MAP:
        dst = tl.load(map_ptr + r).to(tl.int64)
    else:
        dst = r
    tl.store(y_ptr + dst * stride_y + cols, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _combine_kernel(y_ptr, out_ptr, map_ptr, tw_ptr, H, stride_y, stride_out, TOP_K: tl.constexpr,
                    HAS_MAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum_j (tw[t, j] *) y[src], src = map[t * TOP_K + j] or t * TOP_K + j; fp32 sum."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = t * TOP_K + j
        if HAS_MAP:
            src = tl.load(map_ptr + pair).to(tl.int64)
        else:
            src = pair
        v = tl.load(y_ptr + src * stride_y + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            v = v * tl.load(tw_ptr + pair)
        acc += v
    tl.store(out_ptr + t * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n"])
def _quant_fp8_kernel(x_ptr, y_ptr, s_ptr, n, BLOCK: tl.constexpr):
    """y = fp8(clamp(x / s)): IEEE division and round-to-nearest-even, as the torch reference."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    q = tl.clamp(tl.math.div_rn(x, tl.load(s_ptr) + tl.zeros_like(x)), -448.0, 448.0)
    tl.store(y_ptr + offs, q.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _quant_group_fp8_kernel(x_ptr, y_ptr, s_ptr, K, stride_x, stride_y, stride_s, GROUP: tl.constexpr):
    """Program (row r, group g): s[r, g] = max(amax(x[r, group g]) / 448, 1e-10) and y = x / s clamped
    to +-448 in y's dtype: vLLM's dynamic per-token-group fp8 rule, with IEEE divisions so that the
    values equal the torch reference's (fp8_blockscale.impl.quantize_per_token_group)."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    m = cols < K
    x = tl.load(x_ptr + r * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    s = tl.maximum(tl.math.div_rn(amax, 448.0), 1e-10)
    q = tl.clamp(tl.math.div_rn(x, s + tl.zeros_like(x)), -448.0, 448.0)
    tl.store(y_ptr + r * stride_y + cols, q.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(s_ptr + r * stride_s + g, s)


def quantize_fp8_groups(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn):
    """Dynamic per-token-group quantisation (1 x 128 groups) of a 2-D x: (x_q in ``dtype``, scales
    fp32 (rows, ceil(K/128))). One Triton launch, no sync; the values of quantize_per_token_group."""
    rows, k = x.shape
    kg = triton.cdiv(k, GROUP_K)
    y = torch.empty((rows, k), dtype=dtype, device=x.device)
    s = torch.empty((rows, kg), dtype=torch.float32, device=x.device)
    if rows:
        _quant_group_fp8_kernel[(rows, kg)](x, y, s, k, x.stride(0), y.stride(0), s.stride(0), GROUP=GROUP_K,
                                            num_warps=1)
    return y, s


def _cols_block(n: int) -> int:
    return min(1024, max(16, triton.next_power_of_2(n)))


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None,
                 dst_rows: torch.Tensor | None = None) -> torch.Tensor:
    """(R, 2I) -> (R, I) silu(gate) * up (rows may be strided); row r goes to out[dst_rows[r]]."""
    rows, two_i = x.shape
    i = two_i // 2
    if out is None:
        out = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    block = _cols_block(i)
    _silu_mul_kernel[(rows, triton.cdiv(i, block))](
        x, out, x if dst_rows is None else dst_rows, i, x.stride(0), out.stride(0),
        HAS_MAP=dst_rows is not None, BLOCK=block, num_warps=4)
    return out


def _combine(y: torch.Tensor, out: torch.Tensor, top_k: int, src_rows=None, weights=None) -> torch.Tensor:
    m, h = out.shape
    block = _cols_block(h)
    _combine_kernel[(m, triton.cdiv(h, block))](
        y, out, y if src_rows is None else src_rows, y if weights is None else weights, h, y.stride(0),
        out.stride(0), TOP_K=top_k, HAS_MAP=src_rows is not None, HAS_WEIGHT=weights is not None,
        BLOCK=block, num_warps=4)
    return out


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Static per-tensor fp8 e4m3 quantisation x / scale (one Triton launch, no sync)."""
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    n = x.numel()
    block = 1024
    _quant_fp8_kernel[(triton.cdiv(n, block),)](x, out, scale, n, BLOCK=block, num_warps=4)
    return out


def quantize_fp8_reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``quantize_fp8`` in torch: the same fp8 values."""
    return (x.float() / scale.float().reshape(())).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dynamic_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor fp8 scale amax / 448 as a (1,) fp32 tensor on x's device (no sync)."""
    return (x.abs().amax().float() / FP8_MAX).clamp_min(_SCALE_MIN).reshape(1)


# ----------------------------------------------------------------------------
# The vendor: torch._grouped_mm over the expert-contiguous layout
# ----------------------------------------------------------------------------
#
# torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None) -> Tensor
# (aten/src/ATen/native/cuda/GroupedBlas.cpp, native/GroupedMMUtils.h):
# - 2-D x 3-D (our case): mat_a (total_M, K), mat_b (G, K, N), offs int32 1-D of G cumulative
#   row ends (group g is rows [offs[g-1], offs[g]); empty groups allowed) -> out (total_M, N);
# - dtypes bf16/fp16/fp32; out_dtype must equal mat_a's; no bias;
# - each operand 16-byte aligned (data_ptr) with one of its last two strides 1 and the other a
#   multiple of 16 bytes: w.transpose(-2, -1) of a contiguous (E, N, K) weight needs K % 8 == 0
#   (bf16), the gathered (P, K) rows the same; the output's row stride is N padded to 16 bytes
#   (a strided view when N % 8 != 0);
# - the fast path (CUTLASS grouped GEMM, no device-to-host sync) needs sm90/sm100 and bf16 in
#   and out; anything else takes a fallback that copies offs to the host per call (not
#   capturable). On CPU the fallback runs (a loop of mm), which the CPU tests use.

def expert_permutation(topk_ids: torch.Tensor, num_experts: int):
    """(order int64 (P,), offs int32 (E,)): pairs stably sorted by expert, and the cumulative row
    end of every expert in that order (torch._grouped_mm's offs). No host sync."""
    flat = topk_ids.reshape(-1)
    e_sorted, order = torch.sort(flat, stable=True)
    bounds = torch.arange(num_experts, device=flat.device, dtype=e_sorted.dtype)
    return order, torch.searchsorted(e_sorted, bounds, right=True, out_int32=True)


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """inv with inv[order[i]] = i (where each pair sits in the sorted order)."""
    inv = torch.empty_like(order)
    return inv.scatter_(0, order, torch.arange(order.numel(), device=order.device))


def _vendor(stage, x, w, topk_weights, topk_ids, out):
    top_k = topk_ids.shape[1]
    order, offs = expert_permutation(topk_ids, w.shape[0])
    rows = x.index_select(0, order // top_k if stage == "gate_up" else order)
    y = torch._grouped_mm(rows, w.transpose(-2, -1), offs=offs)
    if stage == "gate_up":
        return silu_and_mul(y, out, dst_rows=order)
    return _combine(y, out, top_k, src_rows=inverse_permutation(order), weights=topk_weights)


# ----------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------

def dtype_name(t: torch.Tensor) -> str:
    try:
        return DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {t.dtype}; supported: {sorted(DTYPE_NAMES.values())}") from None


def is_block_scaled(w_scale) -> bool:
    """Block scales (fp8bs): a 3-D w_scale (E, ceil(N/128), ceil(K/128)); per-tensor fp8 has (E,)."""
    return isinstance(w_scale, torch.Tensor) and w_scale.dim() == 3


def problem_dtype(w: torch.Tensor, w_scale=None) -> str:
    """The problem dtype of a weight and its scale: fp8 storage with block scales is fp8bs."""
    name = dtype_name(w)
    return BLOCK_DTYPE if name == "fp8" and is_block_scaled(w_scale) else name


def output_shape(stage: str, x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor) -> tuple[int, int]:
    """gate_up: (M * top_k, N // 2); down: (M, N)."""
    if stage == "gate_up":
        return topk_ids.numel(), w.shape[1] // 2
    return topk_ids.shape[0], w.shape[1]


def _ids_out_of_range(topk_ids: torch.Tensor, e: int, label: str) -> str:
    """Why topk_ids holds an id outside 0..E-1 ('' when none): the kernels index w with it
    unchecked, so such an id reads another tensor's memory (garbage, or a segfault on CPU; issue 57,
    row 10). One min/max reduction and one host read; skipped while the current CUDA stream is
    being captured into a graph, where reading the device would break the capture (and the graph
    replays with whatever ids its buffer holds then)."""
    if topk_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return ""
    lo, hi = (int(v) for v in torch.aminmax(topk_ids))
    if lo < 0 or hi >= e:
        return f"{label} must hold expert ids in 0..E-1 = 0..{e - 1}, got ids from {lo} to {hi}"
    return ""


def launch(cfg, stage: str, x: torch.Tensor, w: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
           out: torch.Tensor | None = None, a_scale: torch.Tensor | None = None,
           w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Run one stage on candidate ``cfg`` (a MoeTiledConfig, a MoeSwapABConfig or the vendor);
    returns ``out``.

    gate_up: x (M, K), w (E, N, K) -> (M * top_k, N // 2). down: x (M * top_k, K), w (E, N, K) ->
    (M, N), weighted by topk_weights (M, top_k) fp32. fp8 weights (per-expert scales w_scale (E,))
    take fp8 x with its scale a_scale (1,), or x in bf16, quantised here with the static a_scale;
    the output is bf16. Everything the stage needs runs here (align for cfg.block_m, GEMM,
    silu-and-mul or the top_k sum); scratch is allocated here. Does not validate (hot path: see
    check_operands). Never synchronises the device.

    Block scales (fp8bs: w_scale (E, ceil(N/128), ceil(K/128))): x fp8 with its per-token-group
    scales a_scale (rows, ceil(K/128)), or a_scale None and x in bf16, quantised here per token group
    with dynamic scales (``quantize_fp8_groups``, as vLLM quantises both stages' inputs). fp16/fp32
    weights with block scales are the CPU interpreter's stand-ins (the same scale layout)."""
    wname = dtype_name(w)
    if out is None:
        out = torch.empty(output_shape(stage, x, w, topk_ids), dtype=OUT_TORCH_DTYPES[wname], device=x.device)
    block = is_block_scaled(w_scale)
    fp8 = wname == "fp8" and not block  # per-tensor scales
    if block and a_scale is None:
        x, a_scale = quantize_fp8_groups(x, w.dtype)
    if isinstance(cfg, MoeGemvConfig):
        if block:
            return _launch_gemv_bs(cfg, stage, x, w, topk_weights, topk_ids, out, a_scale, w_scale)
        return _launch_gemv(cfg, stage, x, w, topk_weights, topk_ids, out, a_scale, w_scale, fp8)
    if fp8 and x.dtype != torch.float8_e4m3fn:
        x = quantize_fp8(x, a_scale)
    if isinstance(cfg, VendorConfig):
        if block:
            raise ValueError("the vendor candidate (torch._grouped_mm) has no block-scaled fp8 path")
        if fp8:
            raise ValueError("the vendor candidate (torch._grouped_mm) has no fp8 path")
        return _vendor(stage, x, w, topk_weights, topk_ids, out)
    swap = isinstance(cfg, MoeSwapABConfig)
    if not (swap or isinstance(cfg, MoeTiledConfig)):
        raise ValueError(f"not a moe config: {cfg!r}")
    E, N, K = w.shape
    top_k = topk_ids.shape[1]
    pairs = topk_ids.numel()
    sorted_ids, expert_ids, ntpp = align(topk_ids, E, cfg.block_m)
    down = stage == "down"
    split = swap and cfg.split_k > 1
    # down with top_k 1: pair == token, so the GEMM writes y directly (unless it sums slices).
    direct = down and top_k == 1 and not split
    if split:
        c = torch.zeros((pairs, N), dtype=torch.float32, device=x.device)
    else:
        c = out if direct else torch.empty((pairs, N), dtype=out.dtype, device=x.device)
    EM = sorted_ids.numel()
    scales = (a_scale if fp8 or block else x, w_scale if fp8 or block else x)
    # Block scales' strides: activation rows, experts, 128-row blocks (0: unused, never read).
    sstr = (a_scale.stride(0), w_scale.stride(0), w_scale.stride(1)) if block else (0, 0, 0)
    bs = dict(BLOCK_SCALE=block, GROUP_N=GROUP_N, GROUP_K=GROUP_K)
    if swap:
        grid = (triton.cdiv(N, cfg.block_n), triton.cdiv(EM, cfg.block_m), cfg.split_k)
        moe_swapab_kernel[grid](
            x, w, c, *scales, topk_weights, sorted_ids, expert_ids, ntpp,
            N, K, EM, pairs, 1 if down else top_k, x.stride(0), w.stride(0), w.stride(1), c.stride(0), *sstr,
            MUL_WEIGHT=down, HAS_SCALE=fp8, EVEN_K=K % cfg.block_k == 0, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **bs)
    else:
        grid = (triton.cdiv(EM, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
        moe_gemm_kernel[grid](
            x, w, c, *scales, topk_weights, sorted_ids, expert_ids, ntpp,
            N, K, EM, pairs, x.stride(0), w.stride(0), w.stride(1), c.stride(0), *sstr,
            A_DIV=1 if down else top_k, MUL_WEIGHT=down, HAS_SCALE=fp8, EVEN_K=K % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **bs)
    if not down:
        return silu_and_mul(c, out)
    if not direct:
        _combine(c, out, top_k)
    return out


# ----------------------------------------------------------------------------
# Operand checks
# ----------------------------------------------------------------------------

_STAGE_NAMES = {"x": "x", "w": "w", "topk_weights": "topk_weights", "topk_ids": "topk_ids",
                "a_scale": "a_scale", "w_scale": "w_scale", "out": "out"}


def check_operands(stage: str, x, w, topk_weights, topk_ids, a_scale=None, w_scale=None, out=None,
                   _names: dict | None = None, _dynamic_a_scale: bool = False) -> str:
    """'' if ``launch(cfg, stage, x, w, topk_weights, topk_ids, out, a_scale, w_scale)`` accepts
    these operands, else what is wrong, naming the argument. Host-side checks only (the values of
    topk_ids are not read: that would synchronise)."""
    nm = _names or _STAGE_NAMES
    if stage not in STAGES:
        return f"stage must be one of {', '.join(STAGES)}, got {stage!r}"
    named = [(nm["x"], x), (nm["w"], w), (nm["topk_weights"], topk_weights), (nm["topk_ids"], topk_ids)]
    named += [(nm[k], t) for k, t in (("a_scale", a_scale), ("w_scale", w_scale), ("out", out)) if t is not None]
    for label, t in named:
        if not isinstance(t, torch.Tensor):
            return f"{label} must be a torch tensor, got {type(t).__name__}"
        if t.device != x.device:
            return f"{label} is on {t.device}, {nm['x']} on {x.device}: all operands must be on one device"
        if not t.is_contiguous():
            return f"{label} must be contiguous"
    if w.dim() != 3:
        return f"{nm['w']} must be 3-D (E, N, K), got shape {tuple(w.shape)}"
    if x.dim() != 2:
        return f"{nm['x']} must be 2-D, got shape {tuple(x.shape)}"
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        return (f"{nm['topk_ids']} must be a 2-D (M, top_k) int32 or int64 tensor, "
                f"got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_weights.dtype != torch.float32 or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        return (f"{nm['topk_weights']} must be float32 of {nm['topk_ids']}'s shape {tuple(topk_ids.shape)}, "
                f"got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    e, n, k = w.shape
    m, top_k = topk_ids.shape
    if not 1 <= e <= MAX_EXPERTS:
        return f"{nm['w']} must hold 1..{MAX_EXPERTS} experts, got E = {e}"
    if not 1 <= top_k <= e:
        return f"{nm['topk_ids']}: top_k must be in 1..E = {e}, got {top_k}"
    if m < 1 or n < 1 or k < 1:
        return f"M, N and K must be >= 1, got {nm['topk_ids']} {tuple(topk_ids.shape)}, {nm['w']} {tuple(w.shape)}"
    msg = _ids_out_of_range(topk_ids, e, nm["topk_ids"])
    if msg:
        return msg
    rows = m if stage == "gate_up" else m * top_k
    if x.shape[0] != rows:
        what = "M = topk_ids rows" if stage == "gate_up" else "M * top_k"
        return f"{nm['x']} must have {what} = {rows} rows for stage {stage}, got {x.shape[0]}"
    if x.shape[1] != k:
        return f"{nm['x']} must have K = {k} columns ({nm['w']} is (E, N, K) = {tuple(w.shape)}), got {x.shape[1]}"
    if stage == "gate_up" and n % 2:
        return f"{nm['w']} must have an even N (gate and up halves) for stage gate_up, got N = {n}"
    if w.dtype not in DTYPE_NAMES:
        return f"{nm['w']} must be one of {sorted(DTYPE_NAMES.values())}, got {w.dtype}"
    wname = DTYPE_NAMES[w.dtype]
    if is_block_scaled(w_scale):
        msg = _check_block_scales(nm, x, w, a_scale, w_scale, rows)
        if msg:
            return msg
    elif wname == "fp8":
        if x.dtype not in (torch.float8_e4m3fn, torch.bfloat16):
            return f"{nm['x']} must be float8_e4m3fn or bfloat16 (quantised here) with fp8 weights, got {x.dtype}"
        if x.dtype == torch.float8_e4m3fn or a_scale is not None or not _dynamic_a_scale:
            msg = _check_scale(nm["a_scale"], a_scale, (1,), x.device)
            if msg:
                return msg
        msg = _check_scale(nm["w_scale"], w_scale, (e,), x.device)
        if msg:
            return msg
    else:
        if x.dtype != w.dtype:
            return f"{nm['x']} must have {nm['w']}'s dtype {w.dtype}, got {x.dtype}"
        for label, s in ((nm["a_scale"], a_scale), (nm["w_scale"], w_scale)):
            if s is not None:
                return f"{label} is only for fp8 weights ({nm['w']} is {w.dtype})"
    if out is not None:
        want = output_shape(stage, x, w, topk_ids)
        if tuple(out.shape) != want or out.dtype != OUT_TORCH_DTYPES[wname]:
            return f"{nm['out']} must be {OUT_TORCH_DTYPES[wname]} of shape {want}, got {out.dtype} {tuple(out.shape)}"
    return ""


def _check_block_scales(nm: dict, x, w, a_scale, w_scale, rows: int) -> str:
    """fp8bs operands: w_scale (E, ceil(N/128), ceil(K/128)); x quantised (w's dtype) with a_scale
    (rows, ceil(K/128)), or a_scale None and x a float tensor quantised per token group in the launch.
    fp16/fp32 weights (the CPU interpreter's stand-ins) take the same scales."""
    e, n, k = w.shape
    if w.dtype not in (torch.float8_e4m3fn, torch.float16, torch.float32):
        return (f"block scales ({nm['w_scale']} 3-D) are for float8_e4m3fn weights (fp16/fp32 only as the CPU "
                f"interpreter's stand-ins), got {nm['w']} {w.dtype}")
    kg = -(-k // GROUP_K)
    msg = _check_scale(nm["w_scale"], w_scale, (e, -(-n // GROUP_N), kg), x.device, "block-scaled")
    if msg:
        return msg
    if a_scale is None:
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return (f"{nm['x']} must be bfloat16 (quantised per token group here) or {w.dtype} with "
                    f"{nm['a_scale']}, got {x.dtype}")
        return ""
    if x.dtype != w.dtype:
        return f"{nm['x']} must be {w.dtype} with {nm['a_scale']} (or bfloat16 without it), got {x.dtype}"
    return _check_scale(nm["a_scale"], a_scale, (rows, kg), x.device, "block-scaled")


def _check_scale(label: str, s, shape: tuple, device, what: str = "fp8") -> str:
    """A float32 scale of ``shape`` on ``device`` (a one-element scale may be 0-D)."""
    ok = isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.device == device and (
        tuple(s.shape) == shape or (shape == (1,) and s.numel() == 1))
    return "" if ok else f"{label} must be a float32 tensor of shape {shape} on {device} with {what} weights"


def _raise(msg: str) -> None:
    if msg:
        raise ValueError(msg)


# ----------------------------------------------------------------------------
# Operands, reference
# ----------------------------------------------------------------------------

@dataclass
class Operands:
    """One stage's inputs and preallocated output. gate_up: x (M, K); down: x = the intermediate
    (M * top_k, K). w (E, N, K); topk_ids int32 (M, top_k); topk_weights fp32 (M, top_k)."""

    stage: str
    x: torch.Tensor
    w: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    out: torch.Tensor
    a_scale: torch.Tensor | None = None
    w_scale: torch.Tensor | None = None

    def run(self, cfg) -> torch.Tensor:
        return launch(cfg, self.stage, self.x, self.w, self.topk_weights, self.topk_ids, self.out,
                      self.a_scale, self.w_scale)

    @property
    def nbytes(self) -> int:
        ts = (self.x, self.w, self.topk_weights, self.topk_ids, self.out, self.a_scale, self.w_scale)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


# How the harness keeps a stage's timed reads out of L2 (its rows' l2_policy).
L2_POLICY = "rotate_experts"


def bytes_read(ops: Operands) -> int:
    """Bytes one launch reads and writes: the weights of the experts topk_ids names (not all E), the
    activations and the output. Reads topk_ids on the host (harness set-up only: synchronises)."""
    active = int(ops.topk_ids.unique().numel())
    w = active * ops.w.shape[1] * ops.w.shape[2] * ops.w.element_size()
    return w + sum(t.numel() * t.element_size() for t in (ops.x, ops.out))


def timing_copies(first: Operands, n_copies: int) -> list[Operands]:
    """Up to ``n_copies`` operand sets to rotate over when timing ``first``'s stage (the harness asks
    for as many as span 2x L2 of ``bytes_read``). At decode a stage reads a few experts of an
    (E, N, K) weight: copies of the whole weight (the harness's generic rule counts all E) left
    those few experts hot in L2 across graph replays, up to 1.46x faster than read from HBM on the
    H100 (benchmarks/results/moe/README.md). The copies here share the weights and shift topk_ids
    by whole strides of experts (e -> (e + j * stride) mod E: the same histogram on other experts),
    so they cost no memory; at most as many as E holds distinct strides."""
    e = first.w.shape[0]
    lo, hi = int(first.topk_ids.min()), int(first.topk_ids.max())
    stride = hi - lo + 1  # the span of experts one copy touches: shifted copies never share one
    n = max(1, min(int(n_copies), e // stride))
    ids = first.topk_ids.long()
    return [first] + [dataclasses.replace(first, topk_ids=((ids + j * stride) % e).to(first.topk_ids.dtype))
                      for j in range(1, n)]


def random_weights(e: int, n: int, k: int, dtype: str, device, generator: torch.Generator):
    """(w (E, N, K) in ``dtype``, per-expert fp32 scales (E,) for fp8 else None), entries
    ~ N(0, 1/K). Generated a few experts at a time: no fp32 copy of the whole weight."""
    w = torch.empty((e, n, k), dtype=TORCH_DTYPES[dtype], device=device)
    scales = torch.empty(e, dtype=torch.float32, device=device) if dtype == "fp8" else None
    step = max(1, _GEN_ELEMS // (n * k))
    for i in range(0, e, step):
        j = min(e, i + step)
        part = torch.randn((j - i, n, k), generator=generator, device=device, dtype=torch.float32).mul_(k ** -0.5)
        if scales is not None:
            s = (part.abs().amax(dim=(1, 2)) / FP8_MAX).clamp_min(_SCALE_MIN)
            scales[i:j] = s
            part.div_(s[:, None, None]).clamp_(-FP8_MAX, FP8_MAX)
        w[i:j] = part
        del part
    return w, scales


def random_block_weights(e: int, n: int, k: int, device, generator: torch.Generator,
                         storage: torch.dtype = torch.float8_e4m3fn):
    """(w (E, N, K) in ``storage``, fp32 block scales (E, ceil(N/128), ceil(K/128))): entries
    ~ N(0, 1/K), each expert quantised per 128x128 block (fp8_blockscale's rule; the last blocks
    partial). ``storage`` fp16/fp32: the CPU interpreter's stand-ins, same scales."""
    w = torch.empty((e, n, k), dtype=storage, device=device)
    scales = torch.empty((e, -(-n // GROUP_N), -(-k // GROUP_K)), dtype=torch.float32, device=device)
    for i in range(e):
        part = torch.randn((n, k), generator=generator, device=device, dtype=torch.float32).mul_(k ** -0.5)
        w[i], scales[i] = quantize_weight_blocks(part, GROUP_N, storage)
    return w, scales


def block_operands(problem: Problem, device, generator: torch.Generator,
                   storage: torch.dtype = torch.float8_e4m3fn) -> Operands:
    """One fp8bs stage's inputs (never zeros), as vLLM's block-fp8 layer sees them: weights per
    128x128 block (``random_block_weights``); gate_up's activations ~ N(0, 1) times a per-token
    magnitude 2^-3 .. 2^3 (so group scales differ by row), quantised per token group with their
    scales; the down stage's input in the intermediate's dtype (bf16; the stand-ins' own), which the
    stage quantises per token group itself (a_scale None). ``storage`` fp16/fp32: CPU stand-ins."""
    m, n, k, e, top_k = problem.m, problem.n, problem.k, problem.e, problem.top_k
    ids = torch.from_numpy(np.ascontiguousarray(R.topk_ids(problem.routing, m, e, top_k))).to(device)
    tw = torch.rand((m, top_k), generator=generator, device=device) + 0.25
    tw /= tw.sum(dim=1, keepdim=True)
    rows = m if problem.stage == "gate_up" else m * top_k
    x = torch.randn((rows, k), generator=generator, device=device, dtype=torch.float32)
    x *= torch.exp2(torch.rand((rows, 1), generator=generator, device=device) * 6 - 3)
    w, w_scale = random_block_weights(e, n, k, device, generator, storage)
    inter = OUT_TORCH_DTYPES[DTYPE_NAMES[storage]]
    if problem.stage == "gate_up":
        x, a_scale = quantize_per_token_group(x, GROUP_K, storage)
    else:
        x, a_scale = x.to(inter), None
    out_rows, out_cols = (m * top_k, n // 2) if problem.stage == "gate_up" else (m, n)
    out = torch.empty((out_rows, out_cols), dtype=inter, device=device)
    return Operands(problem.stage, x, w, tw, ids, out, a_scale, w_scale)


def make_operands(problem: Problem, device: str | torch.device, generator: torch.Generator) -> Operands:
    """Fresh random inputs of one stage (never zeros): activations ~ N(0, 1), weights ~ N(0, 1/K)
    so outputs are O(1); topk_ids from the problem's routing (deterministic per problem),
    topk_weights positive and normalised per token. fp8: activations quantised with one scale
    (amax / 448), weights with one per expert; the down stage's input stays bf16 (the stage
    quantises it with its static scale, here the amax of this input). fp8bs: ``block_operands``."""
    if problem.dtype == BLOCK_DTYPE:
        return block_operands(problem, device, generator)
    m, n, k, e, top_k = problem.m, problem.n, problem.k, problem.e, problem.top_k
    ids = torch.from_numpy(np.ascontiguousarray(R.topk_ids(problem.routing, m, e, top_k))).to(device)
    tw = torch.rand((m, top_k), generator=generator, device=device) + 0.25
    tw /= tw.sum(dim=1, keepdim=True)
    rows = m if problem.stage == "gate_up" else m * top_k
    x = torch.randn((rows, k), generator=generator, device=device, dtype=torch.float32)
    w, w_scale = random_weights(e, n, k, problem.dtype, device, generator)
    a_scale = None
    if problem.dtype == "fp8":
        if problem.stage == "down":
            x = x.to(torch.bfloat16)
        a_scale = dynamic_scale(x)
        if problem.stage == "gate_up":
            x = quantize_fp8_reference(x, a_scale)
    else:
        x = x.to(TORCH_DTYPES[problem.dtype])
    out_rows, out_cols = (m * top_k, n // 2) if problem.stage == "gate_up" else (m, n)
    out = torch.empty((out_rows, out_cols), dtype=OUT_TORCH_DTYPES[problem.dtype], device=device)
    return Operands(problem.stage, x, w, tw, ids, out, a_scale, w_scale)


def _expert_groups(topk_ids: torch.Tensor):
    """(expert, pair indices) for every expert with pairs (synchronises)."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat).tolist()
    start = 0
    for e, c in enumerate(counts):
        if c:
            yield e, order[start:start + c]
        start += c


def _activations(x: torch.Tensor, w: torch.Tensor, a_scale, block: bool = False) -> torch.Tensor:
    """x as the GEMM consumes it, in fp32: fp8 dequantised; bf16 with fp8 weights quantised first
    (block scales: per token group, dynamic when a_scale is None, in w's dtype)."""
    if block:
        if a_scale is None:
            x, a_scale = quantize_per_token_group(x, GROUP_K, w.dtype)
        return x.float() * expand_group_scales(a_scale.float(), x.shape[1])
    if w.dtype == torch.float8_e4m3fn:
        if x.dtype != torch.float8_e4m3fn:
            x = quantize_fp8_reference(x, a_scale)
        return x.float() * a_scale.float().reshape(())
    return x.float()


def stage_reference(stage: str, x, w, topk_weights, topk_ids, a_scale=None, w_scale=None) -> torch.Tensor:
    """fp32 reference of one stage, expert by expert over the experts with pairs (one expert's
    weight in fp32 at a time); TF32 off."""
    top_k = topk_ids.shape[1]
    n, k = w.shape[1], w.shape[2]
    out = torch.zeros(output_shape(stage, x, w, topk_ids), dtype=torch.float32, device=x.device)
    tw = topk_weights.reshape(-1).float()
    block = is_block_scaled(w_scale)
    if block:
        # Every row quantised (or dequantised) once, as the stage's launch does before its GEMM.
        x = _activations(x, w, a_scale, block=True)
    with no_tf32(x.device):
        for e, idx in _expert_groups(topk_ids):
            if block:
                we = w[e].float() * expand_block_scales(w_scale[e].float(), n, k)
                a = x.index_select(0, idx // top_k if stage == "gate_up" else idx)
            else:
                we = w[e].float() * (w_scale[e].float() if w_scale is not None else 1.0)
                a = _activations(x.index_select(0, idx // top_k if stage == "gate_up" else idx), w, a_scale)
            y = a @ we.T
            if stage == "gate_up":
                out[idx] = torch.nn.functional.silu(y[:, : n // 2]) * y[:, n // 2:]
            else:
                # idx holds distinct tokens (distinct experts per token): no repeated row here.
                out.index_add_(0, idx // top_k, y * tw[idx, None])
    return out


def reference(ops: Operands) -> torch.Tensor:
    """fp32 reference of one stage's operand set."""
    return stage_reference(ops.stage, ops.x, ops.w, ops.topk_weights, ops.topk_ids, ops.a_scale, ops.w_scale)


# ----------------------------------------------------------------------------
# The whole layer (for the torch custom op)
# ----------------------------------------------------------------------------

def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """Softmax over experts then top-k: (topk_weights fp32 (M, top_k), topk_ids int32 (M, top_k));
    with ``renormalize`` each token's weights sum to 1."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError("router_logits must be a 2-D (M, E) tensor")
    e = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= e:
        raise ValueError(f"top_k must be an int in 1..E = {e}, got {top_k!r}")
    p = torch.softmax(router_logits.float(), dim=-1)
    w, ids = torch.topk(p, int(top_k), dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.contiguous(), ids.to(torch.int32).contiguous()


def check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale=None, w2_scale=None, a1_scale=None,
                a2_scale=None, out=None) -> str:
    """'' if ``fused_moe`` accepts these operands, else what is wrong, naming the argument.
    With fp8 weights, a1_scale (for bf16 x) and a2_scale may be None: computed per call."""
    names = dict(_STAGE_NAMES, w="w1", a_scale="a1_scale", w_scale="w1_scale")
    msg = check_operands("gate_up", x, w1, topk_weights, topk_ids, a1_scale, w1_scale, _names=names,
                         _dynamic_a_scale=True)
    if msg:
        return msg
    if not isinstance(w2, torch.Tensor):
        return f"w2 must be a torch tensor, got {type(w2).__name__}"
    e, n1, hidden = w1.shape
    want = (e, hidden, n1 // 2)
    if w2.dim() != 3 or tuple(w2.shape) != want:
        return f"w2 must have shape (E, hidden, I) = {want} (w1 is {tuple(w1.shape)}), got {tuple(w2.shape)}"
    if w2.dtype != w1.dtype:
        return f"w2 must have w1's dtype {w1.dtype}, got {w2.dtype}"
    if w2.device != x.device or not w2.is_contiguous():
        return f"w2 must be contiguous and on {x.device}"
    fp8 = w1.dtype == torch.float8_e4m3fn
    if is_block_scaled(w1_scale):
        # The intermediate is always quantised per token group with dynamic scales (vLLM's rule).
        if a2_scale is not None:
            return "a2_scale must be None with block scales (the intermediate is quantised per token group)"
        inter = n1 // 2
        msg = _check_scale("w2_scale", w2_scale, (e, -(-hidden // GROUP_N), -(-inter // GROUP_K)), x.device,
                           "block-scaled")
        if msg:
            return msg
    elif fp8:
        msg = _check_scale("w2_scale", w2_scale, (e,), x.device)
        if not msg and a2_scale is not None:
            msg = _check_scale("a2_scale", a2_scale, (1,), x.device)
        if msg:
            return msg
    else:
        for label, s in (("w2_scale", w2_scale), ("a2_scale", a2_scale)):
            if s is not None:
                return f"{label} is only for fp8 weights (w2 is {w2.dtype})"
    if out is not None:
        want = (topk_ids.shape[0], hidden)
        dt = OUT_TORCH_DTYPES[DTYPE_NAMES[w1.dtype]]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != dt \
                or out.device != x.device or not out.is_contiguous():
            return f"out must be a contiguous {dt} tensor of shape {want} on {x.device}"
    return ""


def fused_moe(x, w1, w2, topk_weights, topk_ids, cfg_up, cfg_down, *, w1_scale=None, w2_scale=None,
              a1_scale=None, a2_scale=None, out=None, check: bool = True) -> torch.Tensor:
    """The MoE layer: y (M, hidden) = sum_j topk_weights[t, j] * down_e(silu(gate_e(x)) * up_e(x)),
    e = topk_ids[t, j]; both stages on their configs. bf16 (fp16/fp32 in the interpreter), or fp8
    weights with per-expert scales: x fp8 with a1_scale, or bf16 quantised with a1_scale (or a
    dynamic per-tensor scale when None); the intermediate is quantised with a2_scale (dynamic when
    None). ValueError naming the argument on bad operands."""
    if check:  # check=False: the caller (the torch op) validated these operands already
        _raise(check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, out))
    # Per-tensor fp8 only: block scales quantise both stages' inputs per token group in the launch.
    fp8 = w1.dtype == torch.float8_e4m3fn and not is_block_scaled(w1_scale)
    if fp8 and a1_scale is None:
        a1_scale = dynamic_scale(x)
    h = launch(cfg_up, "gate_up", x, w1, topk_weights, topk_ids, None, a1_scale, w1_scale)
    if fp8 and a2_scale is None:
        a2_scale = dynamic_scale(h)
    return launch(cfg_down, "down", h, w2, topk_weights, topk_ids, out, a2_scale, w2_scale)


def moe_reference(x, w1, w2, topk_weights, topk_ids, *, w1_scale=None, w2_scale=None, a1_scale=None,
                  a2_scale=None) -> torch.Tensor:
    """fp32 reference of ``fused_moe``: the intermediate is rounded to the dtype the layer keeps it
    in (bf16 for fp8) and, for fp8, quantised as the down stage does. A dynamic a2_scale (None) is
    taken from this reference intermediate, which may differ from the kernel's by one rounding:
    compare fp8 layers with static scales (or a looser bound)."""
    _raise(check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale))
    fp8 = w1.dtype == torch.float8_e4m3fn and not is_block_scaled(w1_scale)
    if fp8 and a1_scale is None:
        a1_scale = dynamic_scale(x)
    h = stage_reference("gate_up", x, w1, topk_weights, topk_ids, a1_scale, w1_scale)
    h = h.to(OUT_TORCH_DTYPES[DTYPE_NAMES[w1.dtype]])
    if fp8 and a2_scale is None:
        a2_scale = dynamic_scale(h)
    return stage_reference("down", h, w2, topk_weights, topk_ids, a2_scale, w2_scale)
