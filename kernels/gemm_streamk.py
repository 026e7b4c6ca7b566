"""Stream-K GEMM over TMA descriptors (exploration; not in the config space yet).

Why: on prefill shapes with few output tiles (M=1024, N=2304: 72 tiles of
128x256 on 132 SMs) the persistent kernel leaves SMs idle, and cuBLAS is up to
1.5x faster there (benchmarks/results/foundation/). Stream-K gives every
program an equal share of the (tile, K-iteration) space instead of whole
tiles, so all SMs work until the end; a tile split between programs is summed
in an fp32 workspace and written by the last contributor to arrive.

Same layout and contract as kernels/gemm.py: y = x @ w.T, x (M, K), w (N, K),
row-major, 16-byte aligned rows (TMA). The workspace and the per-tile arrival
counters are left zeroed by every launch, so the kernel is CUDA-graph safe
while one stream uses them at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .gemm import _arrival_counters, _device_index, _grouped_tile, launch_args, num_sms, zeroed_buffer


@dataclass(frozen=True)
class StreamKConfig:
    """One stream-K candidate; ``programs_per_sm`` scales the grid (1 = one program per SM).

    Not a subclass of PersistentConfig, though the fields match: gemm.launch would
    take it for one and run the persistent kernel instead.
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1
    variant = "streamk"

    @property
    def id(self) -> str:
        return (f"streamk_m{self.block_m}n{self.block_n}k{self.block_k}_g{self.group_m}"
                f"_p{self.programs_per_sm}_w{self.num_warps}s{self.num_stages}")


@triton.jit(do_not_specialize=["M"])
def gemm_streamk_kernel(x_desc, w_desc, y_ptr, ws_ptr, cnt_ptr, sa_ptr, sb_ptr, M, N, K, stride_ym,
                        HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr):
    """Program p owns iterations [p*T//P, (p+1)*T//P) of the T = tiles x k_tiles space."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # int64: tiles x k_tiles x programs overflows int32 on the largest shapes.
    total = num_pid_m.to(tl.int64) * num_pid_n * k_tiles
    start = pid * total // NUM_PROGRAMS
    end = (pid + 1) * total // NUM_PROGRAMS
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)
    it = start
    while it < end:
        tile = (it // k_tiles).to(tl.int32)
        k0 = (it % k_tiles).to(tl.int32)
        k1 = tl.minimum(k_tiles, (k0 + (end - it)).to(tl.int32))
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # TMA zero-fills out-of-bounds boxes, so the K tail needs no mask.
        for kt in range(k0, k1):
            a = x_desc.load([off_m, kt * BLOCK_K])
            b = w_desc.load([off_n, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        if (k0 == 0) & (k1 == k_tiles):
            tl.store(y_ptrs, (acc * scale).to(y_ptr.dtype.element_ty), mask=mask)
        else:
            # Programs whose ranges meet this tile: the owner of iteration x is
            # ((x + 1) * P - 1) // T, for the tile's first and last iteration.
            first_it = tile.to(tl.int64) * k_tiles
            first = ((first_it + 1) * NUM_PROGRAMS - 1) // total
            last = ((first_it + k_tiles) * NUM_PROGRAMS - 1) // total
            ws_tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.atomic_add(ws_tile, acc, mask=mask, sem="relaxed", scope="gpu")
            # Every thread's partial precedes the release of the arrival count.
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == (last - first).to(tl.int32):
                tl.debug_barrier()
                out = tl.load(ws_tile, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptrs, (out * scale).to(y_ptr.dtype.element_ty), mask=mask)
                tl.store(ws_tile, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
        it += k1 - k0


def _zeroed_workspace(device: torch.device, n: int) -> torch.Tensor:
    """fp32 partial sums of split tiles; the kernel leaves it zeroed (see module doc)."""
    return zeroed_buffer("streamk_workspace", device, n, torch.float32, 1 << 20)


def feasible(cfg: StreamKConfig, k: int, in_bytes: int) -> tuple[bool, str]:
    """TMA loads need 16-byte aligned rows of x and w (K) and boxes of at most 256 (y is
    stored through pointers, so M and N are free)."""
    if (k * in_bytes) % 16:
        return False, "K * element size must be a multiple of 16 bytes (TMA)"
    if max(cfg.block_m, cfg.block_n, cfg.block_k) > 256:
        return False, "TMA box dims are at most 256"
    return True, ""


def launch(cfg: StreamKConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
    """Run a stream-K candidate for y = x @ w.T (times scale_a * scale_b for fp8). Returns y."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    total = tiles * triton.cdiv(K, cfg.block_k)
    programs = max(1, min(num_sms(_device_index(x)) * cfg.programs_per_sm, total))
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    gemm_streamk_kernel[(programs,)](
        x_desc, w_desc, out, _zeroed_workspace(x.device, M * N), _arrival_counters(x.device, tiles),
        sa, sb, M, N, K, out.stride(0), HAS_SCALE=has_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return out
