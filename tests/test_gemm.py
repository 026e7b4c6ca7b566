"""Interpreter correctness of the Triton GEMM family, and the correctness gate itself."""
import math

import pytest
import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.gemm import kernel as gemm
from gemm_costmodel.kernels.gemm.space import (DTYPE_BYTES, GEMV_MAX_M, OUT_DTYPE, GemvConfig, PersistentConfig, Problem,
                                                 SplitKConfig, SwapABConfig, SwapABTmaConfig, TiledConfig,
                                                 VendorConfig, check_feasible, gemv_rows, swapab_tokens)

from conftest import operands_for

# Weird small shapes: M in {1, 7, 33} plus one M=65; N and K not multiples of
# 16/64 (ragged tiles, masked K tail), and one even-K shape (EVEN_K=True path).
SHAPES = [
    (1, 40, 72),
    (1, 33, 136),
    (7, 33, 100),
    (7, 72, 72),
    (7, 64, 128),   # K % 64 == 0: unmasked main loop
    (33, 72, 136),
    (33, 40, 100),
    (65, 40, 72),
]
DTYPES = ["fp16", "fp32"]  # the interpreter's bf16 tl.dot is garbage

CONFIGS = [
    TiledConfig(16, 32, 64, 8, 4, 3),
    TiledConfig(32, 64, 32, 2, 4, 3),      # GROUP_M=2: a partial last group when cdiv(M, 32) is odd
    SplitKConfig(16, 32, 64, 2, 4, 3),
    SplitKConfig(16, 32, 32, 3, 4, 3),     # uneven K slices (e.g. 4 k-tiles over 3 programs)
    PersistentConfig(64, 64, 64, 8, 4, 3),
    PersistentConfig(16, 32, 64, 2, 4, 3), # more tiles than the 4 CPU "SMs": programs stride
    # Swap-AB: 16 tokens serve M=1 and 7, 64 serve M=33; M=65 is not a decode shape.
    SwapABConfig(16, 32, 32, 1, 4, 3),
    SwapABConfig(16, 32, 32, 3, 4, 3),     # split-K in one launch, uneven K slices
    SwapABConfig(64, 32, 64, 2, 4, 3),
    SwapABTmaConfig(16, 32, 32, 2, 4, 3),
    SwapABTmaConfig(64, 32, 32, 1, 4, 3),
    # GEMV (M <= 2; here the M = 1 shapes): one warp keeps the interpreter's tiles small.
    GemvConfig(1, 4, 64, 1, 1, 1),
    GemvConfig(1, 8, 32, 3, 1, 1),         # split-K in one launch, uneven K slices, masked K tail
]


