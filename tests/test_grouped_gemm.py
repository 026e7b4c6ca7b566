"""The grouped_gemm op (issue 60): its space and suites, the Triton kernels of every variant and pass
in the CPU interpreter (fp16/fp32: the interpreter's bf16 dots are garbage), the vendor path, the
features, the fallback rule and the autograd op ``grouped_linear``. The registry contract
(tests/test_registry.py) covers it too."""
import os

import numpy as np
import pytest
import torch

from gemm_costmodel import registry
from gemm_costmodel.kernels.grouped_gemm import features as GF
from gemm_costmodel.kernels.grouped_gemm import impl as I
from gemm_costmodel.kernels.grouped_gemm import space as S
from gemm_costmodel.kernels.grouped_gemm import suites as SU
from gemm_costmodel.kernels.moe import suites as MS

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                       reason="Triton kernels need a GPU or TRITON_INTERPRET=1")


# -- space ---------------------------------------------------------------------------------------

def test_space_size_variants_and_ids():
    cfgs = S.generate_configs("sm90", "bf16")
    by = {}
    for c in cfgs:
        by[c.variant] = by.get(c.variant, 0) + 1
    assert 40 <= len(cfgs) - by["vendor"] <= 120, by
    assert set(by) == {"tiled", "persistent", "splitk", "vendor"} and by["vendor"] == 1
    assert all(S.config_from_id(c.id) == c for c in cfgs)
    assert S.DEFAULT_CONFIG.id == registry.get("grouped_gemm").default_config
    assert "grouped_mm" not in {c.id for c in S.generate_configs("sm80", "bf16")}
    assert "grouped_mm" not in {c.id for c in S.generate_configs("sm90", "fp16")}


def test_served_space_is_the_shipped_models():
    """The TMA grid is pending: the served space, its ids and its hash are those the shipped model was
    trained on (the runtime refuses a model whose space hash differs)."""
    import json

    cfgs = S.generate_configs("sm90", "bf16")
    by = {}
    for c in cfgs:
        by[c.variant] = by.get(c.variant, 0) + 1
    assert by == {"tiled": 26, "persistent": 13, "splitk": 6, "vendor": 1}
    assert S.space_hash(cfgs) == "e824b467563cb9d7"
    with open("models/grouped_gemm-sm90.json", encoding="utf-8") as fh:
        assert json.load(fh)["config_space_hash"]["bf16"] == S.space_hash(cfgs)
    assert (len(S.generate_configs("sm90", "fp16")), len(S.generate_configs("sm90", "fp32"))) == (45, 24)
    assert {S.config_generation(c) for c in cfgs} == {""}


def test_pending_tma_grid():
    pend = S.pending_configs("sm90", "bf16")
    assert [c.id for c in pend] == [
        "ggptma_m64n128k64_g8_w4s3", "ggptma_m64n128k64_g8_w4s4", "ggptma_m128n64k64_g8_w4s3",
        "ggptma_m128n64k64_g8_w4s4", "ggptma_m128n128k64_g8_w4s3", "ggptma_m128n128k64_g8_w4s4",
        "ggptma_m128n128k64_g8_w8s3", "ggptma_m128n128k64_g8_w8s4", "ggptma_m128n256k64_g8_w8s3",
        "ggptma_m256n128k64_g8_w8s3", "ggptma_m128n128k128_g8_w8s3"]
    assert all(c.variant == "persistent_tma" and S.config_from_id(c.id) == c for c in pend)
    assert all(S.config_generation(c) == "60-tma" for c in pend)
    assert not set(pend) & set(S.generate_configs("sm90", "bf16"))
    # The TMA store stages the output tile in shared memory too: 128 x 256 at 4 stages is over sm90's.
    big = S.GgPersistentTmaConfig(128, 256, 64, 8, 8, 4)
    assert S.smem_bytes(big, "bf16") == 4 * 384 * 64 * 2 + 128 * 256 * 2
    assert not S.static_feasible(big, S.ARCHS["sm90"], "bf16")[0]
    assert max(S.smem_bytes(c, "bf16") for c in pend) <= S.ARCHS["sm90"].smem_per_block
    ok, why = S.static_feasible(pend[0], S.ARCHS["sm80"], "bf16")
    assert not ok and "no TMA" in why and S.pending_configs("sm80", "bf16") == []
    assert S.config_params(pend[0])["group_m"] == 8 and S.config_params(pend[0])["split_k"] == 1
    from gemm_costmodel.kernels.space_common import VARIANT_CODES

    assert VARIANT_CODES["persistent_tma"] not in {v for k, v in VARIANT_CODES.items() if k != "persistent_tma"}


