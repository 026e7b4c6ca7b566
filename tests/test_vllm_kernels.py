"""vLLM 0.33.0's own Triton kernels (compiled from its source, gemm_costmodel.kernels.moe.vllm_kernels)
launched by our mirror of its host code, in the CPU interpreter (fp16/fp32: the interpreter
computes garbage for bf16/fp8 dots), against the project's references: the fused-MoE layer on the
sorted path, the per-pair path (M * top_k * 4 <= E) and the swapped-operand path, and the block-fp8
linear. Skipped, saying how to supply one, without a vLLM source (COSTMODEL_VLLM_SRC or an
installed vllm)."""
from __future__ import annotations

import pytest
import torch

from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.kernels.moe import vllm_kernels as VK
from gemm_costmodel.kernels.vllm import source

SRC, WHY = source.find_source()
pytestmark = pytest.mark.skipif(SRC is None, reason=WHY or "no vLLM source")


@pytest.fixture(scope="module")
def mod():
    return VK.compile_kernels(SRC)


def _layer(m, e, n, hidden, top_k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hidden, generator=g).to(dtype)
    w1 = (torch.randn(e, 2 * n, hidden, generator=g) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(e, hidden, n, generator=g) / n ** 0.5).to(dtype)
    tw, ids = impl.route(torch.randn(m, e, generator=g), top_k)
    return x, w1, w2, tw, ids


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, e, top_k", [(20, 4, 2),   # sorted path (align)
                                        (1, 8, 2)])   # per-pair path: 1 * 2 * 4 <= 8
def test_vllm_fused_moe_kernel_via_our_launch_matches_the_reference(mod, dtype, m, e, top_k):
    x, w1, w2, tw, ids = _layer(m, e, 48, 64, top_k, dtype)
    y = VK.fused_experts(mod, x, w1, w2, tw, ids, CFG)
    ref = impl.moe_reference(x, w1, w2, tw, ids)
    assert y.shape == ref.shape and _rel(y, ref) < impl.ERROR_BOUNDS["fp16" if dtype == torch.float16 else "fp32"]


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("m, e", [(20, 4), (1, 8)])
def test_the_fp8_paths_of_vllms_kernel(mod, swap, m, e):
    """vLLM's per-tensor fp8 code (scales, and on Hopper the swapped operands for BLOCK_SIZE_M < 64,
    BLOCK_SIZE_N >= 64) on fp32 operands (the interpreter's dots are exact only there): the
    gate_up GEMM of each pair, times a_scale * w_scale[e]."""
    x, w1, _, tw, ids = _layer(m, e, 48, 64, 2, torch.float32)
    a_scale, w_scale = torch.tensor([0.5]), torch.rand(e) + 0.5
    cfg = dict(CFG, BLOCK_SIZE_N=64)
    sorted_ids, expert_ids, ntpp = VK.expert_assignment(ids, cfg["BLOCK_SIZE_M"], e)
    c = torch.zeros(m, 2, w1.shape[1])
    VK.invoke_fused_moe(mod, x, w1, c, a_scale, w_scale, tw, sorted_ids, expert_ids, ntpp, False, 2, cfg,
                        VK._tl_dtype(torch.float32), True, swap_ab=swap)
    ref = torch.stack([torch.stack([x[t] @ w1[ids[t, j]].T * a_scale[0] * w_scale[ids[t, j]] for j in range(2)])
                       for t in range(m)])
    assert _rel(c, ref) < 1e-5


def test_host_rules_are_vllms():
    assert VK.naive_assignment(1, 2, 8) and not VK.naive_assignment(2, 2, 8)
    assert VK.enable_swap_ab(16, 64, (9, 0)) and VK.enable_swap_ab(32, 128, (9, 0))
    assert not VK.enable_swap_ab(64, 64, (9, 0)) and not VK.enable_swap_ab(16, 32, (9, 0))
    assert not VK.enable_swap_ab(16, 64, (10, 0)) and not VK.enable_swap_ab(16, 64, None)


def test_vllm_block_fp8_kernel_via_our_launch_matches_the_reference(mod):
    from gemm_costmodel.kernels.fp8_blockscale import impl as BI

    g = torch.Generator().manual_seed(1)
    m, n, k = 5, 192, 256
    a, as_ = BI.quantize_per_token_group(torch.randn(m, k, generator=g), dtype=torch.float32)
    b, bs = BI.quantize_weight_blocks(torch.randn(n, k, generator=g), dtype=torch.float32)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 2}
    y = VK.w8a8_block_fp8_matmul(mod, a, b, as_, bs, [128, 128], cfg, torch.float32)
    da, db = BI.dequantize(a, b, as_, bs)
    assert _rel(y, da @ db.T) < 1e-5


def test_the_generated_module_holds_only_the_kernels_and_their_helpers(mod):
    text = open(mod.__file__, encoding="utf-8").read()
    assert "def fused_moe_kernel(" in text and "def write_zeros_to_output(" in text
    assert "def _w8a8_triton_block_scaled_mm(" in text and "def invoke_fused_moe" not in text
