"""Config ids, the committed candidate space and the feasibility rules."""
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemm_costmodel.kernels.gemm import space as G
from gemm_costmodel.kernels.gemm.space import (ARCHS, DTYPES, PersistentConfig, Problem,
                                                 SplitKConfig, SwapABConfig, TiledConfig, VendorConfig,
                                                 check_feasible, config_from_id, config_params,
                                                 feasible_configs, generate_configs, smem_bytes,
                                                 space_hash, static_feasible)

SM90 = ARCHS["sm90"]

# ----------------------------------------------------------------------------
# Stable ids
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("cfg,cid", [
    (TiledConfig(64, 128, 64, 8, 4, 3), "tiled_m64n128k64_g8_w4s3"),
    (SplitKConfig(16, 64, 128, 4, 4, 3), "splitk_m16n64k128_s4_w4s3"),
    (PersistentConfig(128, 256, 64, 8, 8, 3), "persistent_m128n256k64_g8_w8s3"),
    (VendorConfig(), "cublas"),
])
def test_exact_ids(cfg, cid):
    assert cfg.id == cid
    assert config_from_id(cid) == cfg


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_config_from_id_round_trips_every_generated_config(arch, dtype):
    cfgs = generate_configs(arch, dtype)
    assert cfgs
    for c in cfgs:
        back = config_from_id(c.id)
        assert back == c and type(back) is type(c) and back.id == c.id


@pytest.mark.parametrize("bad", ["", "cuBLAS", "tiled", "tiled_m64n128k64_g8_w4", "tiled_m64n128k64_g8_w4s3x",
                                 "splitk_m16n64k128_g4_w4s3", "persistent_m128n256k64_s8_w8s3",
                                 "foo_m1n1k1_g1_w1s1", " tiled_m64n128k64_g8_w4s3", "triton"])
def test_unknown_id_raises(bad):
    with pytest.raises(ValueError, match="unknown config id"):
        config_from_id(bad)


def test_config_params_uniform_view():
    assert config_params(TiledConfig(64, 128, 64, 8, 4, 3)) == dict(
        block_m=64, block_n=128, block_k=64, group_m=8, split_k=1, num_warps=4, num_stages=3)
    assert config_params(SplitKConfig(16, 64, 128, 4, 4, 3)) == dict(
        block_m=16, block_n=64, block_k=128, group_m=1, split_k=4, num_warps=4, num_stages=3)
    assert config_params(PersistentConfig(128, 256, 64, 8, 8, 3)) == dict(
        block_m=128, block_n=256, block_k=64, group_m=8, split_k=1, num_warps=8, num_stages=3)
    assert config_params(VendorConfig()) == dict.fromkeys(G.PARAM_NAMES, 0)


# ----------------------------------------------------------------------------
# The committed space
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,count", [("bf16", 658), ("fp16", 658), ("fp8", 697)])
def test_generate_configs_counts_sm90(dtype, count):
    cfgs = generate_configs("sm90", dtype)
    assert len(cfgs) == count
    ids = [c.id for c in cfgs]
    assert len(set(ids)) == len(ids)
    assert ids == [c.id for c in generate_configs("sm90", dtype)]  # deterministic order
    assert cfgs[-1] == VendorConfig() and sum(isinstance(c, VendorConfig) for c in cfgs) == 1
    # Variants come in blocks: tiled, split-K, persistent, the two swap-AB ones, then the vendor.
    order = [c.variant for c in cfgs]
    assert order == sorted(order, key=["tiled", "splitk", "persistent", "swapab", "swapab_tma", "gemv",
                                       "vendor"].index)
    assert len(generate_configs("sm90", dtype, include_vendor=False)) == count - 1


def test_space_hash_bf16_pinned():
    # Changing the bf16 sm90 space must be a deliberate edit of this literal.
    assert space_hash(generate_configs("sm90", "bf16")) == "391e44c5a6946514"
    # fp16 has the same element size, so the same space.
    assert space_hash(generate_configs("sm90", "fp16")) == "391e44c5a6946514"
    assert space_hash(generate_configs("sm90", "fp8")) != "391e44c5a6946514"


def test_space_hash_is_sha256_prefix_of_ids():
    import hashlib

    cfgs = [TiledConfig(64, 128, 64, 8, 4, 3), VendorConfig()]
    want = hashlib.sha256(b"tiled_m64n128k64_g8_w4s3\ncublas").hexdigest()[:16]
    assert space_hash(cfgs) == want
    assert space_hash(cfgs[::-1]) != want  # order matters