def _ids(val):
    if isinstance(val, tuple):
        return "x".join(map(str, val))
    return getattr(val, "id", str(val))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_variant_matches_reference(cfg, shape, dtype):
    m, n, k = shape
    prob, ops, ref = operands_for(m, n, k, dtype)
    ok, why = check_feasible(cfg, prob)
    if isinstance(cfg, PersistentConfig):
        misaligned = (k * DTYPE_BYTES[dtype]) % 16 != 0 or (n * DTYPE_BYTES[OUT_DTYPE[dtype]]) % 16 != 0
        assert ok == (not misaligned), why
    if isinstance(cfg, SwapABConfig):
        # y is stored through pointers, so only TMA's K rows need alignment, never N.
        misaligned = isinstance(cfg, SwapABTmaConfig) and (k * DTYPE_BYTES[dtype]) % 16 != 0
        too_few_k_tiles = -(-k // cfg.block_k) < cfg.split_k
        assert ok == (m <= 64 and cfg.block_m == swapab_tokens(m) and not misaligned
                      and not too_few_k_tiles), why
    if isinstance(cfg, GemvConfig):
        too_few_k_tiles = -(-k // cfg.block_k) < cfg.split_k
        short_k = cfg.num_stages > 1 and k < cfg.num_stages * cfg.block_k
        assert ok == (m <= GEMV_MAX_M and cfg.block_m == gemv_rows(m) and not too_few_k_tiles and not short_k), why
    if not ok:
        pytest.skip(f"infeasible: {why}")
    status, err, detail = C.gate(cfg, ops, ref, dtype)
    assert status == C.STATUS_OK, detail
    assert err < C.ERROR_BOUNDS[dtype]
    # The gate poisons the output with NaN first, so "ok" also means every element was written.
    assert torch.isfinite(ops.out.float()).all()
    assert ops.out.dtype == gemm.TORCH_DTYPES[dtype]


SPLITK_CONFIGS = [c for c in CONFIGS if isinstance(c, SplitKConfig)]
# Every kernel that reduces its K slices in one launch through the arrival counters.
ONE_LAUNCH_SPLIT_CONFIGS = SPLITK_CONFIGS + [c for c in CONFIGS if isinstance(c, SwapABConfig)
                                             and c.split_k > 1 and c.block_m == 64] + \
    [c for c in CONFIGS if isinstance(c, GemvConfig) and c.split_k > 1]
PERSISTENT_CONFIGS = [c for c in CONFIGS if isinstance(c, PersistentConfig)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cfg", SPLITK_CONFIGS, ids=_ids)
def test_splitk_two_launch_path_matches_reference(monkeypatch, cfg, shape, dtype):
    """The partials + reduce-kernel split-K (SPLITK_SERIAL=False); the default is tested above."""
    monkeypatch.setattr(gemm, "SPLITK_SERIAL", False)
    prob, ops, ref = operands_for(*shape, dtype)
    assert check_feasible(cfg, prob)[0]
    status, err, detail = C.gate(cfg, ops, ref, dtype)
    assert status == C.STATUS_OK, detail
    assert err < C.ERROR_BOUNDS[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cfg", PERSISTENT_CONFIGS, ids=_ids)
def test_persistent_nested_loop_matches_reference(monkeypatch, cfg, shape, dtype):
    """The persistent kernel without the flattened tile loop (PERSISTENT_FLATTEN=False)."""
    monkeypatch.setattr(gemm, "PERSISTENT_FLATTEN", False)
    prob, ops, ref = operands_for(*shape, dtype)
    ok, why = check_feasible(cfg, prob)
    if not ok:
        pytest.skip(f"infeasible: {why}")
    status, err, detail = C.gate(cfg, ops, ref, dtype)
    assert status == C.STATUS_OK, detail
    assert err < C.ERROR_BOUNDS[dtype]


@pytest.mark.parametrize("programs", [1, 2, 3, 5])
def test_persistent_any_program_count_covers_every_tile(programs):
    """Programs stride over the tiles by a runtime step: with fewer programs than the
    33x72 output's 3x3 tiles (16x32 blocks), every tile is still written once."""
    cfg = PersistentConfig(16, 32, 32, 8, 4, 3)
    prob, ops, ref = operands_for(33, 72, 136, "fp32")
    ops.out.fill_(float("nan"))
    y = gemm.launch_persistent(cfg, ops.x, ops.w, ops.out, ops.x, ops.x, False, programs=programs)
    ok, err, why = C.check_output(y, ref, "fp32")
    assert ok, why


def test_persistent_program_count_is_not_compiled_in():
    """min(SMs, tiles) differs between shapes; as a constexpr or a specialised int it made
    every shape with fewer tiles than SMs recompile each persistent config mid-sweep."""
    import inspect

    kernel = gemm.gemm_persistent_kernel  # an InterpretedFunction under TRITON_INTERPRET=1
    param = inspect.signature(kernel.fn).parameters["NUM_PROGRAMS"]
    assert param.annotation is inspect.Parameter.empty  # not tl.constexpr
    assert "NUM_PROGRAMS" in kernel.kwargs["do_not_specialize"]  # no ==1 / %16 variants either


@pytest.mark.parametrize("cfg", ONE_LAUNCH_SPLIT_CONFIGS, ids=_ids)
def test_splitk_one_launch_leaves_arrival_counters_zero(monkeypatch, cfg):
    """The one-launch split-K must reset its per-tile counters, or the next launch never stores y."""
    monkeypatch.setattr(gemm, "SPLITK_SERIAL", True)
    # The GEMV runs M <= GEMV_MAX_M in the space, and its interpreter time grows with M (33 rows
    # took ~20 s on a 2-core machine); 2 rows still launch every split and tile on the counters.
    m = 2 if isinstance(cfg, GemvConfig) else 33
    prob, ops, ref = operands_for(m, 72, 136, "fp32")
    for _ in range(3):  # repeated launches on the same counters
        status, err, detail = C.gate(cfg, ops, ref, "fp32")
        assert status == C.STATUS_OK, detail
        counters = gemm._arrival_counters(ops.x.device, 1)
        assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_vendor_fp16_matches_reference(shape):
    m, n, k = shape
    prob, ops, ref = operands_for(m, n, k, "fp16")
    assert check_feasible(VendorConfig(), prob) == (True, "")
    status, err, detail = C.gate(VendorConfig(), ops, ref, "fp16")
    assert status == C.STATUS_OK, detail
    assert err < C.ERROR_BOUNDS["fp16"]


def test_vendor_infeasible_for_fp32():
    ok, why = check_feasible(VendorConfig(), Problem(7, 40, 72, "fp32"))
    assert not ok and "bf16/fp16/fp8" in why


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_persistent_infeasible_exactly_when_misaligned(shape, dtype):
    m, n, k = shape
    prob = Problem(m, n, k, dtype)
    misaligned_k = (k * DTYPE_BYTES[dtype]) % 16 != 0
    misaligned_n = (n * DTYPE_BYTES[OUT_DTYPE[dtype]]) % 16 != 0
    ok, why = check_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), prob)
    assert ok == (not (misaligned_k or misaligned_n))
    if misaligned_k:
        assert "K * element size" in why
    elif misaligned_n:
        assert "N * output element size" in why


def test_shape_list_exercises_both_alignment_outcomes():
    """The persistent check above is only meaningful if both outcomes occur."""
    outcomes = {check_feasible(PersistentConfig(64, 64, 64, 8, 4, 3), Problem(m, n, k, d))[0]
                for (m, n, k) in SHAPES for d in DTYPES}
    assert outcomes == {True, False}


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[4]], ids=_ids)
def test_launch_allocates_output_and_matches_reference(cfg):
    prob, ops, ref = operands_for(33, 72, 136, "fp16")
    y = gemm.launch(cfg, ops.x, ops.w)
    assert y.shape == (33, 72) and y.dtype == torch.float16
    ok, err, why = C.check_output(y, ref, "fp16")
    assert ok, why


