"""Triton dense GEMM kernel family for y = x @ w.T (nn.Linear layout).

x is (M, K) and w is (N, K), both row-major; y is (M, N). Inputs are bf16,
fp16 or fp8 e4m3 (per-tensor scales, bf16 output); fp32 accumulates. fp32
inputs are accepted for CPU interpreter tests.

Variants (configs in gemm/space.py):
- tiled: output tiles in grouped order, masked loads; any shape and stride.
- splitk: K split over SPLIT_K programs writing fp32 partials, then a small
  reduce kernel applies the scales and casts. For decode and skinny shapes.
- persistent: one program per SM walks the tile list, loading through TMA
  tensor descriptors (Hopper). Needs 16-byte aligned rows.
- swapab / swapab_tma: decode (M <= 64) kernels computing y.T = w @ x.T, so the
  weight rows fill the MMA's M side; in kernels/gemm/swapab.py.
- gemv: M <= 2, CUDA-core dot products (no MMA) with an optional one-launch
  split-K; in kernels/gemm/gemv.py.
- vendor: torch.mm (cuBLAS) or torch._scaled_mm (fp8).

``launch(cfg, x, w, ...)`` runs any candidate on torch tensors. The helpers
shared with gemm/swapab.py (grouped tile order, K main loop, split-K
last-arrival epilogue, operand checks, buffers) live in common.py and are
re-exported here, so ``gemm.<name>`` keeps working for all of them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Launch dispatch goes to gemm_swapab for its configs; gemm_swapab and this module
# take their shared helpers from common, so neither imports the other's helpers.
from . import gemv as gemm_gemv, swapab as gemm_swapab
# Re-exported: callers use them as gemm.<name> (launch_args, TORCH_DTYPES, ...).
from ..common import (DTYPE_NAMES, TORCH_DTYPES, _arrival_counters, _device_index,  # noqa: F401
                     _grouped_tile, _mainloop, _splitk_last_arrival, alloc_output, check_operands,
                     dtype_name, launch_args, no_tf32, num_sms, splitk_workspace, zeroed_buffer)
from .space import (DTYPE_BYTES, OUT_DTYPE, GemmConfig, GemvConfig, PersistentConfig,  # noqa: F401
                           SplitKConfig, SwapABConfig, TiledConfig, VendorConfig)


@triton.jit(do_not_specialize=["M"])
def gemm_tiled_kernel(x_ptr, w_ptr, y_ptr, sa_ptr, sb_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                      HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """One program per (BLOCK_M, BLOCK_N) output tile, tiles in grouped order."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _mainloop(x_ptr, w_ptr, offs_m, offs_n, M, N, K, 0, tl.cdiv(K, BLOCK_K), stride_xm,
                    stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    if HAS_SCALE:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_slice(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, pid_s,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    # Program (tile, pid_s): fp32 partial product of the tile over the pid_s-th K slice.
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    pid_m = tile // num_pid_n
    pid_n = tile % num_pid_n
    # Balanced slices of whole k-tiles: every slice gets at least one tile
    # because the feasibility filter requires cdiv(K, BLOCK_K) >= SPLIT_K.
    total = tl.cdiv(K, BLOCK_K)
    t0 = pid_s * total // SPLIT_K
    t1 = (pid_s + 1) * total // SPLIT_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _mainloop(x_ptr, w_ptr, offs_m, offs_n, M, N, K, t0, t1 - t0, stride_xm,
                    stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    return acc, offs_m, offs_n


@triton.jit(do_not_specialize=["M"])
def gemm_splitk_kernel(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Program (tile, s) multiplies the s-th slice of K and writes fp32 partials ws[s]."""
    pid_s = tl.program_id(1)
    acc, offs_m, offs_n = _splitk_slice(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, pid_s,
                                        BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, EVEN_K)
    ws_ptrs = ws_ptr + pid_s * M * N + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(ws_ptrs, acc, mask=mask)


@triton.jit(do_not_specialize=["MN"])
def splitk_reduce_kernel(ws_ptr, y_ptr, sa_ptr, sb_ptr, MN, SPLIT_K: tl.constexpr,
                         HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """y = scale * sum_s ws[s], cast to the output dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_SCALE:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def gemm_splitk_serial_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, K,
                              stride_xm, stride_wn, stride_ym, HAS_SCALE: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Split-K in one launch: each slice writes fp32 partials, the last slice of a tile to
    arrive (per-tile arrival counter) sums them, applies the scales, stores y and resets
    the counter to zero for the next launch."""
    tile = tl.program_id(0)
    pid_s = tl.program_id(1)
    acc, offs_m, offs_n = _splitk_slice(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, pid_s,
                                        BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, EVEN_K)
    _splitk_last_arrival(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_m, offs_n,
                         tile, pid_s, HAS_SCALE, SPLIT_K, False)


# NUM_PROGRAMS is a runtime argument, never specialised on: as a constexpr it
# was min(SMs, tiles), so every shape with fewer tiles than SMs compiled each
# persistent config anew inside the measuring process (the precompile probe has
# one tile), and that dominated evaluation sweeps.
@triton.jit(do_not_specialize=["M", "NUM_PROGRAMS"])
def gemm_persistent_kernel(x_desc, w_desc, y_desc, sa_ptr, sb_ptr, M, N, K, NUM_PROGRAMS,
                           HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr = False,
                           EPI_SUBTILE: tl.constexpr = False):
    """A fixed grid of programs strides over all output tiles; TMA loads/stores.

    WARP_SPEC asks Triton for producer/consumer warp specialisation of the tile
    loop; EPI_SUBTILE stores the tile as two (BLOCK_M, BLOCK_N / 2) halves, which
    halves the epilogue's shared memory (y_desc's block is then BLOCK_N / 2 wide).
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)
    # flatten lets the software pipeline prefetch the next tile's K-loop during the epilogue.
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPEC):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # TMA zero-fills out-of-bounds boxes, so the K tail needs no mask.
        for kt in range(k_tiles):
            a = x_desc.load([off_m, kt * BLOCK_K])
            b = w_desc.load([off_n, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if HAS_SCALE:
            acc = acc * scale
        if EPI_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            lo, hi = tl.split(halves)
            y_desc.store([off_m, off_n], lo.to(y_desc.dtype))
            y_desc.store([off_m, off_n + BLOCK_N // 2], hi.to(y_desc.dtype))
        else:
            y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


# ----------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------

PERSISTENT_FLATTEN = True
SPLITK_SERIAL = True  # one-launch split-K (arrival counters) instead of partials + reduce kernel


def launch(cfg: GemmConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
    """Run candidate ``cfg`` for y = x @ w.T (times scale_a * scale_b for fp8). Returns y.

    Does not validate its arguments (hot path); call check_operands first on
    untrusted input. Never synchronises the device, so it is CUDA-graph safe.
    """
    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    if isinstance(cfg, TiledConfig):
        grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
        gemm_tiled_kernel[grid](
            x, w, out, sa, sb, M, N, K, x.stride(0), w.stride(0), out.stride(0),
            HAS_SCALE=has_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m, EVEN_K=K % cfg.block_k == 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out
    if isinstance(cfg, SplitKConfig):
        ws = splitk_workspace(x.device, cfg.split_k, M, N)
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        grid = (tiles, cfg.split_k)
        if SPLITK_SERIAL:
            gemm_splitk_serial_kernel[grid](
                x, w, out, ws, _arrival_counters(x.device, tiles), sa, sb, M, N, K, x.stride(0),
                w.stride(0), out.stride(0), HAS_SCALE=has_scale, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                EVEN_K=K % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            return out
        gemm_splitk_kernel[grid](
            x, w, ws, M, N, K, x.stride(0), w.stride(0),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            EVEN_K=K % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        block = 1024
        splitk_reduce_kernel[(triton.cdiv(M * N, block),)](
            ws, out, sa, sb, M * N, SPLIT_K=cfg.split_k, HAS_SCALE=has_scale, BLOCK=block, num_warps=4)
        return out
    if isinstance(cfg, PersistentConfig):
        return launch_persistent(cfg, x, w, out, sa, sb, has_scale)
    if isinstance(cfg, SwapABConfig):
        return gemm_swapab.launch(cfg, x, w, out, scale_a, scale_b)
    if isinstance(cfg, GemvConfig):
        return gemm_gemv.launch(cfg, x, w, out, scale_a, scale_b)
    if isinstance(cfg, VendorConfig):
        if has_scale:
            # w.t() of a row-major (N, K) weight is the column-major B cuBLASLt wants.
            # _scaled_mm has no out= overload; its own result is returned.
            return torch._scaled_mm(x, w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out.dtype)
        return torch.mm(x, w.t(), out=out)
    raise TypeError(f"unknown config type {type(cfg).__name__}")


def launch_persistent(cfg: PersistentConfig, x, w, out, sa, sb, has_scale: bool, warp_spec: bool = False,
                      epi_subtile: bool = False, flatten: bool | None = None, programs: int | None = None):
    """The persistent TMA kernel; the keyword knobs beyond cfg are for explorations."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    N = w.shape[0]
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = min(programs or num_sms(_device_index(x)), tiles)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    y_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.block_n // (2 if epi_subtile else 1)])
    gemm_persistent_kernel[(programs,)](
        x_desc, w_desc, y_desc, sa, sb, M, N, K, programs, HAS_SCALE=has_scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        FLATTEN=PERSISTENT_FLATTEN if flatten is None else flatten,
        WARP_SPEC=warp_spec, EPI_SUBTILE=epi_subtile, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return out


def reference(x: torch.Tensor, w: torch.Tensor, scale_a=None, scale_b=None) -> torch.Tensor:
    """fp32 reference of y = x @ w.T (times the fp8 scales), TF32 off."""
    xf, wf = x.float(), w.float()
    with no_tf32(x.device):
        y = xf @ wf.t()
    if x.dtype == torch.float8_e4m3fn:
        y = y * (scale_a.float() * scale_b.float())
    return y

