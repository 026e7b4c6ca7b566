"""The fp8_blockscale op: the Triton kernel against the reference in the CPU interpreter
(fp16/fp32 operands: the interpreter computes garbage for fp8 dots), the quantisation
helpers, and the config space against vLLM's default and H100 tuned configs."""
import json
import re
from pathlib import Path

import pytest
import torch

from gemm_costmodel.kernels.vllm import tables
from gemm_costmodel import registry
from gemm_costmodel.kernels.fp8_blockscale import impl as I
from gemm_costmodel.kernels.fp8_blockscale import space as S

VLLM_DIR = Path(tables.tables_dir(tables.KIND_BLOCK_FP8))  # vLLM 0.33.0's tables, kept in the repository

CONFIGS = [S.vllm_default(), S.BsTiledConfig(16, 32, 64, 1, 4, 3), S.BsTiledConfig(32, 64, 32, 16, 4, 3),
           S.BsSplitKConfig(16, 64, 128, 2, 4, 3), S.BsSplitKConfig(32, 32, 128, 2, 4, 4)]


def _random_scaled(m, n, k, dtype, seed):
    """fp16/fp32 operands with independent random scales (not from a quantisation)."""
    g = torch.Generator().manual_seed(seed)
    (am, ak), (bn, bk) = I.scale_shapes(m, n, k)
    a = torch.randn((m, k), generator=g).to(dtype)
    b = (torch.randn((n, k), generator=g) * k ** -0.5).to(dtype)
    as_ = torch.exp2(torch.rand((am, ak), generator=g) * 6 - 3)
    bs = torch.exp2(torch.rand((bn, bk), generator=g) * 6 - 3)
    out = torch.empty((m, n), dtype=dtype)
    return I.Operands(a, b, as_, bs, out)