def test_launch_writes_into_given_out():
    prob, ops, ref = operands_for(7, 40, 72, "fp32")
    out = torch.full((7, 40), float("nan"), dtype=torch.float32)
    y = gemm.launch(TiledConfig(16, 32, 64, 8, 4, 3), ops.x, ops.w, out=out)
    assert y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_small_integer_gemm_exact():
    """Known answer: integer-valued fp32 inputs give the exact integer product."""
    x = torch.arange(7 * 72, dtype=torch.float32).reshape(7, 72) % 5 - 2
    w = torch.arange(40 * 72, dtype=torch.float32).reshape(40, 72) % 3 - 1
    expected = (x.double() @ w.double().t()).float()
    for cfg in (TiledConfig(16, 32, 64, 8, 4, 3), SplitKConfig(16, 32, 32, 3, 4, 3),
                PersistentConfig(16, 32, 64, 2, 4, 3)):
        y = gemm.launch(cfg, x, w)
        assert torch.equal(y, expected), cfg.id


# ----------------------------------------------------------------------------
# The correctness gate
# ----------------------------------------------------------------------------

def test_make_operands_deterministic_and_nonzero():
    _, a, _ = operands_for(7, 40, 72, "fp16", seed=3)
    _, b, _ = operands_for(7, 40, 72, "fp16", seed=3)
    _, c, _ = operands_for(7, 40, 72, "fp16", seed=4)
    assert torch.equal(a.x, b.x) and torch.equal(a.w, b.w)
    assert not torch.equal(a.x, c.x)
    assert a.x.dtype == a.w.dtype == torch.float16
    assert a.x.shape == (7, 72) and a.w.shape == (40, 72) and a.out.shape == (7, 40)
    assert (a.x != 0).any() and (a.w != 0).any()
    assert a.nbytes == (7 * 72 + 40 * 72 + 7 * 40) * 2


