"""benchmarks/kernel_variants.py: a committed kernel recompiled with N, K and strides constant
computes what the committed one does (CPU interpreter, fp16), and a stale argument list is an error."""
import pytest
import torch
import triton

from gemm_costmodel.benchmarks.kernel_variants import constexpr_copy
from gemm_costmodel.kernels.gemm import kernel as gemm

RUNTIME = "M, N, K, stride_xm, stride_wn, stride_ym,"
CONST = ("M, N: tl.constexpr, K: tl.constexpr, stride_xm: tl.constexpr, stride_wn: tl.constexpr, "
         "stride_ym: tl.constexpr,")
IMPORTS = "from gemm_costmodel.kernels.common import _grouped_tile, _mainloop"


@pytest.mark.parametrize("m,n,k", [(7, 96, 256), (1, 40, 128), (33, 64, 200)])
def test_constexpr_copy_of_the_tiled_kernel_matches_the_reference(m, n, k):
    kern = constexpr_copy(gemm.gemm_tiled_kernel, RUNTIME, CONST, IMPORTS)
    g = torch.Generator().manual_seed(m * 1000 + k)
    x = torch.randn(m, k, generator=g).to(torch.float16)
    w = torch.randn(n, k, generator=g).to(torch.float16)
    out = torch.full((m, n), float("nan"), dtype=torch.float16)
    bm, bn, bk = 16, 32, 64
    M, N, K, out, has_scale, sa, sb = gemm.launch_args(x, w, out, None, None)
    kern[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        x, w, out, sa, sb, M, N, K, x.stride(0), w.stride(0), out.stride(0), HAS_SCALE=has_scale,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=K % bk == 0, num_warps=4, num_stages=2)
    ref = x.float() @ w.float().t()
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3


def test_constexpr_copy_names_the_kernel_when_the_signature_moved():
    with pytest.raises(ValueError, match="gemm_tiled_kernel: 'M, N, K, EM,' occurs 0 times"):
        constexpr_copy(gemm.gemm_tiled_kernel, "M, N, K, EM,", "x")
