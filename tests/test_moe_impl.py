"""The fused-MoE op's implementation in the CPU interpreter (fp16/fp32: the interpreter computes
garbage for bf16/fp8 dots): align against its torch reference and a hand-computed case, both
stages and the whole layer against the fp32 reference, the vendor path (torch._grouped_mm runs
its fallback on CPU), operand checks, and the operand factory."""
import re

import numpy as np
import pytest
import torch

from gemm_costmodel.kernels.moe import impl as I
from gemm_costmodel.kernels.moe import routing as R
from gemm_costmodel.kernels.moe import space as S

CONFIGS = [S.MoeTiledConfig(16, 32, 32, 1, 4, 3), S.MoeTiledConfig(64, 64, 64, 16, 4, 3),
           S.MoeTiledConfig(16, 64, 64, 16, 4, 4), S.MoeTiledConfig(64, 32, 32, 1, 8, 2)]
# Swap-AB: one slice; two slices of a K that BLOCK_K 16 tiles evenly; three slices (fp32 atomics).
SWAP = [S.MoeSwapABConfig(16, 32, 32, 1, 4, 3), S.MoeSwapABConfig(16, 64, 16, 2, 4, 3),
        S.MoeSwapABConfig(32, 32, 32, 3, 4, 3)]


def _err(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def _ids(rows, dtype=torch.int32):
    return torch.tensor(rows, dtype=dtype)


def _random_ids(m, e, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)


def _operands(stage, m, n, k, e, top_k, dtype, ids=None, seed=0):
    """A stage's operands with chosen topk_ids (default: the problem's balanced routing)."""
    ops = I.make_operands(S.Problem(m, n, k, dtype, e, top_k, stage), "cpu", torch.Generator().manual_seed(seed))
    if ids is not None:
        ops.topk_ids = ids.contiguous()
    return ops


def _check_stage(ops, configs, dtype):
    assert I.check_operands(ops.stage, ops.x, ops.w, ops.topk_weights, ops.topk_ids, ops.a_scale,
                            ops.w_scale, ops.out) == ""
    ref = I.reference(ops)
    assert torch.isfinite(ref).all() and ref.abs().mean() > 0.05
    for cfg in configs:
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert y is ops.out and y.shape == ref.shape
        assert _err(y, ref) <= I.ERROR_BOUNDS[dtype], (cfg.id, _err(y, ref))


# -- align ------------------------------------------------------------------------------------

def test_align_hand_computed():
    """3 tokens, top_k 2, 4 experts, BLOCK_M 4: pairs 0..5 go to experts [0, 2, 1, 2, 2, 3]."""
    ids = _ids([[0, 2], [1, 2], [2, 3]])
    s = 6  # sentinel M * top_k
    want_sorted = [0, s, s, s, 2, s, s, s, 1, 3, 4, s, 5, s, s, s, s, s]  # 6 + 4 * 3 = 18 slots
    for fn in (I.align, I.align_reference):
        sorted_ids, expert_ids, ntpp = fn(ids, 4, 4)
        assert sorted_ids.dtype == expert_ids.dtype == ntpp.dtype == torch.int32
        assert sorted_ids.tolist() == want_sorted
        assert expert_ids.tolist() == [0, 1, 2, 3]
        assert ntpp.tolist() == [16]


def test_align_skips_experts_without_pairs():
    """Experts 0, 2 and 4 get nothing: no block; the tail past ntpp is the sentinel."""
    ids = _ids([[3, 1], [1, 3], [5, 1]])
    sorted_ids, expert_ids, ntpp = I.align(ids, 6, 2)
    # expert 1: pairs 1, 2, 5; expert 3: 0, 3; expert 5: 4
    assert ntpp.item() == 8
    assert sorted_ids[:8].tolist() == [1, 2, 5, 6, 0, 3, 4, 6]
    assert expert_ids[:4].tolist() == [1, 1, 3, 5]
    assert len(sorted_ids) == 6 + 6 * 1 and (sorted_ids[8:] == 6).all()


def _check_align_invariants(ids, e, block_m):
    sorted_ids, expert_ids, ntpp = I.align(ids, e, block_m)
    for got, want in zip((sorted_ids, expert_ids, ntpp), I.align_reference(ids, e, block_m)):
        assert torch.equal(got, want)
    flat = ids.reshape(-1).long()
    p = flat.numel()
    n = ntpp.item()
    assert n % block_m == 0 and len(sorted_ids) == I.max_padded_pairs(p, e, block_m) >= n
    live = sorted_ids[:n].long()
    real = live[live < p]
    assert sorted(real.tolist()) == list(range(p))  # every pair exactly once
    blocks = live.view(-1, block_m)
    for b, row in enumerate(blocks):
        row = row[row < p]
        assert len(row) > 0  # no block without pairs
        assert (flat[row] == expert_ids[b]).all()
        assert (row[1:] > row[:-1]).all()  # pair order within an expert
    assert (sorted_ids[n:] == p).all()


@pytest.mark.parametrize("m, e, top_k, block_m, routing", [
    (1, 8, 2, 16, "balanced"),        # decode: most experts empty
    (33, 8, 2, 16, "zipf"),
    (300, 4, 3, 64, "hot"),           # 900 pairs: several counting chunks
    (5, 512, 4, 16, "real0"),         # E = 512
    (7, 512, 8, 64, "balanced"),
    (4500, 16, 2, 32, "real1"),       # 9000 pairs: several steps per chunk
    (300, 512, 8, 16, "zipf"),        # 19 chunks of 512 experts: the scan takes two row tiles
])
def test_align_equals_reference(m, e, top_k, block_m, routing):
    ids = torch.from_numpy(R.topk_ids(routing, m, e, top_k))
    _check_align_invariants(ids, e, block_m)


def test_align_skewed_and_int64():
    _check_align_invariants(torch.zeros((200, 1), dtype=torch.int64), 8, 16)  # every token on expert 0
    _check_align_invariants(_ids([[7, 6]] * 150), 8, 64)
    _check_align_invariants(_random_ids(50, 5, 5, 1).long(), 5, 16)  # top_k == E


def test_align_is_repeatable():
    """The arrival counter is reset: back-to-back calls (as in a replayed graph) agree."""
    ids = torch.from_numpy(R.topk_ids("zipf", 400, 64, 6))
    first = I.align(ids, 64, 16)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, I.align(ids, 64, 16)))