def test_seed_for_is_sha256_of_key():
    import hashlib

    prob = Problem(7, 40, 72, "fp16")
    want = int.from_bytes(hashlib.sha256(b"fp16:7x40x72/5").digest()[:4], "little")
    assert C.seed_for(prob, 5) == want


def test_gate_reports_wrong_for_one_unwritten_element(monkeypatch):
    prob, ops, ref = operands_for(7, 40, 72, "fp16")

    def run_but_skip_one(self, cfg):
        # Write every element except (3, 5), which keeps the gate's NaN poison.
        full = ref.to(self.out.dtype)
        mask = torch.ones_like(full, dtype=torch.bool)
        mask[3, 5] = False
        self.out[mask] = full[mask]
        return self.out

    monkeypatch.setattr(C.Operands, "run", run_but_skip_one)
    status, err, detail = C.gate(TiledConfig(16, 32, 64, 8, 4, 3), ops, ref, "fp16")
    assert status == C.STATUS_WRONG
    assert math.isnan(err)
    assert detail == "1 elements unwritten or non-finite"


@pytest.mark.parametrize("scale,expected", [(1.01, C.STATUS_WRONG), (1.0005, C.STATUS_OK)])
def test_gate_scaled_result(monkeypatch, scale, expected):
    prob, ops, ref = operands_for(7, 40, 72, "fp32")
    monkeypatch.setattr(C.Operands, "run", lambda self, cfg: self.out.copy_(ref * scale))
    status, err, detail = C.gate(TiledConfig(16, 32, 64, 8, 4, 3), ops, ref, "fp32")
    assert status == expected
    assert err == pytest.approx(scale - 1, rel=1e-3)
    if expected == C.STATUS_WRONG:
        assert detail.startswith("relative error") and "> 0.002" in detail


def test_gate_maps_launch_exception_to_status(monkeypatch):
    prob, ops, ref = operands_for(7, 40, 72, "fp16")

    class OutOfResources(Exception):
        pass

    def boom(self, cfg):
        raise OutOfResources("shared memory, Required: 300000, Hardware limit: 232448")

    monkeypatch.setattr(C.Operands, "run", boom)
    status, err, detail = C.gate(TiledConfig(16, 32, 64, 8, 4, 3), ops, ref, "fp16")
    assert status == C.STATUS_OUT_OF_RESOURCES
    assert math.isnan(err)
    assert detail.startswith("OutOfResources: shared memory")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_check_output_counts_inf_and_nan_and_rejects_huge_values(dtype):
    ref = torch.randn(33, 17, generator=torch.Generator().manual_seed(0))
    y = ref.to(dtype)
    assert C.check_output(y, ref, "bf16")[0]
    bad = y.clone()
    bad[0, 0], bad[32, 16] = float("inf"), float("nan")
    ok, err, why = C.check_output(bad, ref, "bf16")
    assert not ok and math.isnan(err) and why == "2 elements unwritten or non-finite"
    # Finite but far off (the squared error overflows fp32): wrong, with its error.
    huge = y.clone()
    huge[5, 5] = 6e4 if dtype == torch.float16 else 3e38
    ok, err, why = C.check_output(huge, ref, "bf16")
    assert not ok and err > 1e-2 and why.startswith("relative error")