def test_fp32_and_sm80_spaces():
    assert not any(isinstance(c, VendorConfig) for c in generate_configs("sm90", "fp32"))
    sm80 = generate_configs("sm80", "bf16")
    assert not any(isinstance(c, PersistentConfig) for c in sm80)  # no TMA before Hopper
    assert all(smem_bytes(c, "bf16") <= ARCHS["sm80"].smem_per_block for c in sm80)


def test_generate_configs_rejects_unknown_arch_and_dtype():
    with pytest.raises(ValueError, match="unknown arch 'sm70'"):
        generate_configs("sm70", "bf16")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        generate_configs("sm90", "int8")


# ----------------------------------------------------------------------------
# Static feasibility
# ----------------------------------------------------------------------------

def test_smem_bytes_hand_computed():
    # 4 stages * (128 + 256) rows * 64 k * 2 B
    assert smem_bytes(TiledConfig(128, 256, 64, 8, 8, 4), "bf16") == 196608
    assert smem_bytes(SplitKConfig(128, 256, 64, 2, 8, 4), "bf16") == 196608
    # Persistent adds the BM x BN TMA store tile in the output dtype.
    assert smem_bytes(PersistentConfig(128, 256, 64, 8, 8, 3), "bf16") == 3 * 384 * 64 * 2 + 128 * 256 * 2
    # fp8 inputs are 1 B, but the store tile is bf16 (2 B).
    assert smem_bytes(PersistentConfig(128, 256, 64, 8, 8, 4), "fp8") == 4 * 384 * 64 + 128 * 256 * 2
    assert smem_bytes(TiledConfig(64, 64, 64, 8, 4, 3), "fp32") == 3 * 128 * 64 * 4
    assert smem_bytes(VendorConfig(), "bf16") == 0


def test_smem_limit_excludes_config():
    big = TiledConfig(128, 256, 128, 8, 8, 3)  # 3 * 384 * 128 * 2 = 294912 B
    assert smem_bytes(big, "bf16") == 294912 > 232448
    ok, why = static_feasible(big, SM90, "bf16")
    assert not ok and why == "shared memory 294912 B > 232448 B"
    assert big not in generate_configs("sm90", "bf16")
    # Persistent 128x256x64 at 4 stages: 196608 + 65536 = 262144 B > limit; 3 stages fit.
    assert PersistentConfig(128, 256, 64, 8, 8, 4) not in generate_configs("sm90", "bf16")
    assert PersistentConfig(128, 256, 64, 8, 8, 3) in generate_configs("sm90", "bf16")
    # Same tile fits in fp8 (1 B inputs).
    assert TiledConfig(128, 256, 128, 8, 8, 3) in generate_configs("sm90", "fp8")


def test_every_generated_config_within_limits():
    for dtype in ("bf16", "fp16", "fp8"):
        for c in generate_configs("sm90", dtype, include_vendor=False):
            assert smem_bytes(c, dtype) <= 232448
            assert c.block_m * c.block_n // (c.num_warps * 32) <= 128


def test_register_rule():
    # 128 * 256 / (4 warps * 32) = 256 accumulators per thread > 128: excluded.
    ok, why = static_feasible(TiledConfig(128, 256, 64, 8, 4, 3), SM90, "bf16")
    assert not ok and why == "256 accumulator registers per thread would spill"
    assert TiledConfig(128, 256, 64, 8, 4, 3) not in generate_configs("sm90", "bf16")
    # Exactly 128 per thread is allowed (the rule is strictly greater).
    assert static_feasible(TiledConfig(128, 256, 64, 8, 8, 3), SM90, "bf16") == (True, "")
    assert static_feasible(TiledConfig(128, 128, 64, 8, 4, 3), SM90, "bf16") == (True, "")
    assert TiledConfig(128, 256, 64, 8, 8, 3) in generate_configs("sm90", "bf16")


def test_fp8_block_k_and_small_tile_warp_rules():
    assert static_feasible(TiledConfig(16, 32, 16, 8, 4, 3), SM90, "fp8") == (False, "fp8 dot needs block_k >= 32")
    assert static_feasible(TiledConfig(16, 32, 16, 8, 4, 3), SM90, "bf16") == (True, "")
    ok, why = static_feasible(TiledConfig(32, 64, 64, 8, 8, 3), SM90, "bf16")
    assert not ok and why == "8 warps on a tile smaller than 64x64"
    assert static_feasible(TiledConfig(64, 64, 64, 8, 8, 3), SM90, "bf16") == (True, "")