@pytest.mark.parametrize("dtype, n, k, ok", [("bf16", 104, 2048, True), ("bf16", 100, 2048, False),
                                             ("bf16", 2048, 1540, False), ("fp16", 24, 136, True),
                                             ("fp32", 36, 20, True), ("fp32", 34, 20, False),
                                             ("fp32", 36, 18, False)])
def test_tma_rule_is_16_byte_row_strides(dtype, n, k, ok):
    """Every pass's row strides are N or K elements: both times the element size must be multiples of
    16 bytes. One rule for every pass; the mask and the one-config check agree."""
    import numpy as np

    cfgs = S.pending_configs("sm90", dtype)
    for stage in S.STAGES:
        p = S.Problem(1000, n, k, dtype, 3, stage, "zipf")
        got = [S.check_feasible(c, p) for c in cfgs]
        assert all(g[0] == ok for g in got), (p.key, got)
        if not ok:
            assert "16-byte row strides" in got[0][1]
        assert (S.problem_mask(S.ConfigArrays(cfgs), p) == np.array([g[0] for g in got])).all()


def test_harness_measures_the_pending_grid_by_its_variant_only():
    from gemm_costmodel.benchmarks import harness as H

    p = S.Problem(32768, 5760, 2880, "bf16", 16, "dgrad", "balanced")
    got = H.select_candidates(p, "variant:persistent_tma", 0, op="grouped_gemm")
    assert [c.id for c in got] == [c.id for c in S.pending_configs()] + ["grouped_mm"]
    assert not any(c.variant == "persistent_tma" for mode in ("all", "sample:6")
                   for c in H.select_candidates(p, mode, 0, op="grouped_gemm"))
    # Off the rule: nothing to add (the vendor alone would repeat an earlier row).
    assert H.select_candidates(S.Problem(4096, 100, 256, "bf16", 8, "fwd"), "variant:persistent_tma", 0,
                               op="grouped_gemm") == []
    with pytest.raises(ValueError, match="unknown variant"):
        H.select_candidates(p, "variant:swapab", 0, op="grouped_gemm")


def test_rows_of_pending_configs_stay_out_of_training():
    """Rows the campaign measures while the grid is pending are the record of what ran: training and
    evaluation skip them (dataset.out_of_space) until the grid joins the space."""
    import pandas as pd

    from gemm_costmodel.data import dataset as D

    p = dict(m=32768, n=5760, k=2880, dtype="bf16", e=16, stage="dgrad", routing="balanced")
    df = pd.DataFrame([dict(p, candidate=c) for c in ("ggptma_m128n128k64_g8_w8s4", "ggpers_m128n128k64_g8_w8s4",
                                                      "grouped_mm")])
    assert D.out_of_space(df, "grouped_gemm", "sm90").tolist() == [True, False, False]


def test_tma_campaign_lines_parse_and_select_their_problems():
    """benchmarks/campaigns/grouped-gemm-tma-h200.txt: every sweep line parses as `costmodel bench`
    arguments, its --only list selects problems of its suite (the re-measure: dgrad and wgrad only),
    and the counts its comments state hold."""
    import shlex

    from gemm_costmodel import cli
    from gemm_costmodel.benchmarks import harness as H

    counts = {}
    with open("benchmarks/campaigns/grouped-gemm-tma-h200.txt", encoding="utf-8") as fh:
        lines = [ln.split(None, 1) for ln in fh if ln.strip() and not ln.startswith("#")]
    for name, rest in lines:
        if name.startswith("!"):
            assert "gg_tma_knobs.py" in rest and os.path.isfile("benchmarks/explore/gg_tma_knobs.py")
            continue
        argv = shlex.split(rest)
        opts = dict(zip(argv[::2], argv[1::2]))
        assert opts["--op"] == "grouped_gemm" and opts["--dtype"] == "bf16"

        class A:
            op, dtype, shapes, limit = "grouped_gemm", ["bf16"], None, 0
            suite, only = opts["--suite"], opts.get("--only")
        shapes = cli._shapes_from_args(A)
        if A.only:
            assert {s.stage for s in shapes} == {"dgrad", "wgrad"}
        counts[name] = (len(shapes), sum(len(H.select_candidates(s.problem, opts["--mode"], 0, op="grouped_gemm"))
                                         for s in shapes))
    assert counts == {"gg-tma-gate-h200": (63, 324), "gg-tma-eval-h200": (96, 1152), "gg-vl-eval-h200": (64, 2944),
                      "gg-vl-gate-h200": (42, 1692), "gg-vl-train-h200": (144, 1008),
                      "gg-tma-train-h200": (216, 2592)}


