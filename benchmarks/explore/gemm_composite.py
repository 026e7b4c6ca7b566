"""Persistent TMA GEMM with composite output tiles (exploration; not in the config space;
a record outside the installed package, timed by benchmarks/explore/explore_hopper.py --mode composite).

Why: on small-N prefill shapes the persistent kernel's power-of-two tiles
leave SMs idle or add a thin last wave (M=1024, N=2304: 72 tiles of 128x256 or
144 of 128x128 on 132 SMs), while cuBLAS picks tile widths such as 144 or 192
(`nvjet_sm90_tst_144x128_...`, benchmarks/results/vendor/) that make the tile
count land just under a multiple of the SM count, and runs those shapes at
~700 TFLOP/s. Triton's block shapes must be powers of two, so a tile of
BLOCK_N = BN0 + BN1 columns (128 + 16 = 144, 128 + 64 = 192, 256 + 64 = 320)
is built from two accumulators: per K step the x tile is loaded once and
multiplied with two w tiles (two descriptors), and the epilogue makes two TMA
stores. wgmma supports any N multiple of 8 up to 256, so both dots map to it.

Same layout and contract as kernels/gemm.py: y = x @ w.T, x (M, K), w (N, K),
row-major, 16-byte aligned rows (TMA zero-fills out-of-range loads and clips
out-of-range stores, so partial tiles need no masks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.common import _device_index, _grouped_tile, launch_args, num_sms
from gemm_costmodel.kernels.gemm.kernel import PERSISTENT_FLATTEN


@dataclass(frozen=True)
class CompositeConfig:
    """A persistent candidate whose tile is BLOCK_M x (BN0 + BN1)."""

    block_m: int
    bn0: int
    bn1: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    @property
    def block_n(self) -> int:
        return self.bn0 + self.bn1

    @property
    def id(self) -> str:
        return (f"composite_m{self.block_m}n{self.bn0}+{self.bn1}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")

    def smem_bytes(self, elem: int, out_elem: int) -> int:
        """Pipelined x and w tiles plus the two store tiles."""
        return (self.num_stages * (self.block_m + self.block_n) * self.block_k * elem
                + self.block_m * self.block_n * out_elem)


@triton.jit(do_not_specialize=["M"])
def gemm_composite_kernel(x_desc, w0_desc, w1_desc, y0_desc, y1_desc, sa_ptr, sb_ptr, M, N, K,
                          HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BN0: tl.constexpr,
                          BN1: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr):
    """Persistent tile loop over (BLOCK_M, BN0 + BN1) tiles, two accumulators per tile."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BN0 + BN1)
    k_tiles = tl.cdiv(K, BLOCK_K)
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * (BN0 + BN1)
        acc0 = tl.zeros((BLOCK_M, BN0), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, BN1), dtype=tl.float32)
        for kt in range(k_tiles):
            a = x_desc.load([off_m, kt * BLOCK_K])
            b0 = w0_desc.load([off_n, kt * BLOCK_K])
            b1 = w1_desc.load([off_n + BN0, kt * BLOCK_K])
            acc0 = tl.dot(a, b0.T, acc0)
            acc1 = tl.dot(a, b1.T, acc1)
        if HAS_SCALE:
            acc0 = acc0 * scale
            acc1 = acc1 * scale
        y0_desc.store([off_m, off_n], acc0.to(y0_desc.dtype))
        y1_desc.store([off_m, off_n + BN0], acc1.to(y1_desc.dtype))


def launch(cfg: CompositeConfig, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
           programs: int | None = None) -> torch.Tensor:
    """Run a composite-tile candidate for y = x @ w.T (times scale_a * scale_b for fp8)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, N, K, out, has_scale, sa, sb = launch_args(x, w, out, scale_a, scale_b)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = min(programs or num_sms(_device_index(x)), tiles)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w0 = TensorDescriptor.from_tensor(w, [cfg.bn0, cfg.block_k])
    w1 = TensorDescriptor.from_tensor(w, [cfg.bn1, cfg.block_k])
    y0 = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.bn0])
    y1 = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.bn1])
    gemm_composite_kernel[(programs,)](
        x_desc, w0, w1, y0, y1, sa, sb, M, N, K, HAS_SCALE=has_scale, BLOCK_M=cfg.block_m,
        BN0=cfg.bn0, BN1=cfg.bn1, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_PROGRAMS=programs,
        FLATTEN=PERSISTENT_FLATTEN, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