def test_persistent_needs_tma_arch():
    ok, why = static_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), ARCHS["sm80"], "bf16")
    assert not ok and "TMA" in why
    assert not check_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), Problem(64, 64, 64, "bf16"), "sm80")[0]


# ----------------------------------------------------------------------------
# Per-problem feasibility
# ----------------------------------------------------------------------------

def test_splitk_needs_enough_k_tiles():
    cfg = SplitKConfig(16, 32, 64, 4, 4, 3)
    ok, why = check_feasible(cfg, Problem(8, 64, 192, "bf16"))  # cdiv(192, 64) = 3 < 4
    assert not ok and why == "K=192 has 3 k-tiles < split_k=4"
    assert check_feasible(cfg, Problem(8, 64, 193, "bf16")) == (True, "")  # cdiv = 4
    assert check_feasible(cfg, Problem(8, 64, 256, "bf16")) == (True, "")


def test_splitk_workspace_limit():
    assert G.SPLITK_WORKSPACE_LIMIT == 256 * 2**20
    cfg = SplitKConfig(16, 32, 64, 2, 4, 3)
    # 2 * 4096 * 8192 * 4 B = 256 MiB exactly: allowed.
    assert check_feasible(cfg, Problem(4096, 8192, 128, "bf16")) == (True, "")
    # One more column is over the limit.
    assert check_feasible(cfg, Problem(4096, 8193, 128, "bf16")) == (False, "split-K workspace above limit")
    # split_k=16 hits the limit 8x earlier.
    cfg16 = SplitKConfig(16, 32, 64, 16, 4, 3)
    assert check_feasible(cfg16, Problem(1024, 4096, 1024, "bf16"))[0]  # 16*1024*4096*4 = 256 MiB
    assert not check_feasible(cfg16, Problem(1025, 4096, 1024, "bf16"))[0]


def test_fp8_vendor_needs_k_and_n_divisible_by_16():
    v = VendorConfig()
    assert check_feasible(v, Problem(1, 48, 64, "fp8")) == (True, "")
    assert check_feasible(v, Problem(1, 40, 64, "fp8")) == (False, "torch._scaled_mm needs K and N divisible by 16")
    assert check_feasible(v, Problem(1, 48, 72, "fp8"))[0] is False
    # bf16 vendor has no such rule.
    assert check_feasible(v, Problem(1, 40, 72, "bf16")) == (True, "")


@pytest.mark.parametrize("dtype,k,ok", [
    ("bf16", 8, True), ("bf16", 12, False), ("bf16", 4104, True), ("bf16", 4100, False),
    ("fp8", 16, True), ("fp8", 24, False), ("fp8", 4104, False), ("fp8", 4112, True),
    ("fp32", 4, True), ("fp32", 6, False),
])
def test_tma_k_alignment(dtype, k, ok):
    res, why = check_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), Problem(64, 64, k, dtype))
    assert res is ok
    if not ok:
        assert why == "TMA needs K * element size divisible by 16"


@pytest.mark.parametrize("dtype,n,ok", [
    ("bf16", 8, True), ("bf16", 12, False),
    ("fp8", 8, True), ("fp8", 4, False),    # the output is bf16, so N=8 is enough for fp8 too
    ("fp32", 4, True), ("fp32", 2, False),
])
def test_tma_n_alignment(dtype, n, ok):
    res, why = check_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), Problem(64, n, 64, dtype))
    assert res is ok
    if not ok:
        assert why == "TMA needs N * output element size divisible by 16"


def test_tiled_has_no_alignment_rule():
    assert check_feasible(TiledConfig(64, 64, 64, 8, 4, 3), Problem(1, 1, 1, "bf16")) == (True, "")


def test_feasible_configs_filters_per_problem():
    prob = Problem(1, 40, 72, "fp8")  # K * 1 B = 72: no TMA; N=40, K=72 not multiples of 16: no _scaled_mm
    feas = feasible_configs(prob)
    assert VendorConfig() not in feas
    assert not any(isinstance(c, PersistentConfig) for c in feas)
    assert all(check_feasible(c, prob)[0] for c in feas)
    full = generate_configs("sm90", "fp8")
    assert feas == [c for c in full if check_feasible(c, prob)[0]]  # order preserved
    assert feasible_configs(Problem(64, 64, 4096, "bf16"), include_vendor=False)[-1] != VendorConfig()