def test_problem_validates_its_fields():
    p = S.Problem(4096, 512, 256, "bf16", 8, "wgrad", "zipf")
    assert p.key == "bf16:4096x512x256:g8:wgrad:zipf" and p.out_shape == (8, 512, 256)
    assert p.counts().sum() == 4096 and len(p.counts()) == 8
    for bad, match in ((dict(stage="bwd"), "stage"), (dict(e=0), "e must"), (dict(routing="x"), "routing"),
                       (dict(dtype="fp8"), "dtype")):
        kw = dict(m=16, n=16, k=16, dtype="bf16", e=4, stage="fwd") | bad
        with pytest.raises(ValueError, match=match):
            S.Problem(**kw)
    spec = registry.get("grouped_gemm")
    with pytest.raises(ValueError, match="top_k=2 is not a grouped_gemm problem"):
        spec.problem(m=16, n=16, k=16, dtype="bf16", e=4, stage="fwd", top_k=2)


def test_vendor_rule_and_split_rule():
    p = S.Problem(4096, 100, 256, "bf16", 8, "fwd")
    ok, why = S.check_feasible(S.VENDOR, p)
    assert not ok and "divisible by 8" in why
    assert S.check_feasible(S.VENDOR, S.Problem(4096, 104, 256, "bf16", 8, "dgrad"))[0]
    split = S.GgSplitKConfig(128, 128, 64, 4, 4, 3)
    assert not S.check_feasible(split, S.Problem(4096, 4096, 256, "bf16", 8, "fwd"))[0]
    assert S.check_feasible(split, S.Problem(4096, 4096, 512, "bf16", 8, "fwd"))[0]


def test_fallback_rule_picks_feasible_triton_configs():
    for stage in S.STAGES:
        for m, e in ((4096, 64), (65536, 8), (7, 3)):
            p = S.Problem(m, 2048, 7168, "bf16", e, stage)
            cid = S.choose_problem(p)
            cfg = S.config_from_id(cid)
            assert cfg.variant != "vendor" and S.check_feasible(cfg, p)[0]
    # Few tokens per group: 64-row tiles for fwd/dgrad.
    assert S.config_from_id(S.choose_problem(S.Problem(4096, 2048, 7168, "bf16", 64, "fwd"))).block_m == 64


# -- suites --------------------------------------------------------------------------------------

def test_suites_sizes_families_and_passes():
    train, ev, gate = SU.training_suite(), SU.eval_suite(), SU.gate_suite()
    assert 150 <= len(train) <= 300 and 60 <= len(ev) <= 120, (len(train), len(ev))
    tf = {s.family for s in train}
    ef = {s.family for s in ev}
    assert tf <= set(MS.TRAINING_FAMILIES) and ef <= set(MS.HELDOUT_FAMILIES) and not tf & ef
    for shapes in (train, ev):
        assert {s.stage for s in shapes} == set(S.STAGES)
        assert {s.routing for s in shapes} > {"balanced"}
        assert all(4 <= s.e <= 64 and 4096 <= s.m <= 65536 for s in shapes)
        assert len({s.key for s in shapes}) == len(shapes)
    # The gate has empty groups (the vendor's among them), G = 1, and dims off every multiple of 8.
    empty = [s for s in gate if (s.problem.counts() == 0).any()]
    assert empty and any(S.check_feasible(S.VENDOR, s.problem)[0] for s in empty)
    assert any(s.e == 1 for s in gate)
    assert any(not S.check_feasible(S.VENDOR, s.problem)[0] for s in gate)
    est = SU.sweep_estimate(ev)
    assert est["problems"] == len(ev) and est["measurements"] > 40 * len(ev)


# -- kernels (interpreter) -----------------------------------------------------------------------

def _one_per_variant(problem):
    seen = {}
    for c in S.feasible_configs(problem, "sm90", include_vendor=False):
        seen.setdefault((c.variant, getattr(c, "group_m", 1) > 1), c)
    return list(seen.values())


