"""Helpers shared by the GEMM kernel modules (gemm/kernel.py, gemm/swapab.py, and the
exploration kernels in benchmarks/explore/), so that a kernel module takes its helpers from
here and never from another kernel module (no import cycle).

Triton (inlined into the kernels that call them):
- _grouped_tile: the grouped output-tile order (L2 reuse of w tiles).
- _mainloop: the K loop of pointer-loading kernels, masked K tail.
- _splitk_last_arrival: the one-launch split-K epilogue: store this slice's
  fp32 partial, count the arrival, and the tile's last slice to arrive sums,
  scales, stores y and resets the counter.

Host: dtype names, operand checks, output allocation, launch arguments, SM
count, and the per-device buffers (split-K workspace, zeroed arrival counters).
Names with a leading underscore are internal to the kernel modules. gemm.py
re-exports the ones callers use (``gemm.launch_args``, ``gemm.TORCH_DTYPES``,
``gemm._arrival_counters``, ...), so older imports keep working.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from .space_common import OUT_DTYPE

TORCH_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


# ----------------------------------------------------------------------------
# Triton helpers
# ----------------------------------------------------------------------------

@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Walk GROUP_M row-blocks at a time so consecutive programs share w tiles in L2.
    group_size = GROUP_M * num_pid_n
    group_id = tile_id // group_size
    first_m = group_id * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size) % rows
    pid_n = (tile_id % group_size) // rows
    return pid_m, pid_n


@triton.jit
def _mainloop(x_ptr, w_ptr, offs_m, offs_n, M, N, K, k_tile0, k_tiles, stride_xm, stride_wn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr):
    # Out-of-range rows/cols are clamped to index 0 rather than masked: the
    # loads stay unpredicated along M/N, and the store mask drops those lanes.
    rm = tl.where(offs_m < M, offs_m, 0)
    rn = tl.where(offs_n < N, offs_n, 0)
    offs_k = k_tile0 * BLOCK_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, k_tiles):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_mask = offs_k[None, :] < K - kt * BLOCK_K
            a = tl.load(x_ptrs, mask=k_mask, other=0.0)
            b = tl.load(w_ptrs, mask=k_mask, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _splitk_last_arrival(acc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, stride_ym, offs_m, offs_n,
                         tile, pid_s, HAS_SCALE: tl.constexpr, SPLIT_K: tl.constexpr,
                         TRANSPOSED: tl.constexpr):
    # One-launch split-K epilogue of tile `tile`. acc is this slice's fp32 partial of
    # y[offs_m, offs_n]: a (len(offs_m), len(offs_n)) tile, or with TRANSPOSED (swap-AB)
    # a (len(offs_n), len(offs_m)) tile of y.T. The workspace holds SPLIT_K slices of
    # y (M, N), so it is indexed like y.
    #
    # The y pointers are formed where each kernel formed them when it was timed on the
    # H100: swap-AB before the arrival (its SPLIT_K == 1 store shared them), split-K only
    # in the last slice. Moving either changes ptxas's register allocation (swap-AB
    # m32n64k128_s4: 56 -> 64 registers), so both placements are kept.
    if TRANSPOSED:
        mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        ws_tile = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        ws_tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws_tile + pid_s * M * N, acc, mask=mask)
    # Every thread's partial store precedes the release of the arrival count.
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT_K - 1:
        tl.debug_barrier()
        out = tl.zeros(acc.shape, dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            out += tl.load(ws_tile + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_SCALE:
            out = out * (tl.load(sa_ptr) * tl.load(sb_ptr))
        if not TRANSPOSED:
            y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=mask)
        # Zero again for the next launch (CUDA graphs replay with the same counters).
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


# ----------------------------------------------------------------------------
# Host helpers
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """Streaming multiprocessor count (4 on CPU, for the interpreter)."""
    if device_index < 0:
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


_ZEROED: dict = {}


def zeroed_buffer(kind: str, device: torch.device, n: int, dtype: torch.dtype, min_numel: int) -> torch.Tensor:
    """A zeroed buffer of at least n elements, kept per (kind, device); the kernels
    that use it leave it zeroed again.

    Allocated on first use (the warm-up call, outside any CUDA graph capture);
    one stream at a time may use it, as is the case in a serving engine.
    """
    key = (kind, str(device))
    buf = _ZEROED.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, min_numel), dtype=dtype, device=device)
        _ZEROED[key] = buf
    return buf


_WORKSPACES: dict = {}


def splitk_workspace(device: torch.device, split_k: int, m: int, n: int) -> torch.Tensor:
    """The fp32 split-K partials (split_k, M, N), in a buffer kept per device and grown as
    needed (at most SPLITK_WORKSPACE_LIMIT by feasibility); one stream at a time, like the
    arrival counters.

    A workspace allocated per launch is allocated inside every CUDA graph capture, into
    that graph's private memory pool, which stays reserved after the graph is gone: a
    sweep capturing a graph per candidate reserved the whole card this way. Allocated on
    first use (the warm-up call, outside any capture), this one is reused by every capture.
    """
    key = str(device)
    numel = split_k * m * n
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        _WORKSPACES.pop(key, None)  # let the old buffer go before the larger one is allocated
        buf = torch.empty(numel, dtype=torch.float32, device=device)
        _WORKSPACES[key] = buf
    return buf[:numel].view(split_k, m, n)


def _arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 per-tile counters (see zeroed_buffer)."""
    return zeroed_buffer("counters", device, n, torch.int32, 1 << 16)


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.type == "cuda" else -1