# ----------------------------------------------------------------------------
# Problem validation
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(m=0, n=1, k=1, dtype="bf16"), "m must be >= 1, got 0"),
    (dict(m=-3, n=1, k=1, dtype="bf16"), "m must be >= 1, got -3"),
    (dict(m=1.0, n=1, k=1, dtype="bf16"), "m must be an int, got float"),
    (dict(m=True, n=1, k=1, dtype="bf16"), "m must be an int, got bool"),
    (dict(m=1, n="8", k=1, dtype="bf16"), "n must be an int, got str"),
    (dict(m=1, n=1, k=0, dtype="bf16"), "k must be >= 1, got 0"),
    (dict(m=1, n=1, k=1, dtype="int8"), "dtype must be one of"),
    (dict(m=1, n=1, k=1, dtype="BF16"), "dtype must be one of"),
])
def test_problem_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Problem(**kwargs)


def test_problem_key():
    assert Problem(7, 40, 72, "fp16").key == "fp16:7x40x72"


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["tiled", "splitk", "persistent"]),
       st.lists(st.integers(1, 4096), min_size=6, max_size=6))
def test_id_round_trip_property(variant, params):
    cfg = G.VARIANTS[variant](*params)
    assert config_from_id(cfg.id) == cfg


def test_gemm_configs_does_not_import_torch():
    code = "import gemm_costmodel.kernels.gemm.space, sys; assert 'torch' not in sys.modules, 'torch imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("cid", ["tiled_m64n128k64_g8_w4s3\n", "tiled_m064n128k64_g8_w4s3"])
def test_non_canonical_id_raises(cid):
    with pytest.raises(ValueError, match="unknown config id"):
        config_from_id(cid)


def test_swapab_is_decode_only_with_one_token_count():
    from gemm_costmodel.kernels.gemm.space import SwapABTmaConfig, swapab_tokens

    assert [swapab_tokens(m) for m in (1, 7, 16, 17, 32, 33, 64, 65)] == [16, 16, 16, 32, 32, 64, 64, 0]
    for m, ok_tokens in ((1, 16), (16, 16), (17, 32), (64, 64)):
        for t in (16, 32, 64):
            ok, why = check_feasible(SwapABConfig(t, 64, 128, 1, 4, 3), Problem(m, 4096, 4096, "bf16"))
            assert ok == (t == ok_tokens), (m, t, why)
    ok, why = check_feasible(SwapABConfig(64, 64, 128, 1, 4, 3), Problem(65, 4096, 4096, "bf16"))
    assert not ok and "decode" in why
    # TMA needs 16-byte K rows (K=100 bf16 is 200 B); the pointer variant does not.
    assert check_feasible(SwapABTmaConfig(16, 64, 64, 1, 4, 3), Problem(7, 4096, 100, "bf16"))[0] is False
    assert check_feasible(SwapABConfig(16, 64, 64, 1, 4, 3), Problem(7, 4096, 100, "bf16"))[0] is True
    # A split needs as many K tiles: K=256 has 2 tiles of 128.
    assert check_feasible(SwapABConfig(16, 64, 128, 2, 4, 3), Problem(7, 4096, 256, "bf16"))[0] is True
    assert check_feasible(SwapABConfig(16, 64, 128, 4, 4, 3), Problem(7, 4096, 256, "bf16"))[0] is False
    # Per decode shape: 2 loaders x 3 BLOCK_K x 4 splits x 3 pipelines, less what overflows smem.
    feas = feasible_configs(Problem(7, 4096, 4096, "bf16"))
    assert sum(isinstance(c, SwapABConfig) for c in feas) == 64
    assert not any(isinstance(c, SwapABConfig) for c in feasible_configs(Problem(65, 4096, 4096, "bf16")))
    assert config_from_id("swapabtma_m16n64k256_s1_w4s4") == SwapABTmaConfig(16, 64, 256, 1, 4, 4)
    assert config_from_id("swapab_m16n64k256_s1_w4s4") != config_from_id("swapabtma_m16n64k256_s1_w4s4")