def test_check_output_keeps_the_reference_norm():
    ref = torch.full((4, 4), 2.0)
    assert C.check_output(ref * 1.001, ref, "fp32") == (True, pytest.approx(1e-3, rel=1e-3), "")
    assert ref._costmodel_fro == pytest.approx(8.0)


def test_check_output_shape_mismatch():
    ok, err, why = C.check_output(torch.zeros(2, 3), torch.zeros(3, 2), "fp32")
    assert not ok and math.isnan(err) and why == "shape (2, 3) != (3, 2)"


def test_classify_exception():
    class OutOfResources(Exception):
        pass

    class AcceleratorError(Exception):
        pass

    assert C.classify_exception(OutOfResources("whatever")) == C.STATUS_OUT_OF_RESOURCES
    assert C.classify_exception(RuntimeError("out of resource: shared memory")) == C.STATUS_OUT_OF_RESOURCES
    assert C.classify_exception(RuntimeError("boom")) == C.STATUS_COMPILE_ERROR
    assert C.classify_exception(ValueError("bad constexpr")) == C.STATUS_COMPILE_ERROR
    assert C.classify_exception(RuntimeError("CUDA error: an illegal memory access")) == C.STATUS_CRASH
    assert C.classify_exception(AcceleratorError("x")) == C.STATUS_CRASH


def test_classify_triton_out_of_resources():
    from triton.runtime.errors import OutOfResources

    exc = OutOfResources(300000, 232448, "shared memory")
    assert C.classify_exception(exc) == C.STATUS_OUT_OF_RESOURCES


# ----------------------------------------------------------------------------
# check_operands
# ----------------------------------------------------------------------------

def _xw(m=7, n=40, k=72, dtype=torch.float16):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)


def test_check_operands_accepts_valid():
    x, w = _xw()
    assert gemm.check_operands(x, w) == "fp16"
    assert gemm.check_operands(*_xw(dtype=torch.float32)) == "fp32"


def test_check_operands_k_mismatch():
    x, _ = _xw(k=72)
    _, w = _xw(k=64)
    with pytest.raises(ValueError, match=r"K mismatch: x is \(7, 72\), w is \(40, 64\)"):
        gemm.check_operands(x, w)


def test_check_operands_dtype_mismatch():
    x, w = _xw()
    with pytest.raises(ValueError, match="dtype mismatch: x is torch.float16, w is torch.float32"):
        gemm.check_operands(x, w.float())


def test_check_operands_noncontiguous_w():
    x, _ = _xw()
    w = torch.randn(72, 40).to(torch.float16).t()  # (40, 72) view, column-major
    assert w.shape == (40, 72) and not w.is_contiguous()
    with pytest.raises(ValueError, match="w must be contiguous"):
        gemm.check_operands(x, w)


def test_check_operands_noncontiguous_x():
    x = torch.randn(72, 7).to(torch.float16).t()
    _, w = _xw()
    with pytest.raises(ValueError, match="x must be contiguous"):
        gemm.check_operands(x, w)


def test_check_operands_1d_input():
    _, w = _xw()
    x = torch.randn(72).to(torch.float16)
    with pytest.raises(ValueError, match=r"2-D, got x.dim\(\)=1, w.dim\(\)=2"):
        gemm.check_operands(x, w)


def test_check_operands_unsupported_dtype():
    x, w = _xw(dtype=torch.float64)
    with pytest.raises(ValueError, match="unsupported dtype torch.float64"):
        gemm.check_operands(x, w)


def test_check_operands_fp8_scales():
    x, w = _xw(dtype=torch.float8_e4m3fn)
    one = torch.ones(1, dtype=torch.float32)
    with pytest.raises(ValueError, match="scale_a must be a one-element float32 tensor"):
        gemm.check_operands(x, w)
    with pytest.raises(ValueError, match="scale_b must be a one-element float32 tensor"):
        gemm.check_operands(x, w, scale_a=one)
    with pytest.raises(ValueError, match="scale_b must be a one-element float32 tensor"):
        gemm.check_operands(x, w, scale_a=one, scale_b=torch.ones(1, dtype=torch.float16))
    with pytest.raises(ValueError, match="scale_a must be a one-element float32 tensor"):
        gemm.check_operands(x, w, scale_a=torch.ones(2), scale_b=one)
    assert gemm.check_operands(x, w, scale_a=one, scale_b=one) == "fp8"