def _err(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


@pytest.mark.parametrize("m", [1, 7, 33, 130])
@pytest.mark.parametrize("n, k", [(200, 300), (136, 520)])
def test_interpreter_kernel_equals_reference_random_scales(m, n, k):
    ops = _random_scaled(m, n, k, torch.float16, m * 31 + n)
    I.check_operands(ops.a, ops.b, ops.as_, ops.bs)
    ref = I.reference(ops)
    for cfg in CONFIGS:
        assert S.check_feasible(cfg, S.Problem(m, n, k, "fp16"))[0], cfg.id
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert y is ops.out and y.dtype == torch.float16
        assert _err(y, ref) <= I.ERROR_BOUNDS["fp16"], (cfg.id, _err(y, ref))


GEMV_CONFIGS = [S.BsGemvConfig(1, 512, 4), S.BsGemvConfig(8, 1024, 8), S.BsGemvConfig(2, 2048, 4)]


# N not a multiple of the rows per program (wrapped rows), K not a multiple of 128 or of
# BLOCK_K (a partial tile and a partial scale group), a second scale block row (N > 128).
@pytest.mark.parametrize("m, n, k", [(1, 200, 300), (1, 7, 1000), (1, 136, 2048), (3, 130, 520)])
def test_interpreter_gemv_equals_reference_random_scales(m, n, k):
    ops = _random_scaled(m, n, k, torch.float16, m * 17 + n + k)
    ref = I.reference(ops)
    for cfg in GEMV_CONFIGS:
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert y is ops.out
        # M = 3 is outside the space (each row re-reads the weight) but still computed right.
        assert _err(y, ref) <= I.ERROR_BOUNDS["fp16"], (cfg.id, m, n, k, _err(y, ref))


def test_gemv_applies_each_scale_group():
    """Doubling one As group of the token (K 128..255) changes exactly that group's share."""
    ops = _random_scaled(1, 136, 384, torch.float32, 3)
    base = I.launch(S.BsGemvConfig(8, 512, 4), ops.a, ops.b, ops.as_, ops.bs).clone()
    ops.as_[0, 1] *= 2.0
    a, b = I.dequantize(ops.a, ops.b, ops.as_, ops.bs)
    want = base + (a[:, 128:256] / 2) @ b[:, 128:256].T
    y = I.launch(S.BsGemvConfig(8, 512, 4), ops.a, ops.b, ops.as_, ops.bs)
    assert _err(y, want) <= 1e-5
    assert _err(y, I.reference(ops)) <= I.ERROR_BOUNDS["fp32"]


def test_gemv_feasibility():
    one, two = S.Problem(1, 7168, 2048, "fp8"), S.Problem(2, 7168, 2048, "fp8")
    gemv = [c for c in S.generate_configs("sm90", "fp8") if c.variant == "gemv"]
    assert len(gemv) == 24 and all(c.shape_specialised for c in gemv)
    assert all(S.check_feasible(c, one)[0] for c in gemv)
    ok, why = S.check_feasible(gemv[0], two)
    assert not ok and why == "the GEMV is for M <= 1, got M=2"
    assert "must divide the scale block 128" in S.check_feasible(S.BsGemvConfig(3, 512, 4), one)[1]
    assert "power-of-two multiple" in S.check_feasible(S.BsGemvConfig(4, 384, 4), one)[1]
    assert "power-of-two multiple" in S.check_feasible(S.BsGemvConfig(4, 64, 4), one)[1]
    # The K tile is at most 2x K: at K = 512 the 2048-wide tiles go, at K = 128 every GEMV does.
    short = S.Problem(1, 32768, 512, "fp8")
    assert {c.block_k for c in gemv if S.check_feasible(c, short)[0]} == {512, 1024}
    assert S.check_feasible(S.BsGemvConfig(2, 2048, 4), short)[1] == "GEMV block_k=2048 is over 2x K=512"
    tiny = S.Problem(1, 7168, 128, "fp8")
    assert not any(S.check_feasible(c, tiny)[0] for c in gemv)
    assert any(c.variant == "swapab" for c in S.feasible_configs(tiny))
    assert {c.block_k for c in gemv if S.check_feasible(c, S.Problem(1, 7168, 256, "fp8"))[0]} == {512}
    assert S.config_params(gemv[0]) == dict(block_m=1, block_n=1, block_k=512, group_m=1, split_k=1,
                                            num_warps=4, num_stages=1)


def test_scales_matter():
    """A kernel ignoring a scale group would be far off: scaling one Bs block changes y."""
    ops = _random_scaled(9, 200, 300, torch.float32, 5)
    ops.bs[1, 2] *= 4.0  # columns 128..199, K 256..299
    y = I.launch(S.vllm_default(), ops.a, ops.b, ops.as_, ops.bs)
    assert _err(y, I.reference(ops)) <= I.ERROR_BOUNDS["fp32"]


def test_launch_allocates_bf16_for_fp8():
    ops = I.make_operands(S.Problem(3, 40, 136, "fp8"), "cpu", torch.Generator().manual_seed(0))
    assert ops.a.dtype == ops.b.dtype == torch.float8_e4m3fn and ops.out.dtype == torch.bfloat16
    assert ops.nbytes == 3 * 136 + 40 * 136 + 3 * 2 * 4 + 1 * 2 * 4 + 3 * 40 * 2


def test_check_operands_names_the_problem():
    ops = _random_scaled(4, 200, 300, torch.float16, 1)
    assert I.check_operands(ops.a, ops.b, ops.as_, ops.bs) == "fp16"
    with pytest.raises(ValueError, match=r"as_ must have shape \(4, 3\)"):
        I.check_operands(ops.a, ops.b, ops.as_[:, :2].contiguous(), ops.bs)
    with pytest.raises(ValueError, match=r"bs must have shape \(2, 3\)"):
        I.check_operands(ops.a, ops.b, ops.as_, ops.bs[:1].contiguous())
    with pytest.raises(ValueError, match="bs must be float32"):
        I.check_operands(ops.a, ops.b, ops.as_, ops.bs.half())
    with pytest.raises(ValueError, match="K mismatch"):
        I.check_operands(ops.a, ops.b[:, :10].contiguous(), ops.as_, ops.bs)


# -- quantisation helpers -----------------------------------------------------------------

def test_quantize_per_token_group_layout_and_error():
    g = torch.Generator().manual_seed(0)
    x = torch.randn((5, 300), generator=g) * torch.tensor([0.01, 1, 10, 100, 3])[:, None]
    q, s = I.quantize_per_token_group(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (5, 300)
    assert s.dtype == torch.float32 and s.shape == (5, 3) and s.is_contiguous()
    for gi, (lo, hi) in enumerate([(0, 128), (128, 256), (256, 300)]):  # the last group is partial
        torch.testing.assert_close(s[:, gi], x[:, lo:hi].abs().amax(dim=1) / 448.0)
        assert (q[:, lo:hi].float().abs().amax(dim=1) == 448.0).all()
    deq = q.float() * I.expand_group_scales(s, 300)
    rel = (deq - x).norm(dim=1) / x.norm(dim=1)
    assert (rel < 0.05).all(), rel


def test_quantize_weight_blocks_layout_and_error():
    g = torch.Generator().manual_seed(1)
    w = torch.randn((200, 300), generator=g) * 0.02
    w[128:, 256:] *= 50  # one block far larger: its own scale
    q, s = I.quantize_weight_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (200, 300)
    assert s.dtype == torch.float32 and s.shape == (2, 3)
    torch.testing.assert_close(s[1, 2], w[128:, 256:].abs().amax() / 448.0)
    torch.testing.assert_close(s[0, 1], w[:128, 128:256].abs().amax() / 448.0)
    deq = q.float() * I.expand_block_scales(s, 200, 300)
    assert ((deq - w).norm() / w.norm()).item() < 0.05


def test_quantize_zeros_gives_zeros_not_nan():
    q, s = I.quantize_per_token_group(torch.zeros(2, 130))
    assert (s > 0).all() and (q.float() == 0).all()


def test_fp8_operands_dequantise_close_to_their_source():
    """make_operands' fp8 operands: realistic scales (never zero), finite reference."""
    ops = I.make_operands(S.Problem(33, 200, 300, "fp8"), "cpu", torch.Generator().manual_seed(3))
    assert (ops.as_ > 0).all() and (ops.bs > 0).all()
    assert ops.as_.shape == (33, 3) and ops.bs.shape == (2, 3)
    ref = I.reference(ops)
    assert torch.isfinite(ref).all() and 0.05 < ref.abs().mean().item() < 50


# -- the space ----------------------------------------------------------------------------

def _vllm_files(device: str):
    assert VLLM_DIR.is_dir(), f"vLLM's tables belong in the repository: {VLLM_DIR}"
    files = sorted(VLLM_DIR.glob(f"N=*,K=*,device_name={device},dtype=fp8_w8a8,block_shape=[[]128,128[]].json"))
    assert len(files) == 23
    return files


def test_space_contains_vllm_default_and_every_h100_tuned_config():
    space = set(S.generate_configs("sm90", "fp8"))
    assert S.vllm_default() in space
    assert registry.get("fp8_blockscale").default_config == S.vllm_default().id == "bstiled_m64n128k128_g32_w4s2"
    seen = set()
    for f in _vllm_files("NVIDIA_H100_80GB_HBM3"):
        n, k = map(int, re.match(r"N=(\d+),K=(\d+),", f.name).groups())
        for mkey, entry in json.loads(f.read_text()).items():
            cfg = S.from_vllm(entry)
            assert cfg in space, (f.name, mkey, cfg.id)
            assert S.to_vllm(cfg) == entry
            ok, why = S.check_feasible(cfg, S.Problem(int(mkey), n, k, "fp8"))
            assert ok, (f.name, mkey, cfg.id, why)
            seen.add(cfg)
    assert len(seen) == 87
    assert len(space) <= 400


def test_from_vllm_rejects_bad_entries():
    entry = S.to_vllm(S.vllm_default())
    with pytest.raises(ValueError, match="missing"):
        S.from_vllm({k: v for k, v in entry.items() if k != "num_stages"})
    with pytest.raises(ValueError, match="unknown"):
        S.from_vllm({**entry, "kpack": 2})


@pytest.mark.parametrize("bk", [96, 256, 48])
def test_block_k_not_dividing_128_is_infeasible(bk):
    cfg = S.BsTiledConfig(64, 64, bk, 8, 4, 2)
    ok, why = S.check_feasible(cfg, S.Problem(64, 256, 1024, "fp8"))
    assert not ok and "must divide the scale group 128" in why


def test_static_rules_have_reasons():
    p = S.Problem(64, 256, 1024, "fp8")
    assert "shared memory" in S.check_feasible(S.BsTiledConfig(256, 256, 128, 1, 8, 5), p)[1]
    assert "accumulator" in S.check_feasible(S.BsTiledConfig(256, 256, 128, 1, 4, 2), p)[1]
    assert "fp8 dot" in S.check_feasible(S.BsTiledConfig(64, 64, 16, 1, 4, 2), p)[1]
    assert S.check_feasible(S.BsTiledConfig(64, 64, 16, 1, 4, 2), S.Problem(64, 256, 1024, "fp16"))[0]


def test_splitk_needs_enough_k_tiles():
    cfg = S.BsSplitKConfig(16, 64, 128, 4, 4, 3)
    assert S.check_feasible(cfg, S.Problem(1, 256, 512, "fp8"))[0]
    ok, why = S.check_feasible(cfg, S.Problem(1, 256, 300, "fp8"))
    assert not ok and "k-tiles < split_k=4" in why


@pytest.mark.parametrize("dtype", S.DTYPES)
def test_config_ids_round_trip(dtype):
    cfgs = S.generate_configs("sm90", dtype)
    # The vendor (blockwise torch._scaled_mm) is fp8-only: the interpreter dtypes have none.
    want = {"tiled", "splitk", "swapab", "gemv"} | ({"vendor"} if dtype == "fp8" else set())
    assert {c.variant for c in cfgs} == want
    for c in cfgs:
        assert S.config_from_id(c.id) == c
        assert set(S.config_params(c)) == set(S.PARAM_NAMES)
    assert S.config_from_id("bstiled_m64n128k128_g32_w4s2") == S.vllm_default()
    assert S.config_from_id("cublas") == S.VendorConfig()
    assert S.config_from_id("bsswapab_m16n64k128_s2_w4s3") == S.BsSwapABConfig(16, 64, 128, 2, 4, 3)
    assert S.config_from_id("bsgemv_n4k1024_w8") == S.BsGemvConfig(4, 1024, 8)
    for bad in ("tiled_m64n128k128_g32_w4s2", "bstiled_m064n128k128_g32_w4s2", "swapab_m16n64k128_s2_w4s3", ""):
        with pytest.raises(ValueError, match="unknown config id"):
            S.config_from_id(bad)


def test_problem_key_and_validation():
    assert S.Problem(7, 200, 300, "fp8").key == "fp8:7x200x300"
    with pytest.raises(ValueError, match="dtype"):
        S.Problem(7, 200, 300, "bf16")
    with pytest.raises(ValueError, match="m must be >= 1"):
        S.Problem(0, 200, 300, "fp8")


@pytest.mark.parametrize("m", [1, 8, 64, 200, 4096])
def test_fallback_rule_picks_a_feasible_candidate(m):
    from gemm_costmodel.serving.candidates import table

    t = table("sm90", "fp8", "fp8_blockscale")
    idx = [i for i, ok in enumerate(t.feasible_mask(m, 7168, 2048)) if ok]
    i = S.choose(m, 7168, 2048, 132, t.candidate_dicts(idx))
    cfg = S.config_from_id(t.ids[idx[i]])
    assert S.check_feasible(cfg, S.Problem(m, 7168, 2048, "fp8"))[0]
    assert cfg.block_m <= max(16, m) or m > 64


def test_train_suite():
    shapes = registry.get("fp8_blockscale").suite("train", "fp8")
    nk = {(s.n, s.k) for s in shapes}
    assert {(7168, 18432), (24576, 1536), (36864, 7168)} <= nk
    assert all(s.dtype == "fp8" for s in shapes)
    from gemm_costmodel.kernels.shapes import TRAINING_FAMILIES
    assert {s.family for s in shapes} <= set(TRAINING_FAMILIES)