def test_gemv_is_for_m_up_to_4_with_one_row_count():
    from gemm_costmodel.kernels.gemm.space import GemvConfig, gemv_rows

    assert [gemv_rows(m) for m in (1, 2, 3, 4, 5, 64)] == [1, 2, 4, 4, 0, 0]
    for m, rows in ((1, 1), (2, 2), (3, 4), (4, 4)):
        for r in (1, 2, 4):
            ok, why = check_feasible(GemvConfig(r, 8, 256, 1, 4, 1), Problem(m, 4096, 4096, "bf16"))
            assert ok == (r == rows), (m, r, why)
    ok, why = check_feasible(GemvConfig(2, 8, 256, 1, 4, 1), Problem(3, 4096, 4096, "bf16"))
    assert not ok and "M=3 takes 4" in why
    ok, why = check_feasible(GemvConfig(4, 8, 256, 1, 4, 1), Problem(5, 4096, 4096, "bf16"))
    assert not ok and "M <= 4" in why
    # Registers: 2 rows x 32 x 1024 / 128 threads = 512 accumulators per thread.
    ok, why = check_feasible(GemvConfig(2, 32, 1024, 1, 4, 1), Problem(2, 4096, 4096, "bf16"))
    assert not ok and "spill" in why
    # A thread must load at least one 16-byte vector per step: 4 x 256 / 256 threads = 4 bf16 = 8 B.
    ok, why = check_feasible(GemvConfig(1, 4, 256, 1, 8, 1), Problem(1, 4096, 4096, "bf16"))
    assert not ok and "16-byte" in why
    # ... which fp32 (4 x 4 B) meets.
    assert check_feasible(GemvConfig(1, 4, 256, 1, 8, 1), Problem(1, 4096, 4096, "fp32"))[0]
    # Split-K needs as many K tiles: K = 1024 has 2 tiles of 512.
    assert check_feasible(GemvConfig(1, 8, 512, 2, 4, 1), Problem(1, 4096, 1024, "bf16"))[0]
    assert not check_feasible(GemvConfig(1, 8, 512, 4, 4, 1), Problem(1, 4096, 1024, "bf16"))[0]
    counts = {m: sum(c.variant == "gemv" for c in feasible_configs(Problem(m, 4096, 4096, "bf16")))
              for m in (1, 2, 3, 4)}
    assert counts == {1: 61, 2: 56, 3: 18, 4: 18}
    assert config_from_id("gemv_m2n8k256_s2_w4s1") == GemvConfig(2, 8, 256, 2, 4, 1)
    assert config_params(GemvConfig(2, 8, 256, 2, 4, 1)) == dict(
        block_m=2, block_n=8, block_k=256, group_m=1, split_k=2, num_warps=4, num_stages=1)


@pytest.mark.parametrize("op", ["gemm", "fp8_blockscale"])
def test_precomputed_rule_arrays_give_the_formulas_answers(op):
    """The split-K and token-count rules read arrays precomputed per space (ConfigArrays, issue 18's
    cold decision): on every config and a grid of problems they answer as the formulas they stand
    for, computed here with Python ints (exact, also where M * N * 4 * split_k passes 2**63)."""
    import numpy as np

    from gemm_costmodel import registry

    S = registry.get(op).space_module()
    for dtype in registry.get(op).dtypes:
        cfgs = S.generate_configs("sm90", dtype)
        a = S.ConfigArrays(cfgs)
        params = [S.config_params(c) for c in cfgs]
        split = [bool(s) for s in a.split]
        swapab = [bool(s) for s in a.swapab]
        for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 4097, 2**29, 2**31 - 1):
            t = G.swapab_tokens(m)
            want = [sw and c["block_m"] != t for sw, c in zip(swapab, params)]
            assert a.swapab_mismatch[t].tolist() == want, (m, t)
            if op == "gemm":
                r = G.gemv_rows(m)
                want = [bool(gv) and c["block_m"] != r for gv, c in zip(a.gemv, params)]
                assert a.gemv_mismatch[r].tolist() == want, (m, r)
            for n in (1, 16, 4096, 2**31 - 1):
                want = [sp and c["split_k"] * m * n * 4 > S.SPLITK_WORKSPACE_LIMIT for sp, c in zip(split, params)]
                assert (a.split_sk > S.SPLITK_WORKSPACE_LIMIT // (m * n * 4)).tolist() == want, (m, n)
        for k in (1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4096, 2**31 - 1):
            want = [sp and -(-k // max(c["block_k"], 1)) < c["split_k"] for sp, c in zip(split, params)]
            assert (a.split_short_k >= k).tolist() == want, k
        assert np.array_equal(S.problem_mask(a, S.Problem(7, 4096, 128, dtype)),
                              [S.check_feasible(c, S.Problem(7, 4096, 128, dtype))[0] or
                               not S.static_feasible(c, S.ARCHS["sm90"], dtype)[0] for c in cfgs])