def _check(problem, cfgs=None, seed=0):
    ops = I.make_operands(problem, "cpu", torch.Generator().manual_seed(seed))
    ref = I.reference(ops)
    for cfg in cfgs or _one_per_variant(problem):
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert y.shape == ref.shape
        err = (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()
        assert err <= I.ERROR_BOUNDS[problem.dtype], (problem.key, cfg.id, err)


@needs_interpreter
@pytest.mark.parametrize("stage", S.STAGES)
@pytest.mark.parametrize("m, n, k, e, routing", [(33, 40, 72, 4, "real2"), (7, 24, 136, 1, "balanced"),
                                                 (70, 33, 20, 3, "zipf")])
def test_kernels_equal_the_reference(stage, m, n, k, e, routing):
    """Tiled (both orders) and persistent, every pass; empty groups (real2 at M = 33 over 4), G = 1,
    M, N and K off the tiles."""
    _check(S.Problem(m, n, k, "fp32", e, stage, routing))


@needs_interpreter
@pytest.mark.parametrize("stage", S.STAGES)
def test_split_k_equals_the_reference(stage):
    """Split of the reduction (K, N, or each group's tokens) into 2 and 4 slices, some of them
    empty: launched directly on a problem smaller than the space's split rule admits."""
    p = S.Problem(45, 40, 140, "fp16", 4, stage, "real2")
    _check(p, [S.GgSplitKConfig(64, 128, 64, sk, 4, 3) for sk in (2, 4)])


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("stage", S.STAGES)
def test_split_k_configs_of_the_space_equal_the_reference(stage):
    p = S.Problem(300, 264, 260, "fp16", 5, stage, "real1")
    cfgs = [c for c in S.feasible_configs(p, include_vendor=False) if c.variant == "splitk" and c.block_m == 64]
    assert cfgs
    _check(p, cfgs)


@needs_interpreter
def test_wgrad_of_an_empty_group_is_zeros_and_nan_poisoned_output_is_overwritten():
    p = S.Problem(40, 24, 16, "fp32", 6, "wgrad", "real2")
    counts = p.counts()
    assert (counts == 0).any()
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(3))
    for cfg in _one_per_variant(p):
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert torch.isfinite(y).all()
        assert (y[torch.from_numpy(counts == 0)] == 0).all()


# -- the TMA kernels (interpreter: it emulates tensor descriptors, their bounds and alignment) --

def _tma_launches(monkeypatch) -> list:
    calls = []
    real = I._launch_tma

    def spy(cfg, stage, *args):
        calls.append((cfg.id, stage))
        return real(cfg, stage, *args)

    monkeypatch.setattr(I, "_launch_tma", spy)
    return calls


TMA_SMALL = [S.GgPersistentTmaConfig(64, 128, 64, 8, 4, 3), S.GgPersistentTmaConfig(128, 64, 64, 8, 4, 3)]


@needs_interpreter
@pytest.mark.parametrize("stage", S.STAGES)
@pytest.mark.parametrize("dtype, m, n, k, e, routing", [
    ("fp32", 33, 40, 72, 4, "real2"),     # two empty groups (the first and the last), ragged ends
    ("fp16", 7, 24, 136, 1, "balanced"),  # G = 1, M under one tile, K over two K tiles with a tail
    ("fp16", 70, 32, 24, 3, "zipf"),      # N and K under one tile
    ("fp16", 300, 264, 72, 5, "real1"),   # ~20 tiles over the interpreter's 4 programs: each loops
])
def test_tma_kernels_equal_the_reference(monkeypatch, stage, dtype, m, n, k, e, routing):
    """persistent_tma, every pass, through the TMA path (the spy sees every launch): ragged groups,
    empty groups, M, N and K off the tiles (N and K on the 16-byte rule)."""
    p = S.Problem(m, n, k, dtype, e, stage, routing)
    assert all(S.check_feasible(c, p)[0] for c in TMA_SMALL)
    calls = _tma_launches(monkeypatch)
    _check(p, TMA_SMALL)
    assert calls == [(c.id, stage) for c in TMA_SMALL]