def test_alloc_output_dtypes():
    x, w = _xw(dtype=torch.float8_e4m3fn)
    assert gemm.alloc_output(x, w).dtype == torch.bfloat16  # fp8 writes bf16
    x, w = _xw(dtype=torch.float16)
    out = gemm.alloc_output(x, w)
    assert out.dtype == torch.float16 and out.shape == (7, 40)


def test_reference_applies_fp8_scales():
    x = torch.full((2, 16), 2.0).to(torch.float8_e4m3fn)
    w = torch.full((3, 16), 0.5).to(torch.float8_e4m3fn)
    y = gemm.reference(x, w, torch.tensor([0.25]), torch.tensor([4.0]))
    assert torch.equal(y, torch.full((2, 3), 16.0))  # 16 * (2*0.5) * (0.25*4)


def test_gate_and_time_times_only_what_passes_the_gate():
    from gemm_costmodel.kernels.timing import FakeTimer

    prob, ops, ref = operands_for(7, 40, 72, "fp32")
    cfg = TiledConfig(16, 32, 64, 8, 4, 3)
    timer = FakeTimer(lambda key: 12.5)
    assert C.gate_and_time(timer, cfg, lambda o: o.run(cfg), [ops], ref, "fp32") == (12.5, "")
    assert timer.calls == 1
    # A kernel that leaves half the output unwritten fails the gate and is never timed.
    def half(o):
        y = o.run(cfg)
        y[:, 20:] = float("nan")
        return y
    t, why = C.gate_and_time(timer, cfg, half, [ops], ref, "fp32")
    assert t is None and why.startswith("wrong:") and "unwritten" in why
    assert timer.calls == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,rows", [(2, 2), (3, 4), (4, 4)])
@pytest.mark.parametrize("split", [1, 2])
def test_gemv_token_rows_cover_m(m, rows, split, dtype):
    """M = 2-4 on 2 or 4 token rows: at M = 3 the fourth row re-reads row 2 and is never
    stored (the gate's NaN poison would show a stray or missing store)."""
    cfg = GemvConfig(rows, 4, 64, split, 1, 1)
    prob, ops, ref = operands_for(m, 37, 200, dtype)
    assert check_feasible(cfg, prob)[0] == (m <= GEMV_MAX_M)
    assert not check_feasible(GemvConfig(1, 4, 64, split, 1, 1), prob)[0]
    status, err, detail = C.gate(cfg, ops, ref, dtype)
    assert status == C.STATUS_OK, detail
    assert err < C.ERROR_BOUNDS[dtype]


def test_gemv_launch_beyond_its_rows_is_still_correct():
    """Feasibility keeps GEMV to M <= GEMV_MAX_M with the one row count that covers M, but a launch
    with more tokens (M = 7 here) takes more row blocks and stays correct."""
    prob, ops, ref = operands_for(7, 20, 300, "fp32")
    for cfg in (GemvConfig(1, 4, 64, 1, 1, 1), GemvConfig(2, 4, 64, 3, 1, 1), GemvConfig(4, 8, 32, 2, 1, 1)):
        assert not check_feasible(cfg, prob)[0]
        status, err, detail = C.gate(cfg, ops, ref, "fp32")
        assert status == C.STATUS_OK, (cfg.id, detail)


