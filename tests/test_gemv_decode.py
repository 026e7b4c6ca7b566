"""Issue 63's GEMV variants (tiles in flight, 4 token rows, Inductor-shaped 16-warp tiles, the
unmasked loop with a K-tail tile) against the fp32 reference in the Triton interpreter, and the
decode benchmark's pure parts (no GPU)."""
import os

import pytest
import torch

from gemm_costmodel.benchmarks import decode as D
from gemm_costmodel.kernels.gemm.space import GemvConfig, Problem, check_feasible, generate_configs

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")

DEV = "cuda" if torch.cuda.is_available() else "cpu"

# (rows, block_n, block_k, split_k, warps, tiles in flight): small tiles keep the interpreter fast.
CASES = [
    GemvConfig(1, 4, 64, 1, 1, 2),
    GemvConfig(1, 4, 32, 1, 1, 4),
    GemvConfig(2, 2, 64, 1, 1, 4),
    GemvConfig(4, 4, 64, 1, 1, 2),
    # split-K: uneven slices, the tail tile in the last only (about 9 s a dtype in the interpreter: slow)
    pytest.param(GemvConfig(4, 2, 32, 3, 1, 4), marks=pytest.mark.slow, id="gemv_m4n2k32_s3_w1s4"),
    GemvConfig(2, 8, 64, 2, 1, 1),   # one tile in flight (the first grid's loop) with the K tail
    GemvConfig(1, 1, 128, 1, 1, 1),  # Inductor's shape: one row, a long K block
]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_gemv_variants_match_the_reference(cfg, dtype):
    from gemm_costmodel.kernels.gemm import kernel as gemm

    dt = {"fp16": torch.float16, "fp32": torch.float32}[dtype]
    gen = torch.Generator().manual_seed(63)
    # K: 4097 (a tail of 1 after full tiles), 7 (no full tile at all), 256 (no tail); N odd.
    for n, k in ((7, 4097), (33, 7), (5, 256)):
        w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dt).to(DEV)
        for m in (1, 2, 3, 4):
            if m > cfg.block_m and cfg.block_m < 4 and m != 1:
                continue  # rows past the config's cover run as extra row blocks; tested elsewhere
            x = torch.randn(m, k, generator=gen).to(dt).to(DEV)
            out = torch.full((m, n), float("nan"), dtype=dt, device=DEV)
            y = gemm.launch(cfg, x, w, out)
            ref = x.float() @ w.float().T
            err = ((y.float() - ref).norm() / ref.norm()).item()
            assert err < 2e-3, (cfg.id, m, n, k, err)


def test_new_gemv_configs_are_few_and_feasible_where_they_should_be():
    from gemm_costmodel.kernels.gemm.space import config_generation, pending_configs

    # Issue 63's grids joined the space with their H200 rows (LATER_GRIDS_SM90, generation "63").
    assert pending_configs("sm90", "bf16") == [] and pending_configs("sm90", "fp8") == []
    for dtype, n in (("bf16", 64), ("fp16", 64), ("fp8", 47)):
        assert sum(config_generation(c) == "63" for c in generate_configs("sm90", dtype)) == n
    g = [c for c in generate_configs("sm90", "bf16") if c.variant == "gemv"]
    new = [c for c in g if c.num_stages > 1 or c.num_warps == 16 or c.block_m == 4]
    assert len(new) == 57 and {c.block_m for c in new} == {1, 2, 4}
    # Inductor's M = 1 reduction shape is covered: 1-2 rows by 2048-4096 of K with 16 warps.
    assert GemvConfig(1, 1, 4096, 1, 16, 1) in g and GemvConfig(2, 2, 2048, 1, 16, 1) in g
    # The feasibility rules cover them already (M = 3 takes 4 rows once GEMV_ROWS holds 4).
    assert check_feasible(GemvConfig(4, 4, 512, 1, 4, 4), Problem(1, 8192, 4608, "bf16"))[1].startswith("GEMV computes")


def test_decode_suite_spans_4mb_to_1gb_and_m_1_to_4():
    shapes = D.decode_shapes("bf16")
    mb = sorted({n * k * 2 / 2**20 for _, n, k, _ in shapes})
    assert mb[0] == 4 and mb[-1] == 1024
    assert {m for m, *_ in shapes} == {1, 2, 3, 4}
    assert {c.block_m for c in D.gemv_candidates(3, "bf16")} == {4}
    assert len(D.gemv_candidates(1, "bf16")) > len(D.gemv_candidates(4, "bf16")) > 0


def test_decode_summary_fractions_and_verdicts():
    from gemm_costmodel.benchmarks import peers as P

    m, n, k = 1, 8192, 4608
    b = P.shape_bytes(m, n, k, "bf16")
    base = {"m": m, "n": n, "k": k, "dtype": "bf16", "bytes": b, "status": "ok"}
    rows = [{**base, "contender": "gemv", "candidate": "gemv_m1n4k1024_s1_w4s1", "us": 22.3},
            {**base, "contender": "gemv", "candidate": "gemv_m1n4k512_s1_w4s4", "us": 19.5},
            {**base, "contender": "gemv", "candidate": "gemv_m1n4k512_s1_w4s2", "status": "wrong", "us": None},
            {**base, "contender": "best_gemv", "candidate": "gemv_m1n4k512_s1_w4s4", "us": 19.6},
            {**base, "contender": "inductor", "candidate": "triton_red", "us": 19.84},
            {**base, "contender": "cublas", "candidate": "cublas", "us": 21.14}]
    s = D.summarize(rows, 4300.0)
    e = s["shapes"][0]
    assert e["best_gemv_alone"] == {"us": 19.5, "candidate": "gemv_m1n4k512_s1_w4s4"}
    assert e["best_gemv_s1_alone"] == {"us": 22.3, "candidate": "gemv_m1n4k1024_s1_w4s1"}
    assert e["gemv_vs_inductor"] == pytest.approx(19.84 / 19.6)
    assert e["best_gemv"]["copy_fraction"] == pytest.approx(b / 19.6e-6 / 4300e9)
    assert e["failed"] == ["gemv:gemv_m1n4k512_s1_w4s2:wrong"]
    assert s["gemv_at_least_as_fast_as_inductor"] == 1 and s["compared"] == 1
    assert s["m1_big_weights_min_copy_fraction"] == pytest.approx(e["best_gemv"]["copy_fraction"])
    md = D.summary_markdown(s, {"gpu_name": "G", "copy": {"method": "kernel", "datasheet_fraction": 0.9, "check": "ok"}})
    assert "at least as fast on 1 of 1" in md and "| bf16:1x8192x4608 | 72 |" in md