@needs_interpreter
@pytest.mark.parametrize("stage", S.STAGES)
def test_tma_loop_knobs_keep_the_result(monkeypatch, stage):
    """The knobs gg_tma_knobs.py times (flatten off, warp specialisation on: wgrad then stores dW
    through a per-tile descriptor) compute the same."""
    monkeypatch.setattr(I, "TMA_FLATTEN", False)
    monkeypatch.setattr(I, "TMA_WARP_SPEC", True)
    calls = _tma_launches(monkeypatch)
    _check(S.Problem(45, 40, 72, "fp32", 5, stage, "real2"), TMA_SMALL)
    assert len(calls) == len(TMA_SMALL)


@needs_interpreter
def test_tma_kernels_of_the_pending_grid_equal_the_reference(monkeypatch):
    """Every fp16 TMA config of the grid, each pass, on one ragged problem with an empty group."""
    calls = _tma_launches(monkeypatch)
    for stage in S.STAGES:
        p = S.Problem(150, 48, 200, "fp16", 4, stage, "real2")
        _check(p, S.pending_configs("sm90", "fp16"))
    assert len(calls) == 3 * len(S.pending_configs("sm90", "fp16"))


@needs_interpreter
def test_tma_wgrad_of_empty_groups_is_zeros_and_rows_past_a_group_are_not_written(monkeypatch):
    calls = _tma_launches(monkeypatch)
    p = S.Problem(40, 24, 16, "fp32", 6, "wgrad", "real2")
    counts = p.counts()
    assert (counts == 0).any()
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(3))
    for cfg in TMA_SMALL:
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert torch.isfinite(y).all() and (y[torch.from_numpy(counts == 0)] == 0).all()
    # fwd: rows past offs[-1] belong to no group and stay as they were (the store descriptor of the
    # last group ends at its last row).
    x, w = torch.randn(20, 16), torch.randn(2, 8, 16)
    offs = torch.tensor([5, 13], dtype=torch.int32)
    out = torch.full((20, 8), 7.0)
    I.launch(TMA_SMALL[0], "fwd", x, w, offs, out)
    assert (out[13:] == 7.0).all()
    torch.testing.assert_close(out[:13], I.pass_reference("fwd", x, w, offs)[:13], rtol=1e-5, atol=1e-5)
    assert len(calls) == 3


@needs_interpreter
@pytest.mark.parametrize("stage", ["fwd", "dgrad"])
def test_an_empty_groups_weights_are_never_read(monkeypatch, stage):
    """W of an empty group filled with NaN leaves every output finite and right. For the TMA kernel it
    checks W's descriptor is cut after W_g: dgrad's reduction tail (N = 40 is off the 64-deep K tile)
    would otherwise read the next expert's rows, and 0 x NaN is NaN."""
    calls = _tma_launches(monkeypatch)
    p = S.Problem(33, 40, 72, "fp32", 4, stage, "real2")
    counts = p.counts()
    assert counts[0] == 0 and counts[-1] == 0 and counts[-2] > 0
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(5))
    ops.b[torch.from_numpy(counts == 0)] = float("nan")
    ref = I.reference(ops)
    assert torch.isfinite(ref).all()
    for cfg in TMA_SMALL + _one_per_variant(p):
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        assert torch.isfinite(y).all(), cfg.id
        assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() <= I.ERROR_BOUNDS["fp32"]
    assert len(calls) == len(TMA_SMALL)


@needs_interpreter
def test_tma_config_on_an_unaligned_view_runs_the_pointer_kernel(monkeypatch):
    """A base address off 16 bytes (a view at an odd offset) cannot be a descriptor's: the launch runs
    the persistent pointer kernel of the same tile instead, and is still right."""
    calls = _tma_launches(monkeypatch)
    p = S.Problem(33, 40, 72, "fp32", 4, "fwd", "real2")
    ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(0))
    a = torch.empty(ops.a.numel() + 1)[1:].view_as(ops.a).copy_(ops.a)
    assert a.is_contiguous() and a.data_ptr() % 16 and not I.tma_operands_ok(a, ops.b, ops.out)
    assert I.tma_operands_ok(ops.a, ops.b, ops.out)
    y = I.launch(TMA_SMALL[0], "fwd", a, ops.b, ops.offs, ops.out)
    ref = I.reference(ops)
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() <= I.ERROR_BOUNDS["fp32"]
    assert calls == []


