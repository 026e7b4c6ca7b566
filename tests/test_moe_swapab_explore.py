"""Interpreter correctness of the swap-AB MoE exploration kernel (benchmarks/explore/moe_swapab.py):
the swapped tile (weight rows x sorted pairs), its K split through fp32 atomics, padding slots,
experts without pairs, top_k 1 (down writes y directly without a split), odd N and K, against
the fp32 reference (fp16/fp32: the interpreter computes garbage for bf16/fp8 dots)."""
import pytest
import torch

from gemm_costmodel.kernels.moe import impl as I
from gemm_costmodel.kernels.moe import space as S

import moe_swapab as SW

# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
CONFIGS = [(16, 32, 32, 1, 4, 3), (16, 64, 16, 2, 4, 3), (32, 32, 32, 3, 4, 3)]


def _err(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def _check(problem, seed=0, ids=None):
    ops = I.make_operands(problem, "cpu", torch.Generator().manual_seed(seed))
    if ids is not None:
        ops.topk_ids = ids
    ref = I.reference(ops)
    assert ref.abs().mean() > 0.05
    for c in CONFIGS:
        ops.out.fill_(float("nan"))
        y = SW.launch_swap(c, ops.stage, ops.x, ops.w, ops.topk_weights, ops.topk_ids, ops.out)
        assert y is ops.out
        assert _err(y, ref) <= I.ERROR_BOUNDS[problem.dtype], (SW.swap_id(c), _err(y, ref))


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 40, 72), ("down", 72, 40)])
def test_swapab_equals_reference(stage, n, k, dtype):
    """N and K off the tiles (K tail masked, a split of 3 over 3 K tiles); 17 tokens on 8 experts."""
    _check(S.Problem(17, n, k, dtype, 8, 2, stage), seed=3)


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 64), ("down", 48, 64)])
def test_swapab_one_token_empty_experts_and_top1(stage, n, k):
    _check(S.Problem(1, n, k, "fp32", 8, 2, stage), seed=5)  # 6 of 8 experts empty
    _check(S.Problem(3, n, k, "fp32", 8, 1, stage), seed=6)  # down, top_k 1: y directly (no split)


def test_swapab_skewed_many_experts():
    _check(S.Problem(40, 48, 32, "fp16", 64, 4, "gate_up", "zipf"), seed=7)


def test_swapab_ids_and_configs():
    assert SW.swap_id((16, 64, 128, 2, 4, 3)) == "moeswap_m16n64k128_s2_w4s3"
    assert len(set(map(SW.swap_id, SW.SWAP_CONFIGS))) == len(SW.SWAP_CONFIGS) == 42