# -- the stages -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 40, 72), ("down", 72, 40)])
def test_stage_equals_reference(stage, n, k, dtype):
    """N and K not multiples of the tiles; 17 tokens on 8 experts."""
    ops = _operands(stage, 17, n, k, 8, 2, dtype, seed=3)
    _check_stage(ops, CONFIGS + SWAP, dtype)


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 32, 64), ("down", 64, 32)])
def test_stage_even_tiles_and_skew(stage, n, k):
    """K a multiple of BLOCK_K (unmasked K loop); a skewed routing."""
    ops = I.make_operands(S.Problem(40, n, k, "fp16", 16, 4, stage, "hot"), "cpu", torch.Generator().manual_seed(4))
    _check_stage(ops, CONFIGS[:2], "fp16")


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 40), ("down", 40, 24)])
def test_all_tokens_on_one_expert(stage, n, k):
    ids = torch.zeros((70, 1), dtype=torch.int32)
    ops = _operands(stage, 70, n, k, 4, 1, "fp32", ids=ids)
    _check_stage(ops, CONFIGS[:2], "fp32")
    ids2 = _ids([[3, 1]] * 70)
    ops = _operands(stage, 70, n, k, 4, 2, "fp32", ids=ids2)
    _check_stage(ops, CONFIGS[:2], "fp32")


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 40), ("down", 40, 24)])
def test_one_token_and_empty_experts(stage, n, k):
    ops = _operands(stage, 1, n, k, 8, 2, "fp16", seed=5)  # 6 of 8 experts empty
    _check_stage(ops, CONFIGS[:2], "fp16")
    ops = _operands(stage, 3, n, k, 8, 1, "fp32", seed=6)  # top_k 1: down writes y directly
    _check_stage(ops, CONFIGS[:2], "fp32")


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 64), ("down", 48, 64)])
def test_swapab_one_token_empty_experts_top1_and_skew(stage, n, k):
    """Swap-AB (split or not) where most pair blocks are padding, where down writes y directly
    (top_k 1, one slice) or sums fp32 slices first (top_k 1, split), and under zipf routing."""
    _check_stage(_operands(stage, 1, n, k, 8, 2, "fp32", seed=5), SWAP, "fp32")  # 6 of 8 experts empty
    _check_stage(_operands(stage, 3, n, k, 8, 1, "fp32", seed=6), SWAP, "fp32")
    ops = I.make_operands(S.Problem(40, n, k, "fp16", 64, 4, stage, "zipf"), "cpu", torch.Generator().manual_seed(7))
    _check_stage(ops, SWAP, "fp16")