def test_tma_launch_arguments():
    """What a TMA launch passes (checked without a GPU): one program per SM at most, the worst-case
    schedule of fwd/dgrad as for `persistent`, wgrad's G x tiles, the pass's output width and
    reduction, the loop knobs."""
    cfg = S.GgPersistentTmaConfig(128, 256, 64, 8, 8, 3)
    offs = torch.tensor([100, 100, 1000], dtype=torch.int32)
    x, w, dy = torch.empty(1000, 512), torch.empty(3, 768, 512), torch.empty(1000, 768)
    knobs = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, FLATTEN=I.TMA_FLATTEN, WARP_SPEC=I.TMA_WARP_SPEC,
                 num_warps=8, num_stages=3)
    assert I.TMA_FLATTEN is True and I.TMA_WARP_SPEC is False
    grid, kw = I.tma_launch_args(cfg, "fwd", x, w, offs, 132)
    assert grid == (33,) and kw == dict(M=1000, N_OUT=768, RED=512, G=3, NUM_PROGRAMS=33, G_PAD=16, FWD=True, **knobs)
    grid, kw = I.tma_launch_args(cfg, "dgrad", dy, w, offs, 16)
    assert grid == (16,) and kw == dict(M=1000, N_OUT=512, RED=768, G=3, NUM_PROGRAMS=16, G_PAD=16, FWD=False, **knobs)
    grid, kw = I.tma_launch_args(cfg, "wgrad", dy, x, offs, 132)
    assert grid == (36,) and kw == dict(N=768, K=512, G=3, NUM_PROGRAMS=36, **knobs)


def test_tma_allocator_is_set_where_none_is_and_kept_where_one_is():
    """Triton asks its allocator for the descriptors' workspace at launch; it sits in a ContextVar,
    so a fresh context (a backward thread) has none until the launch sets ours."""
    import contextvars

    import triton
    from triton.runtime import _allocation as A

    def body():
        assert isinstance(A._allocator.get(), A.NullAllocator)
        I.ensure_tma_allocator()
        assert A._allocator.get() is I._tma_workspace
        mine = lambda size, align, stream: None  # noqa: E731
        triton.set_allocator(mine)
        I.ensure_tma_allocator()
        assert A._allocator.get() is mine

    contextvars.Context().run(body)


def test_vendor_equals_the_reference_where_torch_has_grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm missing")
    for stage in S.STAGES:
        p = S.Problem(40, 24, 32, "bf16", 4, stage, "real2")
        ops = I.make_operands(p, "cpu", torch.Generator().manual_seed(0))
        ref = I.reference(ops)
        y = ops.run(S.VENDOR)
        assert (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item() <= 1e-2


def test_check_operands_names_the_argument():
    x, w = torch.randn(10, 8), torch.randn(3, 6, 8)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)
    assert I.check_operands("fwd", x, w, offs) == ""
    assert I.check_operands("dgrad", torch.randn(10, 6), w, offs) == ""
    assert I.check_operands("wgrad", torch.randn(10, 6), x, offs) == ""
    assert "stage" in I.check_operands("bwd", x, w, offs)
    assert "offs" in I.check_operands("fwd", x, w, offs.long())
    assert "G = offs' 3" in I.check_operands("fwd", x, w[:2], offs)
    assert "K = 8" in I.check_operands("fwd", torch.randn(10, 7), w, offs)
    assert "dtype" in I.check_operands("fwd", x.half(), w, offs)
    assert "x must be 2-D (M, K)" in I.check_operands("wgrad", torch.randn(10, 6), torch.randn(9, 8), offs)


# -- features ------------------------------------------------------------------------------------

def test_features_frame_and_problem_agree_and_are_finite():
    import pandas as pd

    from gemm_costmodel.serving import features as F

    p = S.Problem(4096, 1024, 2048, "bf16", 16, "wgrad", "zipf")
    cfgs = S.generate_configs("sm90", "bf16")
    rows = [dict(m=p.m, n=p.n, k=p.k, e=p.e, top_k=1, stage=p.stage, routing=p.routing, **S.config_params(c))
            for c in cfgs]
    df = pd.DataFrame(rows)
    fx = GF.frame_inputs(df)
    px = GF.problem_inputs(p.m, p.e, 1, df["block_m"].to_numpy(), stage=p.stage, routing=p.routing)
    for name in GF.INPUTS:
        assert np.allclose(fx[name], px[name]), name
    assert GF.NAMES == registry.get("grouped_gemm").extra_features
    assert len(F.feature_names("grouped_gemm")) == len(set(F.feature_names("grouped_gemm")))
    with pytest.raises(ValueError, match="stage"):
        GF.problem_inputs(16, 4, 1, [64], stage="gate_up")