def test_gemv_is_compiled_per_weight_shape_and_stays_correct_across_shapes():
    """N, K and the strides are compile-time constants of the GEMV: one config launched on weights
    of different shapes in turn (and on a strided token view) must compile for each and never
    reuse another shape's kernel (a reused one would read the wrong rows or stop short of K)."""
    cfg = GemvConfig(1, 4, 64, 1, 1, 1)
    for n, k in ((37, 200), (16, 256), (37, 264), (5, 64)):
        prob, ops, ref = operands_for(1, n, k, "fp32")
        status, err, detail = C.gate(cfg, ops, ref, "fp32")
        assert status == C.STATUS_OK, (n, k, detail)
    x = torch.randn(2, 300, dtype=torch.float16)[:, :200]  # row stride 300, not K
    w = torch.randn(37, 200, dtype=torch.float16)
    y = gemm.launch(GemvConfig(2, 4, 64, 1, 1, 1), x, w)
    torch.testing.assert_close(y.float(), x.float() @ w.float().T, rtol=2e-3, atol=2e-3)


def test_precompile_probes_a_shape_specialised_config_on_its_own_weight_shape():
    """The GEMV compiles per (N, K): its precompile task probes the problem's N and K (at M = 1),
    once per weight shape, while an MMA config keeps one task per divisibility class; the
    tasks of one probe sit together, and chunks split no probe's tasks that fit a worker's share."""
    from gemm_costmodel.benchmarks import precompile as P
    from gemm_costmodel.kernels.gemm.space import TiledConfig

    gemv, tiled = GemvConfig(1, 4, 1024, 1, 4, 1), TiledConfig(64, 64, 64, 8, 4, 3)
    probs = [Problem(1, 4096, 4096, "bf16"), Problem(2, 4096, 4096, "bf16"), Problem(1, 8192, 4096, "bf16")]
    tasks = P.plan([(p, [tiled, gemv, GemvConfig(2, 4, 1024, 1, 4, 1)]) for p in probs])
    gemv_tasks = [(cid, (f["m"], f["n"], f["k"])) for cid, f in tasks if cid.startswith("gemv")]
    assert sorted(gemv_tasks) == sorted([(gemv.id, (1, 4096, 4096)), ("gemv_m2n4k1024_s1_w4s1", (1, 4096, 4096)),
                                         (gemv.id, (1, 8192, 4096)), ("gemv_m2n4k1024_s1_w4s1", (1, 8192, 4096))])
    # N = 4096 and 8192 agree in divisibility: one tiled task for all three problems.
    assert [cid for cid, _ in tasks].count(tiled.id) == 1
    probes = [tuple(sorted(f.items())) for _, f in tasks]
    assert all(probes.index(pr) == i or probes[i - 1] == pr for i, pr in enumerate(probes)), "probes interleave"
    chunks = P.chunks_for(tasks, 2)
    flat = lambda ts: sorted((cid, tuple(sorted(f.items()))) for cid, f in ts)  # noqa: E731
    assert flat(t for c in chunks for t in c) == flat(tasks)
    owner = {}
    for i, c in enumerate(chunks):
        for _, f in c:
            assert owner.setdefault(tuple(sorted(f.items())), i) == i, "a probe split over chunks"


def test_precompile_cuts_a_probe_larger_than_a_workers_share():
    """One probe of 2,496 tasks (a vLLM fused-MoE evaluation problem's whole space) spreads over
    all 14 workers instead of one; small probes stay whole; nothing is lost or repeated."""
    from gemm_costmodel.benchmarks import precompile as P

    big = [(f"c{i}", {"m": 3, "n": 16, "k": 64}) for i in range(2496)]
    small = [(f"c{i}", {"m": 3, "n": 24, "k": 64}) for i in range(5)]
    chunks = P.chunks_for(big + small, 14)
    assert len(chunks) == 14
    sizes = sorted(len(c) for c in chunks)
    assert sizes[-1] <= -(-2501 // 14) and sizes[0] >= 2501 // 14 - 5
    assert sorted(t[0] + str(t[1]) for c in chunks for t in c) == sorted(t[0] + str(t[1]) for t in big + small)
    assert sum(any(t[1]["n"] == 24 for t in c) for c in chunks) == 1, "a small probe split"
    # Fewer tasks than workers: one chunk per task, none empty.
    assert [len(c) for c in P.chunks_for(small, 14)] == [1] * 5