# The GEMV has no tl.dot, so the interpreter computes bf16 correctly too.
GEMV = [S.MoeGemvConfig(1, 256, 4), S.MoeGemvConfig(4, 256, 8), S.MoeGemvConfig(8, 512, 8)]


# bf16 (the op's dtype) in the main suite; fp32 and fp16 run the same code paths and take the
# interpreter 10-25 s each, so they run after it (.ci/run).
@pytest.mark.parametrize("dtype", [pytest.param("fp32", marks=pytest.mark.slow),
                                   pytest.param("fp16", marks=pytest.mark.slow), "bf16"])
@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 40, 300), ("down", 72, 40)])
def test_gemv_equals_reference(stage, n, k, dtype):
    """K below and above the K tile (masked tails), N not a multiple of the column block; M = 1
    with 6 of 8 experts empty, top_k 1, 64 experts at M = 4, and M = 7 (outside the space's rule,
    still correct)."""
    for m, e, top_k, seed in ((1, 8, 2, 5), (3, 8, 1, 6), (4, 64, 6, 7), (7, 16, 4, 8)):
        _check_stage(_operands(stage, m, n, k, e, top_k, dtype, seed=seed), GEMV, dtype)


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 512), ("down", 48, 256)])
def test_gemv_even_k_skew_and_512_experts(stage, n, k):
    ops = I.make_operands(S.Problem(4, n, k, "fp16", 64, 4, stage, "zipf"), "cpu", torch.Generator().manual_seed(7))
    _check_stage(ops, GEMV, "fp16")
    ops = I.make_operands(S.Problem(2, n, k, "fp32", 512, 8, stage, "zipf"), "cpu", torch.Generator().manual_seed(9))
    _check_stage(ops, GEMV[:2], "fp32")


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 300), ("down", 40, 300)])
def test_gemv_fp8_scales_and_inline_quantisation(stage, n, k):
    """fp8 weights with per-expert scales; gate_up takes fp8 activations, down bf16 ones that it
    quantises as it loads them. The activations sit on the fp8 grid times the scale, so the
    interpreter's fp8 rounding (not the GPU's round-to-nearest-even) cannot differ from
    quantize_fp8's: the result matches the reference to fp32 rounding."""
    ops = I.make_operands(S.Problem(3, n, k, "fp8", 8, 2, stage), "cpu", torch.Generator().manual_seed(11))
    if stage == "down":
        assert ops.x.dtype == torch.bfloat16
        grid = I.quantize_fp8_reference(ops.x, ops.a_scale).float()
        ops.x = (grid * ops.a_scale).to(torch.bfloat16)
        assert torch.equal(I.quantize_fp8_reference(ops.x, ops.a_scale).float(), grid)
    ref = I.reference(ops)
    for cfg in GEMV[:2]:
        ops.out.fill_(float("nan"))
        assert _err(ops.run(cfg), ref) < 5e-3, cfg.id  # the bf16 output's rounding


def test_gemv_routing_weights_and_repeat_calls():
    """down weights each pair inside the GEMV; a second call gives the same result (no scratch)."""
    ops = _operands("down", 5, 24, 16, 4, 2, "fp32", seed=8)
    y0 = ops.run(GEMV[1]).clone()
    assert torch.equal(ops.run(GEMV[1]), y0)
    ops.topk_weights[2] *= 2
    y1 = ops.run(GEMV[1])
    torch.testing.assert_close(y1[2], 2 * y0[2])
    torch.testing.assert_close(y1[[0, 1, 3, 4]], y0[[0, 1, 3, 4]])


