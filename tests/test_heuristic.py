"""The hand heuristic: hand-checked ideal configs, and choose() over feasible lists."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemm_costmodel.kernels.gemm import heuristic
from gemm_costmodel.serving.candidates import table
from gemm_costmodel.kernels.gemm.space import Problem, check_feasible, config_from_id, config_params

H100_SMS = 132


def _as_id(want: dict) -> str:
    """Config id of an ideal() dict."""
    if want["variant"] == "splitk":
        return (f"splitk_m{want['block_m']}n{want['block_n']}k{want['block_k']}_s{want['split_k']}"
                f"_w{want['num_warps']}s{want['num_stages']}")
    return (f"{want['variant']}_m{want['block_m']}n{want['block_n']}k{want['block_k']}_g{want['group_m']}"
            f"_w{want['num_warps']}s{want['num_stages']}")


def _feasible(m, n, k, dtype="bf16"):
    ct = table("sm90", dtype, op="gemm")
    idx = np.flatnonzero(ct.feasible_mask(m, n, k))
    return ct, idx, ct.candidate_dicts(idx)


def test_decode_splits_to_fill_the_sms():
    # M=1 -> block_m 16, 64-wide N tiles: 4096/64 = 64 tiles; K=4096 has 32 k-tiles of 128.
    # tiles*split: 1 -> 64 (gap 68), 2 -> 128 (gap 4), 4 -> 256 (gap 124): split 2.
    want = heuristic.ideal(1, 4096, 4096, H100_SMS)
    assert want == dict(variant="splitk", block_m=16, block_n=64, block_k=128, group_m=1, split_k=2,
                        num_warps=4, num_stages=4)
    # 78 SMs (H20): 64 tiles alone are closest (gap 14 vs 50): no split, the tiled kernel.
    assert heuristic.ideal(1, 4096, 4096, 78)["variant"] == "tiled"
    # N=1024: 16 tiles; 16*8 = 128 is closest to 132 (16*16 = 256 is further).
    assert heuristic.ideal(1, 1024, 4096, H100_SMS)["split_k"] == 8
    # Only one k-tile (K=100 < 128): split-K is impossible, so tiled with group_m 8.
    assert heuristic.ideal(1, 1024, 100, H100_SMS) == dict(
        variant="tiled", block_m=16, block_n=64, block_k=128, group_m=8, split_k=1, num_warps=4, num_stages=4)
    # M=40 -> block_m 64 (smallest block holding M among 16/32/64).
    assert heuristic.ideal(40, 4096, 4096, H100_SMS)["block_m"] == 64


def test_large_prefill_is_persistent_128x256():
    # 8192x8192: 64*32 = 2048 tiles of 128x256 >= 132 SMs.
    assert heuristic.ideal(8192, 8192, 8192, H100_SMS) == dict(
        variant="persistent", block_m=128, block_n=256, block_k=64, group_m=8, split_k=1, num_warps=8,
        num_stages=3)
    # 2048x2048: 256 tiles of 128x128 fill the SMs, 128 of 128x256 do not: tiled 128x128.
    assert heuristic.ideal(2048, 2048, 4096, H100_SMS) == dict(
        variant="tiled", block_m=128, block_n=128, block_k=64, group_m=8, split_k=1, num_warps=8, num_stages=3)


def test_sm_starved_mid_shapes_use_smaller_tiles():
    # 512x1024: 32 tiles of 128x128 and 64 of 64x128, both < 132: 64x64 tiles (128 of them).
    assert heuristic.ideal(512, 1024, 4096, H100_SMS) == dict(
        variant="tiled", block_m=64, block_n=64, block_k=64, group_m=8, split_k=1, num_warps=4, num_stages=4)
    # 512x4096: 128 tiles of 128x128 < 132, 256 of 64x128 >= 132: 64x128.
    assert heuristic.ideal(512, 4096, 4096, H100_SMS) == dict(
        variant="tiled", block_m=64, block_n=128, block_k=64, group_m=8, split_k=1, num_warps=4, num_stages=4)
    # The same shape on a 114-SM H100 PCIe has enough 128x128 tiles.
    assert heuristic.ideal(512, 4096, 4096, 114)["block_m"] == 128


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 4096), (512, 1024, 4096),
                                   (512, 4096, 4096)])
def test_choose_picks_the_ideal_when_feasible(shape):
    m, n, k = shape
    ct, idx, cands = _feasible(m, n, k)
    want = _as_id(heuristic.ideal(m, n, k, H100_SMS))
    assert want in [ct.ids[i] for i in idx]
    assert ct.ids[idx[heuristic.choose(m, n, k, H100_SMS, cands)]] == want


def test_choose_snaps_to_the_nearest_when_the_ideal_is_absent():
    ct, idx, cands = _feasible(1, 4096, 4096)
    ids = [ct.ids[i] for i in idx]
    drop = {"splitk_m16n64k128_s2_w4s4"}
    kept = [c for c, cid in zip(cands, ids) if cid not in drop]
    kept_ids = [cid for cid in ids if cid not in drop]
    # Same tile and split, one pipeline stage fewer: distance 0.1.
    assert kept_ids[heuristic.choose(1, 4096, 4096, H100_SMS, kept)] == "splitk_m16n64k128_s2_w4s3"
    # Without both: every one-log2-step neighbour (block_n 32/128, block_k 64/256, split 4,
    # block_m 32) is at distance 1.0; the tie goes to the first in table order (block_n 32).
    drop |= {"splitk_m16n64k128_s2_w4s3"}
    kept = [c for c, cid in zip(cands, ids) if cid not in drop]
    kept_ids = [cid for cid in ids if cid not in drop]
    assert kept_ids[heuristic.choose(1, 4096, 4096, H100_SMS, kept)] == "splitk_m16n32k128_s2_w4s4"
    # A single neighbour left among far configs wins.
    near = ["splitk_m16n64k128_s4_w4s4", "tiled_m128n128k64_g8_w8s3", "cublas"]
    sub = [cands[ids.index(c)] for c in near[::-1]]
    assert heuristic.choose(1, 4096, 4096, H100_SMS, sub) == 2
    # Only a tiled config and the vendor: the variant mismatch costs less than "vendor".
    two = [{"variant": "vendor", **{p: 0 for p in ("block_m", "block_n", "block_k", "group_m", "split_k",
                                                    "num_warps", "num_stages")}},
           {"variant": "tiled", **config_params(config_from_id("tiled_m128n128k64_g8_w8s3"))}]
    assert heuristic.choose(1, 4096, 4096, H100_SMS, two) == 1
    # Ties go to the first of equals.
    assert heuristic.choose(1, 4096, 4096, H100_SMS, [two[1], two[1]]) == 0


def test_choose_rejects_an_empty_list():
    with pytest.raises(ValueError):
        heuristic.choose(1, 1, 1, H100_SMS, [])


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 30000), k=st.integers(1, 30000),
       dtype=st.sampled_from(["bf16", "fp16", "fp8"]), sms=st.sampled_from([78, 114, 132]),
       data=st.data())
def test_choose_returns_an_index_into_the_given_feasible_list(m, n, k, dtype, sms, data):
    ct, idx, cands = _feasible(m, n, k, dtype)
    # Any non-empty subset of the feasible candidates, in any order.
    sub = data.draw(st.lists(st.sampled_from(range(len(idx))), min_size=1, max_size=30, unique=True))
    i = heuristic.choose(m, n, k, sms, [cands[j] for j in sub])
    assert isinstance(i, int) and 0 <= i < len(sub)
    cid = ct.ids[idx[sub[i]]]
    assert check_feasible(config_from_id(cid), Problem(m, n, k, dtype))[0]
    # Over the full feasible list the choice is feasible too.
    j = heuristic.choose(m, n, k, sms, cands)
    assert 0 <= j < len(cands)
