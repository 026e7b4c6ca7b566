"""The runtime's vectorised feasibility mask agrees with check_feasible, config by config."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gemm_costmodel.serving.candidates import CandidateTable, table
from gemm_costmodel.kernels.gemm import space as G
from gemm_costmodel.kernels.gemm.space import Problem, check_feasible, generate_configs

DTYPES = ["bf16", "fp16", "fp8", "fp32"]
# Values on the edges of the rules: 16-byte alignment (fp8 K/N % 16, fp16 K % 8),
# k-tiles vs split_k (K around multiples of 64/128/256), tiny and odd sizes.
EDGES = [1, 2, 7, 8, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 4095, 4096, 4097]


def _dim(hi):
    return st.one_of(st.integers(1, hi), st.sampled_from(EDGES))


def _expected(m, n, k, dtype):
    prob = Problem(m, n, k, dtype)
    return np.array([check_feasible(c, prob)[0] for c in generate_configs("sm90", dtype)], dtype=bool)


@settings(max_examples=40, deadline=None)
@given(m=_dim(20000), n=_dim(30000), k=_dim(30000), dtype=st.sampled_from(DTYPES))
# Split-K workspace exactly at the limit (16 * 4096 * 1024 * 4 B == limit: allowed) and one past it.
@example(m=4096, n=1024, k=4096, dtype="bf16")
@example(m=4097, n=1024, k=4096, dtype="bf16")
# k-tiles == split_k for block_k 256 / split 16, and one k-tile short of it.
@example(m=1, n=4096, k=4096, dtype="fp16")
@example(m=1, n=4096, k=3840, dtype="fp16")
# fp8: vendor needs K and N % 16; persistent needs K % 16 (1-byte) and N % 8 (bf16 out).
@example(m=3, n=24, k=48, dtype="fp8")
@example(m=3, n=48, k=24, dtype="fp8")
@example(m=1, n=1, k=1, dtype="fp32")
# Swap-AB: token counts 16/32/64 by M, none above 64, TMA only with 16-byte K rows.
@example(m=17, n=4096, k=4096, dtype="bf16")
@example(m=64, n=4096, k=4096, dtype="fp8")
@example(m=65, n=4096, k=4096, dtype="bf16")
@example(m=7, n=4096, k=100, dtype="bf16")
@example(m=7, n=4096, k=200, dtype="fp16")
def test_feasible_mask_equals_check_feasible(m, n, k, dtype):
    ct = table("sm90", dtype, op="gemm")
    mask = ct.feasible_mask(m, n, k)
    assert mask.dtype == bool and mask.shape == (len(ct),)
    expected = _expected(m, n, k, dtype)
    bad = [ct.ids[i] for i in np.flatnonzero(mask != expected)]
    assert not bad, f"mask disagrees with check_feasible for {bad[:5]} on {dtype}:{m}x{n}x{k}"
    assert mask.any(), "the tiled configs run any shape"


@pytest.mark.parametrize("dtype", DTYPES)
def test_table_matches_generate_configs(dtype):
    ct = table("sm90", dtype, op="gemm")
    cfgs = generate_configs("sm90", dtype)
    assert ct.ids == [c.id for c in cfgs]
    assert all(ct.index[cid] == i for i, cid in enumerate(ct.ids))
    assert ct.space_hash == G.space_hash(cfgs)
    for i, c in enumerate(cfgs):
        params = G.config_params(c)
        assert {p: int(ct.params[p][i]) for p in params} == params
        assert ct.variants[i] == c.variant
    # The cached table is the same object; a fresh one has the same content.
    assert table("sm90", dtype, op="gemm") is ct
    assert CandidateTable("sm90", dtype, op="gemm").ids == ct.ids


def test_candidate_dicts_carry_variant_and_params():
    ct = table("sm90", "fp16", op="gemm")
    idx = [0, len(ct) - 1]
    dicts = ct.candidate_dicts(idx)
    for i, d in zip(idx, dicts):
        cfg = G.config_from_id(ct.ids[i])
        assert d == {"variant": cfg.variant, **G.config_params(cfg)}