def test_swapab_split_sums_slices_and_rejects_foreign_configs():
    """The split's fp32 buffer is zeroed per call: a second call gives the same result, not twice it."""
    ops = _operands("down", 5, 40, 48, 4, 2, "fp32", seed=8)
    first = ops.run(SWAP[2]).clone()
    assert torch.equal(ops.run(SWAP[2]), first) or _err(ops.out, first) < 1e-6
    with pytest.raises(ValueError, match="not a moe config"):
        I.launch(object(), "down", ops.x, ops.w, ops.topk_weights, ops.topk_ids, ops.out)


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 16, 24), ("down", 24, 16)])
def test_512_experts(stage, n, k):
    ops = I.make_operands(S.Problem(6, n, k, "fp32", 512, 8, stage, "zipf"), "cpu", torch.Generator().manual_seed(7))
    _check_stage(ops, [CONFIGS[0], CONFIGS[3], SWAP[1]], "fp32")


def test_routing_weights_matter():
    """The down stage weights each pair: doubling one token's weights doubles its row."""
    ops = _operands("down", 5, 24, 16, 4, 2, "fp32", seed=8)
    y0 = ops.run(CONFIGS[0]).clone()
    ops.topk_weights[2] *= 2
    y1 = ops.run(CONFIGS[0])
    torch.testing.assert_close(y1[2], 2 * y0[2])
    torch.testing.assert_close(y1[[0, 1, 3, 4]], y0[[0, 1, 3, 4]])


# -- the vendor (torch._grouped_mm's CPU fallback) --------------------------------------------

def test_expert_permutation_helpers():
    ids = _ids([[0, 2], [1, 2], [2, 3]])
    order, offs = I.expert_permutation(ids, 5)
    assert order.tolist() == [0, 2, 1, 3, 4, 5]  # stable: pair order within an expert
    assert offs.dtype == torch.int32 and offs.tolist() == [1, 2, 5, 6, 6]
    inv = I.inverse_permutation(order)
    assert torch.equal(order[inv], torch.arange(6)) and torch.equal(inv[order], torch.arange(6))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 24, 40), ("down", 40, 24)])
def test_vendor_equals_reference(stage, n, k, dtype):
    ops = I.make_operands(S.Problem(9, n, k, dtype, 8, 3, stage, "zipf"), "cpu", torch.Generator().manual_seed(9))
    _check_stage(ops, [S.VENDOR], dtype)


def test_vendor_refuses_fp8():
    ops = _operands("gate_up", 3, 32, 32, 4, 2, "fp8")
    with pytest.raises(ValueError, match="no fp8 path"):
        ops.run(S.VENDOR)


# -- the layer --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_fused_moe_equals_reference(dtype):
    g = torch.Generator().manual_seed(11)
    m, hidden, inter, e, top_k = 13, 40, 24, 6, 2
    dt = I.TORCH_DTYPES[dtype]
    x = torch.randn((m, hidden), generator=g).to(dt)
    w1, _ = I.random_weights(e, 2 * inter, hidden, dtype, "cpu", g)
    w2, _ = I.random_weights(e, hidden, inter, dtype, "cpu", g)
    tw, ids = I.route(torch.randn((m, e), generator=g), top_k)
    assert ids.dtype == torch.int32 and tw.dtype == torch.float32
    torch.testing.assert_close(tw.sum(1), torch.ones(m))
    ref = I.moe_reference(x, w1, w2, tw, ids)
    out = torch.full((m, hidden), float("nan"), dtype=dt)
    y = I.fused_moe(x, w1, w2, tw, ids, CONFIGS[0], CONFIGS[1], out=out)
    assert y is out and _err(y, ref) <= I.ERROR_BOUNDS[dtype]
    # against a dense per-token loop (independent of the references' grouping)
    dense = torch.zeros((m, hidden))
    for t in range(m):
        for j in range(top_k):
            h = x[t].float() @ w1[ids[t, j]].float().T
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            dense[t] += tw[t, j] * (a @ w2[ids[t, j]].float().T)
    assert _err(ref, dense) < 1e-3


def test_route():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 3.5]])
    w, ids = I.route(logits, 2)
    assert ids.tolist() == [[1, 2], [3, 0]]
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(w[0], p[0, [1, 2]] / p[0, [1, 2]].sum())
    w_raw, _ = I.route(logits, 2, renormalize=False)
    torch.testing.assert_close(w_raw[1], p[1, [3, 0]])
    with pytest.raises(ValueError, match="top_k must be an int in 1..E = 4"):
        I.route(logits, 5)