# -- the torch op --------------------------------------------------------------------------------

def _reference_grads(x, w, offs):
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    ends = offs.tolist()
    outs, start = [], 0
    for g, end in enumerate(ends):
        outs.append(xr[start:end] @ wr[g].T)
        start = end
    y = torch.cat(outs)
    return y, xr, wr


@needs_interpreter
@pytest.mark.parametrize("m, e, routing", [(33, 4, "real2"), (7, 1, "balanced"), (20, 5, "zipf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_linear_matches_torch_autograd(m, e, routing, dtype):
    from gemm_costmodel.kernels.grouped_gemm import torch_op as T

    n, k = 24, 40
    gen = torch.Generator().manual_seed(m)
    counts = S.Problem(m, n, k, "fp32", e, "fwd", routing).counts()
    offs = I.group_offsets(counts, "cpu")
    x = torch.randn(m, k, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(e, n, k, generator=gen) * k ** -0.5).to(dtype).requires_grad_()
    gy = torch.randn(m, n, generator=gen).to(dtype)
    y = T.grouped_linear(x, w, offs)
    y.backward(gy)
    yr, xr, wr = _reference_grads(x, w, offs)
    yr.backward(gy.double())
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y.double(), yr, **tol)
    torch.testing.assert_close(x.grad.double(), xr.grad, **tol)
    torch.testing.assert_close(w.grad.double(), wr.grad, **tol)
    if (counts == 0).any():
        assert (w.grad[torch.from_numpy(counts == 0)] == 0).all()


@needs_interpreter
def test_grouped_linear_uses_the_injected_decision_per_pass():
    from gemm_costmodel.kernels.grouped_gemm import torch_op as T

    asked = []

    def decide(problem):
        asked.append(problem.stage)
        return {"fwd": "gg_m64n128k64_g1_w4s3", "dgrad": "ggpers_m64n128k64_g8_w4s3",
                "wgrad": "grouped_mm"}[problem.stage]  # the vendor on CPU falls back to the rule

    offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    x = torch.randn(12, 16, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    with T.using_decide(decide):
        T.grouped_linear(x, w, offs).sum().backward()
    assert sorted(asked) == ["dgrad", "fwd", "wgrad"]
    assert T.pick("wgrad", 12, 8, 16, 3, torch.float32, torch.device("cpu")).variant != "vendor"
    with pytest.raises(ValueError, match="callable"):
        T.set_decide(3)


@needs_interpreter
def test_grouped_linear_traces_under_torch_compile():
    from gemm_costmodel.kernels.grouped_gemm import torch_op as T

    offs = torch.tensor([4, 4, 9], dtype=torch.int32)
    x = torch.randn(9, 16, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    f = torch.compile(lambda a, b: T.grouped_linear(a, b, offs).square().sum(), backend="aot_eager", fullgraph=True)
    f(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    T.grouped_linear(x, w, offs).square().sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def test_precompile_probe_compiles_the_same_kernels():
    for p in (S.Problem(32768, 5760, 2880, "bf16", 16, "fwd"), S.Problem(4096, 1000, 260, "bf16", 3, "dgrad", "zipf")):
        q = S.probe_problem(p)
        assert S.specialisation(q) == S.specialisation(p)
        for bk in (64, 128):
            assert (q.k % bk == 0) == (p.k % bk == 0) and (q.n % bk == 0) == (p.n % bk == 0)


def test_report_section_per_pass_and_per_step():
    import pandas as pd

    from gemm_costmodel.kernels.grouped_gemm import baselines as B

    rows = []
    for method, f in (("model", 1.0), ("best_static", 1.1)):
        for stage in S.STAGES:
            for routing in ("balanced", "zipf"):
                rows.append(dict(gpu_name="H200", dtype="bf16", m=4096, n=512, k=256, e=8, routing=routing,
                                 stage=stage, method=method, pick_us=10.0 * f, oracle_us=10.0, cublas_us=11.0))
    text = B.report_section(pd.DataFrame(rows))
    assert "| wgrad" in text and "skewed" in text and "geomean 1.100x" in text
    assert B.picks(None, None) == {}
    assert "lack the columns" in B.report_section(pd.DataFrame({"method": ["model"]}))
