"""The block-scaled fp8 GEMM op's implementation (torch, triton; imported lazily by the registry).

y (M, N) = (A * As) @ (B * Bs).T, vLLM's w8a8 block fp8 linear: A fp8 e4m3 (M, K) with fp32
scales As (M, ceil(K/128)), one per token per 128-wide K group; B fp8 e4m3 (N, K) with fp32
scales Bs (ceil(N/128), ceil(K/128)), one per 128x128 block; y bf16. Any M >= 1; N and K
need not be multiples of 128 (the last group is partial).

The kernel (vLLM's scheme): per K tile, tl.dot of the A and B tiles in fp32, times the tile's
As column (per row) and Bs block (per column, by offs_n // 128), added to the accumulator.
BLOCK_K divides 128 (space.static_feasible), so a K tile lies in one scale group. Split-K
configs sum slices of the K tiles in one launch (kernels/common.py's last-arrival epilogue;
the partials are already scaled, so it runs without its per-tensor scale).

fp16/fp32 operands (same scale layout, output in the input dtype) exist for the Triton CPU
interpreter, which computes garbage for fp8 and bf16 dots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..common import _arrival_counters, _grouped_tile, _splitk_last_arrival, splitk_workspace
from .space import (GROUP_K, GROUP_N, BlockScaleConfig, BsGemvConfig, BsSplitKConfig, BsSwapABConfig, BsTiledConfig,
                    Problem, VendorConfig)

TORCH_DTYPES = {"fp8": torch.float8_e4m3fn, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
OUT_TORCH_DTYPES = {"fp8": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Relative Frobenius error bounds against the fp32 reference of the same (quantised)
# operands, per input dtype: the output rounding (bf16 2^-9, fp16 2^-12) dominates.
ERROR_BOUNDS = {"fp8": 1e-2, "fp16": 2e-3, "fp32": 2e-3}

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_SCALE_MIN = 1e-10  # floor of a scale, so that an all-zero group quantises to zeros, not NaN


# ----------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------

@triton.jit(do_not_specialize=["M"])
def fp8_blockscale_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                          stride_am, stride_bn, stride_ym, stride_asm, stride_bsn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
                          GROUP_N: tl.constexpr, GROUP_K: tl.constexpr):
    """Program (tile, s): the s-th of SPLIT_K slices of K tiles of output tile `tile` (grouped
    order); with SPLIT_K == 1 it stores y, else the last slice to arrive sums and stores."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/cols read row 0 (loads and scale loads stay unmasked along M/N);
    # the store mask drops them.
    rm = tl.where(offs_m < M, offs_m, 0)
    rn = tl.where(offs_n < N, offs_n, 0)
    as_rows = as_ptr + rm * stride_asm
    bs_rows = bs_ptr + (rn // GROUP_N) * stride_bsn
    # Balanced slices of whole K tiles (feasibility: cdiv(K, BLOCK_K) >= SPLIT_K).
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    offs_k = t0 * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + rn[:, None] * stride_bn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(t0, t1):
        k_mask = offs_k[None, :] < K - (kt - t0) * BLOCK_K
        a = tl.load(a_ptrs, mask=k_mask, other=0.0)
        b = tl.load(b_ptrs, mask=k_mask, other=0.0)
        kg = kt * BLOCK_K // GROUP_K  # BLOCK_K divides GROUP_K: the tile's one scale group
        a_s = tl.load(as_rows + kg)
        b_s = tl.load(bs_rows + kg)
        acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SPLIT_K == 1:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        _splitk_last_arrival(acc, y_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr, M, N, stride_ym, offs_m, offs_n,
                             tile, pid_s, False, SPLIT_K, False)


@triton.jit(do_not_specialize=["M"])
def fp8_blockscale_swapab_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                                 stride_am, stride_bn, stride_ym, stride_asm, stride_bsn,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 SPLIT_K: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr):
    """Swap-AB (decode): program (tile, s) computes a (BLOCK_N weight rows, BLOCK_M tokens) tile
    of y.T = B @ A.T over the s-th slice of K tiles, so the weight rows fill the wgmma M side
    and the few tokens its N side. Stored transposed into y (M, N)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    tile = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_n = tile // num_pid_m
    pid_m = tile % num_pid_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.where(offs_m < M, offs_m, 0)
    rn = tl.where(offs_n < N, offs_n, 0)
    as_rows = as_ptr + rm * stride_asm
    bs_rows = bs_ptr + (rn // GROUP_N) * stride_bsn
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    offs_k = t0 * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + rn[:, None] * stride_bn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(t0, t1):
        k_mask = offs_k[None, :] < K - (kt - t0) * BLOCK_K
        a = tl.load(a_ptrs, mask=k_mask, other=0.0)
        b = tl.load(b_ptrs, mask=k_mask, other=0.0)
        kg = kt * BLOCK_K // GROUP_K
        a_s = tl.load(as_rows + kg)
        b_s = tl.load(bs_rows + kg)
        acc += tl.dot(b, tl.trans(a)) * b_s[:, None] * a_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SPLIT_K == 1:
        mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        _splitk_last_arrival(acc, y_ptr, ws_ptr, cnt_ptr, as_ptr, bs_ptr, M, N, stride_ym, offs_m, offs_n,
                             tile, pid_s, False, SPLIT_K, True)


@triton.jit
def _gemv_x_scaled(a_ptr, as_ptr, bs_row, row, K: tl.constexpr, KG: tl.constexpr, offs_g, offs_j, kt,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, GROUP_K: tl.constexpr):
    # Token row `row` of this K tile as (G, 128) fp32 times its group scales As[row, g] * Bs[nb, g]:
    # one scale per 128-wide group (a value per thread, not per element).
    g = kt * (BLOCK_K // GROUP_K) + offs_g
    k = g[:, None] * GROUP_K + offs_j[None, :]
    if EVEN_K:
        v = tl.load(a_ptr + row * K + k)
        s = tl.load(as_ptr + row * KG + g) * tl.load(bs_row + g)
    else:
        v = tl.load(a_ptr + row * K + k, mask=k < K, other=0.0)
        s = tl.load(as_ptr + row * KG + g, mask=g < KG, other=0.0) * tl.load(bs_row + g, mask=g < KG, other=0.0)
    return v.to(tl.float32) * s[:, None]


# N and K are compile-time constants (M is not), as in the dense GEMV (kernels/gemm/gemv.py): one
# compile per weight shape and config, which a server pays once per layer at warm-up.
@triton.jit(do_not_specialize=["M"])
def fp8_blockscale_gemv_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                               GROUP_N: tl.constexpr, GROUP_K: tl.constexpr):
    """GEMV (M = 1): program (n-block, token) computes BLOCK_N outputs of one token row with
    CUDA-core fp32 products; the weight tile is viewed as (BLOCK_N, BLOCK_K / 128, 128) so each
    128-wide group's scale product multiplies the token row once. Rows are reduced after the
    loop (no cross-thread work inside it). BLOCK_N divides 128 (space.static_feasible), so a
    program's weight rows share one row of Bs; rows past N wrap to n % N and are never stored."""
    KG: tl.constexpr = (K + GROUP_K - 1) // GROUP_K
    G: tl.constexpr = BLOCK_K // GROUP_K
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_g = tl.arange(0, G)
    offs_j = tl.arange(0, GROUP_K)
    bs_row = bs_ptr + (pid_n * BLOCK_N // GROUP_N) * KG
    w_rows = b_ptr + (offs_n % N)[:, None, None] * K
    acc = tl.zeros((BLOCK_N, G, GROUP_K), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k = (kt * G + offs_g)[:, None] * GROUP_K + offs_j[None, :]
        # The weight is read once: evict-first keeps the token row and scales in cache.
        if EVEN_K:
            w = tl.load(w_rows + k[None, :, :], eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + k[None, :, :], mask=(k < K)[None, :, :], other=0.0, eviction_policy="evict_first")
        x = _gemv_x_scaled(a_ptr, as_ptr, bs_row, row, K, KG, offs_g, offs_j, kt, BLOCK_K, EVEN_K, GROUP_K)
        acc += w.to(tl.float32) * x[None, :, :]
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(y_ptr + row * N + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


def _launch_gemv(cfg: BsGemvConfig, a, b, as_, bs, out):
    M, K = a.shape
    N = b.shape[0]
    # One program column per token row: each re-reads the weight, so the space keeps the GEMV to
    # M = 1 (space.PROBLEM_RULES); any M is still computed correctly.
    fp8_blockscale_gemv_kernel[(triton.cdiv(N, cfg.block_n), M)](
        a, b, as_, bs, out, M, N, K, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
        GROUP_N=GROUP_N, GROUP_K=GROUP_K, num_warps=cfg.num_warps, num_stages=1)
    return out


# ----------------------------------------------------------------------------
# Host
# ----------------------------------------------------------------------------

def vendor_weight_scales(bs: torch.Tensor) -> torch.Tensor:
    """Bs (ceil(N/128), ceil(K/128)) row-major as cuBLASLt's 128x128 scale of B = b.t() (K, N):
    the transposed view, no copy. A weight-load-time layout (the weight is static)."""
    return bs.t()


def _vendor(a: torch.Tensor, b: torch.Tensor, as_: torch.Tensor, bs: torch.Tensor, out: torch.Tensor):
    """torch._scaled_mm with cuBLASLt's blockwise scaling: 1x128 for A, 128x128 for B (sm90,
    CUDA >= 12.9). cuBLASLt wants As outer-dim-major (M, K/128) with strides (1, M): the
    quantisation helpers (and vLLM) write it row-major, so it is re-laid-out on every call,
    and that copy is part of the vendor's time. _scaled_mm has no out= overload."""
    sa = as_.t().contiguous().t()
    return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=vendor_weight_scales(bs), out_dtype=out.dtype)


def dtype_name(t: torch.Tensor) -> str:
    try:
        return DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {t.dtype}; supported: {sorted(DTYPE_NAMES.values())}") from None


def scale_shapes(m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of As (M, ceil(K/128)) and Bs (ceil(N/128), ceil(K/128))."""
    kg = -(-k // GROUP_K)
    return (m, kg), (-(-n // GROUP_N), kg)


def check_operands(a: torch.Tensor, b: torch.Tensor, as_: torch.Tensor, bs: torch.Tensor) -> str:
    """Validate A (M, K), B (N, K) and their scales for the op; returns the dtype name."""
    for label, t in (("a", a), ("b", b), ("as_", as_), ("bs", bs)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{label} must be a torch tensor")
        if t.dim() != 2:
            raise ValueError(f"{label} must be 2-D, got {t.dim()}-D")
        if not t.is_contiguous():
            raise ValueError(f"{label} must be contiguous (row-major)")
        if t.device != a.device:
            raise ValueError(f"device mismatch: a on {a.device}, {label} on {t.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)} (b is (N, K))")
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch: a is {a.dtype}, b is {b.dtype}")
    m, k = a.shape
    n = b.shape[0]
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"M, N and K must be >= 1, got a {tuple(a.shape)}, b {tuple(b.shape)}")
    name = dtype_name(a)
    want_as, want_bs = scale_shapes(m, n, k)
    for label, s, want in (("as_", as_, want_as), ("bs", bs, want_bs)):
        if s.dtype != torch.float32:
            raise ValueError(f"{label} must be float32, got {s.dtype}")
        if tuple(s.shape) != want:
            raise ValueError(f"{label} must have shape {want} (128-wide groups), got {tuple(s.shape)}")
    return name


def launch(cfg: BlockScaleConfig, a: torch.Tensor, b: torch.Tensor, as_: torch.Tensor, bs: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Run candidate ``cfg`` for y = (a * as_) @ (b * bs).T; returns y (bf16 for fp8 inputs, else
    the input dtype). Does not validate (hot path): call check_operands on untrusted input.
    Never synchronises the device."""
    M, K = a.shape
    N = b.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=OUT_TORCH_DTYPES[dtype_name(a)], device=a.device)
    if isinstance(cfg, VendorConfig):
        return _vendor(a, b, as_, bs, out)
    if isinstance(cfg, BsGemvConfig):
        return _launch_gemv(cfg, a, b, as_, bs, out)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    if isinstance(cfg, BsSwapABConfig):
        split_k = cfg.split_k
        ws = splitk_workspace(a.device, split_k, M, N) if split_k > 1 else out
        cnt = _arrival_counters(a.device, tiles) if split_k > 1 else out
        fp8_blockscale_swapab_kernel[(tiles, split_k)](
            a, b, as_, bs, out, ws, cnt, M, N, K, a.stride(0), b.stride(0), out.stride(0),
            as_.stride(0), bs.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            SPLIT_K=split_k, GROUP_N=GROUP_N, GROUP_K=GROUP_K, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out
    if isinstance(cfg, BsTiledConfig):
        split_k, group_m, ws, cnt = 1, cfg.group_m, out, out  # ws/cnt: dummies, never read
    elif isinstance(cfg, BsSplitKConfig):
        split_k, group_m = cfg.split_k, 1
        ws = splitk_workspace(a.device, split_k, M, N)
        cnt = _arrival_counters(a.device, tiles)
    else:
        raise ValueError(f"not an fp8_blockscale config: {cfg!r}")
    fp8_blockscale_kernel[(tiles, split_k)](
        a, b, as_, bs, out, ws, cnt, M, N, K, a.stride(0), b.stride(0), out.stride(0),
        as_.stride(0), bs.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=group_m, SPLIT_K=split_k, GROUP_N=GROUP_N, GROUP_K=GROUP_K,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


# ----------------------------------------------------------------------------
# Quantisation helpers and the reference
# ----------------------------------------------------------------------------

def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    pad = -x.shape[dim] % multiple
    if not pad:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _group_scales(x: torch.Tensor, group: int, target_max: float) -> torch.Tensor:
    """(M, ceil(K/group)) fp32 scales: amax of each row's group / target_max."""
    xp = _pad_to(x.float(), 1, group)
    amax = xp.abs().reshape(x.shape[0], -1, group).amax(dim=2)
    return (amax / target_max).clamp_min(_SCALE_MIN)


def _block_scales(w: torch.Tensor, block: int, target_max: float) -> torch.Tensor:
    """(ceil(N/block), ceil(K/block)) fp32 scales: amax of each block / target_max."""
    wp = _pad_to(_pad_to(w.float(), 0, block), 1, block)
    nb, kb = wp.shape[0] // block, wp.shape[1] // block
    amax = wp.abs().reshape(nb, block, kb, block).amax(dim=(1, 3))
    return (amax / target_max).clamp_min(_SCALE_MIN)


def expand_group_scales(as_: torch.Tensor, k: int, group: int = GROUP_K) -> torch.Tensor:
    """As (M, ceil(K/group)) -> (M, K), each scale repeated over its group."""
    return as_.repeat_interleave(group, dim=1)[:, :k]


def expand_block_scales(bs: torch.Tensor, n: int, k: int, block: int = GROUP_N) -> torch.Tensor:
    """Bs (ceil(N/block), ceil(K/block)) -> (N, K), each scale repeated over its block."""
    return bs.repeat_interleave(block, dim=0)[:n].repeat_interleave(block, dim=1)[:, :k]


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-FP8_MAX, FP8_MAX)
    return x.to(dtype).contiguous()


def quantize_per_token_group(x: torch.Tensor, group: int = GROUP_K, dtype: torch.dtype = torch.float8_e4m3fn):
    """Activation quantisation (vLLM's per-token-group fp8): x (M, K) -> (x_q (M, K) in ``dtype``,
    scales (M, ceil(K/group)) fp32) with x ~= x_q * scales repeated over each group. fp32 math
    (runs on CPU and GPU); every group's largest |x| maps to 448."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got {x.dim()}-D")
    s = _group_scales(x, group, FP8_MAX)
    return _cast(x.float() / expand_group_scales(s, x.shape[1], group), dtype), s.contiguous()


def quantize_weight_blocks(w: torch.Tensor, block: int = GROUP_N, dtype: torch.dtype = torch.float8_e4m3fn):
    """Weight quantisation per block x block tile: w (N, K) -> (w_q (N, K) in ``dtype``, scales
    (ceil(N/block), ceil(K/block)) fp32) with w ~= w_q * the block's scale. fp32 math."""
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D (N, K), got {w.dim()}-D")
    s = _block_scales(w, block, FP8_MAX)
    return _cast(w.float() / expand_block_scales(s, w.shape[0], w.shape[1], block), dtype), s.contiguous()


def dequantize(a: torch.Tensor, b: torch.Tensor, as_: torch.Tensor, bs: torch.Tensor):
    """(A * As, B * Bs) in fp32."""
    (m, k), n = a.shape, b.shape[0]
    return a.float() * expand_group_scales(as_.float(), k), b.float() * expand_block_scales(bs.float(), n, k)


@dataclass
class Operands:
    """One set of inputs and a preallocated output for a problem."""

    a: torch.Tensor
    b: torch.Tensor
    as_: torch.Tensor
    bs: torch.Tensor
    out: torch.Tensor

    def run(self, cfg: BlockScaleConfig) -> torch.Tensor:
        return launch(cfg, self.a, self.b, self.as_, self.bs, self.out)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, self.b, self.as_, self.bs, self.out))


def make_operands(problem: Problem, device: str | torch.device, generator: torch.Generator) -> Operands:
    """Fresh random inputs, quantised as vLLM does (never zeros): activations with a per-token
    magnitude spread (2^-3 .. 2^3, so the scales differ by row and group), weights scaled by
    1/sqrt(K) so that outputs are O(1). fp16/fp32 problems keep the quantised values
    (|x| <= 448) in that dtype, with the same scales."""
    m, n, k = problem.m, problem.n, problem.k
    # On ``device`` (the harness passes a generator of that device); quantised there in fp32.
    x = torch.randn((m, k), generator=generator, device=device, dtype=torch.float32)
    x *= torch.exp2(torch.rand((m, 1), generator=generator, device=device) * 6 - 3)
    w = torch.randn((n, k), generator=generator, device=device, dtype=torch.float32) * k ** -0.5
    dt = TORCH_DTYPES[problem.dtype]
    a, as_ = quantize_per_token_group(x, GROUP_K, dt)
    b, bs = quantize_weight_blocks(w, GROUP_N, dt)
    out = torch.empty((m, n), dtype=OUT_TORCH_DTYPES[problem.dtype], device=device)
    return Operands(a, b, as_, bs, out)


def reference(ops: Operands) -> torch.Tensor:
    """fp32 reference: dequantise, then an fp32 matmul (no TF32)."""
    a, b = dequantize(ops.a, ops.b, ops.as_, ops.bs)
    if a.is_cuda:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return a @ b.T
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return a @ b.T