# -- operand checks ---------------------------------------------------------------------------

def _layer(dtype=torch.float16, m=4, hidden=16, inter=8, e=4, top_k=2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((m, hidden), generator=g).to(dtype)
    w1 = torch.randn((e, 2 * inter, hidden), generator=g).to(dtype)
    w2 = torch.randn((e, hidden, inter), generator=g).to(dtype)
    tw, ids = I.route(torch.randn((m, e), generator=g), top_k)
    return x, w1, w2, tw, ids


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(x=a["x"].float()), "x must have w's dtype"),
    (lambda a: a.update(w=a["w"].to(torch.int8)), "w must be one of"),
    (lambda a: a.update(w=a["w"][0]), r"w must be 3-D \(E, N, K\)"),
    (lambda a: a.update(x=a["x"][:, :10].contiguous()), "x must have K = 16 columns"),
    (lambda a: a.update(x=a["x"][:3]), "x must have M = topk_ids rows = 4 rows"),
    (lambda a: a.update(topk_ids=a["topk_ids"].float()), "topk_ids must be a 2-D"),
    (lambda a: a.update(topk_weights=a["topk_weights"].half()), "topk_weights must be float32"),
    (lambda a: a.update(topk_ids=torch.zeros((4, 5), dtype=torch.int32),
                        topk_weights=torch.ones((4, 5))), r"topk_ids: top_k must be in 1..E = 4, got 5"),
    (lambda a: a.update(w=a["w"][:, :15].contiguous()), "w must have an even N"),
    (lambda a: a.update(x=a["x"].t()), "x must be contiguous"),
    (lambda a: a.update(a_scale=torch.ones(1)), "a_scale is only for fp8 weights"),
    (lambda a: a.update(out=torch.empty((8, 7), dtype=torch.float16)), r"out must be torch.float16 of shape \(8, 8\)"),
])
def test_check_operands_names_the_argument(change, match):
    x, w1, _, tw, ids = _layer()
    args = dict(x=x, w=w1, topk_weights=tw, topk_ids=ids, a_scale=None, w_scale=None, out=None)
    assert I.check_operands("gate_up", **args) == ""
    change(args)
    msg = I.check_operands("gate_up", **args)
    assert msg and re.search(match, msg), msg


def test_check_operands_fp8_and_down():
    x, w1, w2, tw, ids = _layer()
    w8, x8, one = w1.to(torch.float8_e4m3fn), x.to(torch.float8_e4m3fn), torch.ones(1)
    assert "a_scale must be a float32 tensor of shape (1,)" in I.check_operands("gate_up", x8, w8, tw, ids)
    assert I.check_operands("gate_up", x8, w8, tw, ids, one, torch.ones(4)) == ""
    assert I.check_operands("gate_up", x.to(torch.bfloat16), w8, tw, ids, one, torch.ones(4)) == ""
    assert "w_scale must be a float32 tensor of shape (4,)" in I.check_operands(
        "gate_up", x8, w8, tw, ids, one, torch.ones(3))
    assert "x must be float8_e4m3fn or bfloat16" in I.check_operands("gate_up", x, w8, tw, ids, one, torch.ones(4))
    h = torch.randn((8, 8), dtype=torch.float16)
    assert I.check_operands("down", h, w2, tw, ids) == ""
    assert "x must have M * top_k = 8 rows" in I.check_operands("down", h[:4], w2, tw, ids)
    assert "stage must be one of" in I.check_operands("up", h, w2, tw, ids)