def dtype_name(t: torch.Tensor) -> str:
    """Short dtype name ('bf16', 'fp16', 'fp8', 'fp32') of a tensor; ValueError if unsupported."""
    try:
        return DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {t.dtype}; supported: {sorted(TORCH_DTYPES)}") from None


def check_operands(x: torch.Tensor, w: torch.Tensor, scale_a=None, scale_b=None) -> str:
    """Validate x (M, K) and w (N, K) for y = x @ w.T; returns the dtype name."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError("x and w must be torch tensors")
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x and w must be 2-D, got x.dim()={x.dim()}, w.dim()={w.dim()}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"K mismatch: x is {tuple(x.shape)}, w is {tuple(w.shape)} (w is (N, K))")
    if x.dtype != w.dtype:
        raise ValueError(f"dtype mismatch: x is {x.dtype}, w is {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"device mismatch: x on {x.device}, w on {w.device}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (row-major)")
    if not w.is_contiguous():
        raise ValueError("w must be contiguous (row-major, (N, K))")
    if x.shape[0] < 1 or w.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"M, N and K must be >= 1, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    name = dtype_name(x)
    if name == "fp8":
        for label, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s is None or not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
                raise ValueError(f"{label} must be a one-element float32 tensor for fp8 inputs")
    return name


def alloc_output(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Uninitialised (M, N) output of the right dtype for x @ w.T."""
    out_dtype = TORCH_DTYPES[OUT_DTYPE[dtype_name(x)]]
    return torch.empty((x.shape[0], w.shape[0]), dtype=out_dtype, device=x.device)


def launch_args(x: torch.Tensor, w: torch.Tensor, out, scale_a, scale_b):
    """(M, N, K, out, has_scale, sa, sb) shared by the launchers: the output is allocated
    if not given, and without fp8 scales the scale pointers are dummies (never read)."""
    M, K = x.shape
    N = w.shape[0]
    if out is None:
        out = alloc_output(x, w)
    has_scale = x.dtype == torch.float8_e4m3fn
    return M, N, K, out, has_scale, (scale_a if has_scale else x), (scale_b if has_scale else x)


def rel_diff(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius distance of y from ref (fp32 ref): how the ops' unsure mode tells a
    candidate that disagrees with the model's first choice."""
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


@contextlib.contextmanager
def no_tf32(device):
    """fp32 references compute in full fp32 on CUDA (TF32 matmuls off for the block), then the
    previous setting again; nothing to do elsewhere."""
    if torch.device(device).type != "cuda":
        yield
        return
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
