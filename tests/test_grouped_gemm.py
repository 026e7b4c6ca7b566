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