def test_fused_moe_raises_naming_the_argument():
    x, w1, w2, tw, ids = _layer()
    cfg = CONFIGS[0]
    with pytest.raises(ValueError, match="w2 must have shape"):
        I.fused_moe(x, w1, w2[:, :, :4].contiguous(), tw, ids, cfg, cfg)
    with pytest.raises(ValueError, match="w2 must have w1's dtype"):
        I.fused_moe(x, w1, w2.float(), tw, ids, cfg, cfg)
    with pytest.raises(ValueError, match="x must have w1's dtype"):
        I.fused_moe(x.float(), w1, w2, tw, ids, cfg, cfg)
    with pytest.raises(ValueError, match="topk_ids: top_k must be in 1..E = 1, got 2"):
        I.fused_moe(x, w1[:1].contiguous(), w2[:1].contiguous(), tw, ids, cfg, cfg)
    with pytest.raises(ValueError, match="a1_scale is only for fp8"):
        I.fused_moe(x, w1, w2, tw, ids, cfg, cfg, a1_scale=torch.ones(1))
    with pytest.raises(ValueError, match="out must be a contiguous"):
        I.fused_moe(x, w1, w2, tw, ids, cfg, cfg, out=torch.empty((4, 15), dtype=torch.float16))
    # fp8 weights: a bf16 x may come without a1_scale (dynamic), but w1_scale is required
    w18, w28 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    xb = x.to(torch.bfloat16)
    assert I.check_layer(xb, w18, w28, tw, ids, torch.ones(4), torch.ones(4)) == ""
    with pytest.raises(ValueError, match="w1_scale must be a float32 tensor of shape"):
        I.fused_moe(xb, w18, w28, tw, ids, cfg, cfg)
    with pytest.raises(ValueError, match="a1_scale must be a float32"):
        I.fused_moe(x.to(torch.float8_e4m3fn), w18, w28, tw, ids, cfg, cfg, w1_scale=torch.ones(4),
                    w2_scale=torch.ones(4))
    with pytest.raises(ValueError, match="top_k must be in 1..e"):
        S.Problem(4, 16, 16, "fp16", 4, 5, "gate_up")


# -- operands, quantisation -------------------------------------------------------------------

def test_make_operands_fp8_layout():
    p = S.Problem(5, 64, 48, "fp8", 8, 2, "gate_up", "zipf")
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(0))
    assert ops.x.dtype == ops.w.dtype == torch.float8_e4m3fn and ops.out.dtype == torch.bfloat16
    assert ops.x.shape == (5, 48) and ops.w.shape == (8, 64, 48) and ops.out.shape == (10, 32)
    assert ops.a_scale.shape == (1,) and ops.w_scale.shape == (8,) and (ops.w_scale > 0).all()
    # every expert's largest |w| maps to 448 under its own scale
    assert (ops.w.float().abs().amax(dim=(1, 2)) == 448).all()
    assert np.array_equal(ops.topk_ids.numpy(), R.topk_ids("zipf", 5, 8, 2))
    assert ops.topk_ids.dtype == torch.int32
    assert (ops.topk_weights > 0).all()
    torch.testing.assert_close(ops.topk_weights.sum(1), torch.ones(5))
    assert ops.nbytes == 5 * 48 + 8 * 64 * 48 + 10 * 4 + 10 * 4 + 10 * 32 * 2 + 4 + 8 * 4
    ref = I.reference(ops)
    assert ref.shape == (10, 32) and torch.isfinite(ref).all() and 0.05 < ref.abs().mean() < 5
    down = I.make_operands(S.Problem(5, 48, 32, "fp8", 8, 2, "down"), "cpu", torch.Generator().manual_seed(0))
    assert down.x.dtype == torch.bfloat16 and down.x.shape == (10, 32) and down.out.shape == (5, 48)
    torch.testing.assert_close(down.a_scale, down.x.float().abs().amax().reshape(1) / 448)


def test_random_weights_in_chunks(monkeypatch):
    """A few experts at a time: same layout and per-expert scales as one piece, never zero."""
    monkeypatch.setattr(I, "_GEN_ELEMS", 100)
    w, s = I.random_weights(5, 8, 12, "fp8", "cpu", torch.Generator().manual_seed(0))
    assert w.shape == (5, 8, 12) and s.shape == (5,)
    assert (w.float().abs().amax(dim=(1, 2)) == 448).all()
    w16, none = I.random_weights(5, 8, 12, "fp16", "cpu", torch.Generator().manual_seed(0))
    assert none is None and w16.dtype == torch.float16 and (w16 != 0).float().mean() > 0.99
    assert 0.5 < (w16.float().std() * 12 ** 0.5).item() < 1.5


def test_quantize_fp8_exact_values_and_saturation():
    """Values exactly on the fp8 grid times the scale come back exact; beyond 448 saturate.
    (The interpreter's fp8 rounding of other values is not the GPU's round-to-nearest-even.)"""
    grid = torch.tensor([0.0, 1.0, -1.5, 2.75, 448.0, -448.0, 0.015625, 96.0, -13.0])
    scale = torch.tensor([0.25])
    x = torch.cat([grid * 0.25, torch.tensor([200.0, -1e4])]).reshape(1, -1)
    q = I.quantize_fp8(x, scale)
    assert q.dtype == torch.float8_e4m3fn
    assert q.float().reshape(-1).tolist() == grid.tolist() + [448.0, -448.0]
    assert torch.equal(q.float(), I.quantize_fp8_reference(x, scale).float())


def test_timing_copies_span_twice_l2_of_the_experts_a_launch_reads_without_new_weights():
    g = torch.Generator().manual_seed(0)
    prob = S.Problem(1, 256, 128, "fp16", 64, 4, "gate_up", "balanced")
    first = I.make_operands(prob, "cpu", g)
    # Experts 0-3 (balanced at M = 1): 4 x 256 x 128 x 2 B of weights + x and the output.
    per = 4 * 256 * 128 * 2 + 128 * 2 + 4 * 128 * 2
    assert I.bytes_read(first) == per
    from gemm_costmodel.kernels.timing import copies_for

    def copies(l2_bytes):  # as the harness asks (correctness.operand_sets)
        return I.timing_copies(first, copies_for(I.bytes_read(first), l2_bytes))

    sets = copies(5 * per)
    assert len(sets) == 10  # ceil(2 x 5 per / per)
    for j, s in enumerate(sets):
        assert s.w is first.w and s.x is first.x  # shared: no copy of the weights
        assert s.topk_ids.dtype == first.topk_ids.dtype
        assert s.topk_ids.tolist() == [[4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3]]
    # No more copies than distinct strides of experts (64 / 4), nor one when a launch spans 2x L2.
    assert len(copies(100 * per)) == 16
    assert len(copies(per // 4)) == 1


# -- block-scaled fp8 (fp8bs) -----------------------------------------------------------------
#
# The interpreter computes garbage for fp8 dots: the block-scale paths run on fp16 stand-ins with
# the same scale layout (block_operands' storage), as the dense block-fp8 op's CPU tests do. I = 72
# and K = 200 are not multiples of 128 (partial scale blocks, a 128-row block across gate and up).
BS_CONFIGS = [S.MoeTiledConfig(16, 32, 32, 1, 4, 3), S.MoeTiledConfig(32, 64, 64, 4, 4, 3),
              S.MoeSwapABConfig(16, 32, 64, 1, 4, 3), S.MoeSwapABConfig(16, 32, 32, 3, 4, 3),
              S.MoeGemvConfig(4, 256, 4)]


@pytest.mark.parametrize("stage, n, k", [("gate_up", 2 * 72, 200), ("down", 200, 72)])
# M = 7 takes the interpreter ~12 s per stage: after the main suite (.ci/run).
@pytest.mark.parametrize("m, e, top_k", [(1, 8, 2), pytest.param(7, 16, 4, marks=pytest.mark.slow)])
def test_block_scaled_stage_equals_reference(stage, n, k, m, e, top_k):
    """M = 1 (most experts empty) and 7; every variant's block-scale path; the down stage quantises
    its input per token group in the launch, the reference with the torch rule."""
    p = S.Problem(m, n, k, "fp8bs", e, top_k, stage)
    ops = I.block_operands(p, "cpu", torch.Generator().manual_seed(m + e), torch.float16)
    assert ops.w_scale.shape == (e, -(-n // 128), -(-k // 128))
    assert (ops.a_scale is None) == (stage == "down")
    _check_stage(ops, BS_CONFIGS, "fp16")


@pytest.mark.slow
def test_block_scaled_stage_m33_skewed():
    for stage, n, k in (("gate_up", 2 * 72, 200), ("down", 200, 72)):
        ops = I.block_operands(S.Problem(33, n, k, "fp8bs", 16, 4, stage, "zipf"), "cpu",
                               torch.Generator().manual_seed(3), torch.float16)
        _check_stage(ops, BS_CONFIGS[:3], "fp16")


def test_block_scales_matter_and_group_quantisation_is_the_torch_rule():
    """Scaling one weight block changes exactly the outputs it feeds; the in-launch per-token-group
    quantisation gives quantize_per_token_group's values and scales (fp16 target: exact)."""
    p = S.Problem(3, 2 * 72, 200, "fp8bs", 4, 2, "gate_up")
    ops = I.block_operands(p, "cpu", torch.Generator().manual_seed(0), torch.float16)
    y0 = I.reference(ops).clone()
    ops.w_scale[:, 0, 1] *= 2  # gate rows 0..71 and up rows 0..55 (block 0), K columns 128..199
    y1 = I.reference(ops)
    assert not torch.allclose(y0, y1)
    x = torch.randn((5, 300), generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, s = I.quantize_fp8_groups(x, torch.float16)
    q_ref, s_ref = I.quantize_per_token_group(x, 128, torch.float16)
    assert s.shape == (5, 3) and torch.equal(s, s_ref) and torch.equal(q, q_ref)


def test_block_scaled_operands_fp8_and_checks():
    """fp8bs operands in fp8 (never zeros, scales > 0) pass check_operands; wrong scale shapes,
    a bf16 x with a_scale, and the vendor are refused naming the argument."""
    p = S.Problem(5, 2 * 128, 256, "fp8bs", 8, 2, "gate_up")
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(0))
    assert ops.w.dtype == ops.x.dtype == torch.float8_e4m3fn and ops.out.dtype == torch.bfloat16
    assert ops.a_scale.shape == (5, 2) and ops.w_scale.shape == (8, 2, 2)
    assert (ops.a_scale > 0).all() and (ops.w_scale > 0).all() and ops.x.float().abs().sum() > 0
    assert I.problem_dtype(ops.w, ops.w_scale) == "fp8bs" and I.problem_dtype(ops.w, ops.w_scale[:, 0, 0]) == "fp8"
    args = (ops.stage, ops.x, ops.w, ops.topk_weights, ops.topk_ids)
    assert I.check_operands(*args, ops.a_scale, ops.w_scale, ops.out) == ""
    assert "w_scale must be a float32 tensor of shape (8, 2, 2)" in I.check_operands(
        *args, ops.a_scale, ops.w_scale[:, :1].contiguous())
    assert "a_scale must be a float32 tensor of shape (5, 2)" in I.check_operands(
        *args, ops.a_scale[:, :1].contiguous(), ops.w_scale)
    x16 = ops.x.float().to(torch.bfloat16)
    assert I.check_operands(ops.stage, x16, ops.w, ops.topk_weights, ops.topk_ids, None, ops.w_scale) == ""
    assert "x must be torch.float8_e4m3fn with a_scale" in I.check_operands(
        ops.stage, x16, ops.w, ops.topk_weights, ops.topk_ids, ops.a_scale, ops.w_scale)
    with pytest.raises(ValueError, match="no block-scaled fp8 path"):
        I.launch(S.VENDOR, ops.stage, ops.x, ops.w, ops.topk_weights, ops.topk_ids, None, ops.a_scale, ops.w_scale)


def test_block_scaled_fused_moe_equals_reference():
    """The layer on fp16 stand-ins with block scales: bf16-like x quantised per token group for
    gate_up, the intermediate for down; the reference quantises the same way."""
    g = torch.Generator().manual_seed(5)
    m, hidden, inter, e, top_k = 7, 200, 72, 6, 2
    x = torch.randn((m, hidden), generator=g).to(torch.float16)
    w1, s1 = I.random_block_weights(e, 2 * inter, hidden, "cpu", g, torch.float16)
    w2, s2 = I.random_block_weights(e, hidden, inter, "cpu", g, torch.float16)
    tw, ids = I.route(torch.randn((m, e), generator=g), top_k)
    ref = I.moe_reference(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2)
    y = I.fused_moe(x, w1, w2, tw, ids, CONFIGS[0], S.MoeGemvConfig(4, 256, 4), w1_scale=s1, w2_scale=s2)
    assert _err(y, ref) <= I.ERROR_BOUNDS["fp16"]
    assert "a2_scale must be None with block scales" in I.check_layer(x, w1, w2, tw, ids, s1, s2, None,
                                                                     torch.ones(1))
