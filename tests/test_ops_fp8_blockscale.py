"""The block-scaled fp8 torch ops (``gemm_costmodel::gemm_fp8_blockscale`` and
``gemm_costmodel::quantize_fp8_per_token_group``) on CPU tensors through the Triton interpreter.

The GEMM runs on fp16/fp32 operands (the interpreter computes garbage for fp8 dots; same
scale layout); the quantiser's fp8 output is exact in fp32, so a compiled quantise-then-GEMM
function feeds ``x_q.float()`` to the GEMM. The dispatcher has no model here (an empty model
folder): the op's fallback rule decides, and the tests check that the op launches its choice.
"""
import json
import math

import pytest
import torch

from gemm_costmodel.kernels.fp8_blockscale import impl as I
from gemm_costmodel.kernels.fp8_blockscale import space as S
from gemm_costmodel.serving import ops
from gemm_costmodel.serving.runtime import Choice, Dispatcher

GPU = "NVIDIA H100 80GB HBM3"
OP = "fp8_blockscale"
FP8_MAX = 448.0

# No model in the tests' folder: the dispatcher's one fallback warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("no_models"))


@pytest.fixture(scope="module")
def disp(models_dir):
    return Dispatcher(gpu_name=GPU, models_dir=models_dir, op=OP)


@pytest.fixture(autouse=True)
def _bs_dispatcher(disp):
    ops.set_dispatcher(disp)
    yield
    ops.set_dispatcher(None, op=OP)


@pytest.fixture
def launched(monkeypatch):
    """Config ids passed to the block-scale impl.launch during the test, in order."""
    ids = []
    real_launch = I.launch

    def recording_launch(cfg, *a, **kw):
        ids.append(cfg.id)
        return real_launch(cfg, *a, **kw)

    monkeypatch.setattr(I, "launch", recording_launch)
    return ids


def _operands(m, n, k, dtype, seed=0):
    """Quantised as vLLM does, kept in the interpreter dtype (fp16/fp32): activations with a
    per-token magnitude spread, weights scaled so that outputs are O(1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=g) * torch.exp2(torch.rand((m, 1), generator=g) * 6 - 3)
    w = torch.randn((n, k), generator=g) * k ** -0.5
    a, as_ = I.quantize_per_token_group(x, dtype=dtype)
    b, bs = I.quantize_weight_blocks(w, dtype=dtype)
    return a, b, as_, bs


def _rel_err(y, a, b, as_, bs):
    ref = I.reference(I.Operands(a, b, as_, bs, None))
    return float(torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref))


# -- the quantiser: known answers -----------------------------------------------------------

def test_quantize_hand_computed_example():
    # group 4, K = 6: groups (1, -2, 4, 0.5) and (3, -7) (the last one partial).
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5, 3.0, -7.0]])
    x_q, s = ops.quantize_fp8_per_token_group(x, group=4)
    assert x_q.dtype == torch.float8_e4m3fn and x_q.shape == (1, 6)
    assert s.dtype == torch.float32 and s.shape == (1, 2)
    # amax / 448 per group: 4 / 448 and 7 / 448.
    assert torch.equal(s, torch.tensor([[4.0, 7.0]]) / FP8_MAX)
    # x / scale = x * 448 / amax: 112, -224, 448, 56 | 192, -448, all exact in e4m3 (1.75 * 2^6 ...).
    assert torch.equal(x_q.float(), torch.tensor([[112.0, -224.0, 448.0, 56.0, 192.0, -448.0]]))
    deq = x_q.float() * I.expand_group_scales(s, 6, 4)
    torch.testing.assert_close(deq, x, rtol=1e-6, atol=0)


def test_quantize_scales_are_group_amax_over_448_and_dequantize_within_fp8_rounding():
    m, k = 5, 300  # groups of 128, 128 and a partial 44
    g = torch.Generator().manual_seed(7)
    x = torch.randn((m, k), generator=g) * torch.exp2(torch.rand((m, 1), generator=g) * 10 - 5)
    x_q, s = ops.quantize_fp8_per_token_group(x)
    assert x_q.shape == (m, k) and s.shape == (m, math.ceil(k / 128))
    for j, (c0, c1) in enumerate([(0, 128), (128, 256), (256, 300)]):
        assert torch.equal(s[:, j], x[:, c0:c1].abs().amax(dim=1) / FP8_MAX), j
    # The group's largest |x| maps to +-448 exactly.
    assert torch.equal(x_q.float().abs().amax(dim=1), torch.full((m,), FP8_MAX))
    # e4m3 has 3 mantissa bits: round-to-nearest of a normal value (|x/s| >= 2^-6) is within
    # 2^-4 of it, relatively; below that the subnormal spacing is 2^-9, so the error is at most
    # 2^-10 in units of the scale. The 1e-6 covers the fp32 divide and multiply around the cast.
    se = I.expand_group_scales(s, k)
    deq = x_q.float() * se
    bound = (2.0 ** -4 * x.abs() + 2.0 ** -10 * se) * (1 + 1e-6)
    assert bool(((deq - x).abs() <= bound).all())
    rel = float(torch.linalg.vector_norm(deq - x) / torch.linalg.vector_norm(x))
    assert rel < 2.0 ** -4


def test_quantize_zero_group_gives_zeros_not_nan():
    x = torch.zeros((2, 200))
    x[1, 128:] = torch.linspace(-3.0, 5.0, 72)  # row 1: a zero group, then a nonzero one
    x_q, s = ops.quantize_fp8_per_token_group(x)
    assert not torch.isnan(x_q.float()).any() and not torch.isnan(s).any()
    assert torch.isfinite(s).all() and (s > 0).all()
    assert torch.equal(x_q.float()[0], torch.zeros(200)) and torch.equal(x_q.float()[1, :128], torch.zeros(128))
    assert s[1, 1] == torch.tensor(5.0) / FP8_MAX
    deq = x_q.float() * I.expand_group_scales(s, 200)
    assert torch.equal(deq[0], torch.zeros(200))


def test_quantize_bf16_input_other_group_and_custom_op_agree():
    g = torch.Generator().manual_seed(3)
    x = torch.randn((3, 100), generator=g).to(torch.bfloat16)
    x_q, s = ops.quantize_fp8_per_token_group(x, group=64)
    assert x_q.shape == (3, 100) and s.shape == (3, 2)
    q2, s2 = torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x, 64)
    assert torch.equal(x_q.float(), q2.float()) and torch.equal(s, s2)
    q3, s3 = torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x)  # default group 128
    assert s3.shape == (3, 1)


@pytest.mark.parametrize("case, match", [
    ("1d", r"^x must be 2-D"), ("int", r"^x must be bfloat16, float16 or float32"),
    ("group0", r"^group must be an int >= 1"), ("not_tensor", r"^x must be a torch tensor")])
def test_quantize_bad_input_raises_value_error_naming_the_field(case, match):
    x = torch.randn(4, 128)
    group = 128
    if case == "1d":
        x = x[0]
    elif case == "int":
        x = x.to(torch.int32)
    elif case == "group0":
        group = 0
    else:
        x = x.tolist()
    with pytest.raises(ValueError, match=match):
        ops.quantize_fp8_per_token_group(x, group)
    if case != "not_tensor":
        with pytest.raises(ValueError, match=match):
            torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x, group)


# -- the GEMM: known answers, and it launches the dispatcher's choice ----------------------------

SHAPES = [(1, 200, 300), (7, 200, 300), (7, 130, 129), (65, 200, 300)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_equals_reference_and_launches_the_dispatched_candidate(disp, launched, shape, dtype):
    m, n, k = shape
    a, b, as_, bs = _operands(m, n, k, dtype, seed=m + n)
    # fp32 operands are interpreter stand-ins, decided as fp16 (the dispatcher serves fp16).
    want = disp.select(m, n, k, "fp16")
    assert want.source == "heuristic"  # no model in the folder: the op's fallback rule decides
    assert ops.dispatcher(OP) is disp
    assert ops.choose_fp8_blockscale(a, b, as_, bs) == want.candidate
    y = ops.gemm_fp8_blockscale(a, b, as_, bs)
    assert launched == [want.candidate]
    assert y.shape == (m, n) and y.dtype == dtype
    name = I.DTYPE_NAMES[dtype]
    assert _rel_err(y, a, b, as_, bs) <= I.ERROR_BOUNDS[name], want.candidate
    # The registered op (the path torch.compile traces) launches the same candidate, same result.
    y2 = torch.ops.gemm_costmodel.gemm_fp8_blockscale(a, b, as_, bs)
    assert launched == [want.candidate] * 2
    assert torch.equal(y, y2)


@pytest.mark.parametrize("cid", ["bstiled_m32n64k128_g1_w4s3", "bssplitk_m16n64k128_s2_w4s3",
                                 "bsswapab_m16n64k128_s2_w4s3", "bsswapab_m16n64k64_s1_w4s4"])
def test_gemm_launches_each_variant_a_tuned_table_picks(models_dir, launched, cid):
    m, n, k = 7, 200, 300
    d = Dispatcher(gpu_name=GPU, models_dir=models_dir, op=OP,
                   tuned_table={"op": OP, "entries": {f"fp16:{m}x{n}x{k}": cid}})
    assert d.select(m, n, k, "fp16") == Choice(cid, "table")
    ops.set_dispatcher(d, op=OP)
    a, b, as_, bs = _operands(m, n, k, torch.float16, seed=11)
    y = ops.gemm_fp8_blockscale(a, b, as_, bs)
    assert launched == [cid]
    assert _rel_err(y, a, b, as_, bs) <= I.ERROR_BOUNDS["fp16"]


def _bad(case):
    a, b, as_, bs = _operands(7, 200, 300, torch.float16)
    if case == "x_scale_shape":
        as_ = as_[:, :2].contiguous()
        match = r"^x_scale must have shape \(M, ceil\(K/128\)\) = \(7, 3\).*got \(7, 2\)$"
    elif case == "w_scale_shape":
        bs = torch.ones((1, 3))
        match = r"^w_scale must have shape \(ceil\(N/128\), ceil\(K/128\)\) = \(2, 3\).*got \(1, 3\)$"
    elif case == "x_scale_dtype":
        as_ = as_.half()
        match = r"^x_scale must be float32, got torch.float16$"
    elif case == "x_dtype":
        a, b = a.to(torch.int8), b.to(torch.int8)
        match = r"^x must be float8_e4m3fn .*got torch.int8$"
    elif case == "w_dtype":
        b = b.float()
        match = r"^w must have x's dtype torch.float16, got torch.float32$"
    elif case == "x_1d":
        a = a[0]
        match = r"^x must be 2-D, got 1-D"
    elif case == "w_scale_1d":
        bs = bs.reshape(-1)
        match = r"^w_scale must be 2-D, got 1-D"
    elif case == "k_mismatch":
        b = b[:, :256].contiguous()
        match = r"^w must be \(N, K\) with x's K = 300, got shape \(200, 256\)$"
    elif case == "w_noncontiguous":
        b = b.t().contiguous().t()
        match = r"^w must be contiguous"
    else:
        raise AssertionError(case)
    return (a, b, as_, bs), match


@pytest.mark.parametrize("case", ["x_scale_shape", "w_scale_shape", "x_scale_dtype", "x_dtype", "w_dtype", "x_1d",
                                  "w_scale_1d", "k_mismatch", "w_noncontiguous"])
def test_gemm_bad_operands_raise_value_error_naming_the_argument(launched, case):
    args, match = _bad(case)
    for call in (ops.choose_fp8_blockscale, ops.gemm_fp8_blockscale, torch.ops.gemm_costmodel.gemm_fp8_blockscale):
        with pytest.raises(ValueError, match=match):
            call(*args)
    assert launched == []


def test_one_dispatcher_per_op(disp, models_dir):
    dense = Dispatcher(gpu_name=GPU, models_dir=models_dir)
    try:
        ops.set_dispatcher(dense)  # the dense op's, inferred from dense.op
        assert ops.dispatcher(op="gemm") is dense and ops.dispatcher(OP) is disp
        ops.set_dispatcher(disp, op=OP)
        assert ops.dispatcher(OP) is disp and ops.dispatcher(op="gemm") is dense
        with pytest.raises(ValueError, match="serves op 'fp8_blockscale', not 'gemm'"):
            ops.set_dispatcher(disp, op="gemm")
        with pytest.raises(ValueError, match="unknown op 'nope'"):
            ops.set_dispatcher(None, op="nope")
        ops.set_dispatcher(None, op=OP)  # back to a default for the current GPU, of this op
        d = ops.dispatcher(OP)
        assert d is not disp and d.op == OP and ops.dispatcher(OP) is d
        assert ops.dispatcher(op="gemm") is dense
    finally:
        ops.set_dispatcher(None)


# -- tracing: fake tensors, opcheck, torch.compile ------------------------------------------------

def test_fake_tensor_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty((5, 300), dtype=torch.bfloat16)
        x_q, s = torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x)
        assert x_q.shape == (5, 300) and x_q.dtype == torch.float8_e4m3fn
        assert s.shape == (5, 3) and s.dtype == torch.float32
        _, s64 = torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x, 64)
        assert s64.shape == (5, 5)
        w = torch.empty((200, 300), dtype=torch.float8_e4m3fn)
        ws = torch.empty((2, 3), dtype=torch.float32)
        y = torch.ops.gemm_costmodel.gemm_fp8_blockscale(x_q, w, s, ws)
        assert y.shape == (5, 200) and y.dtype == torch.bfloat16
        y16 = torch.ops.gemm_costmodel.gemm_fp8_blockscale(x_q.half(), w.half(), s, ws)
        assert y16.dtype == torch.float16


def test_opcheck():
    a, b, as_, bs = _operands(7, 200, 300, torch.float16, seed=5)
    torch.library.opcheck(torch.ops.gemm_costmodel.gemm_fp8_blockscale.default, (a, b, as_, bs))
    x = torch.randn((7, 300), generator=torch.Generator().manual_seed(6))
    torch.library.opcheck(torch.ops.gemm_costmodel.quantize_fp8_per_token_group.default, (x, 128))
    torch.library.opcheck(torch.ops.gemm_costmodel.quantize_fp8_per_token_group.default, (x.half(), 64))


def test_quantize_then_gemm_under_torch_compile_equals_eager(launched):
    m, n, k = 7, 200, 300
    g = torch.Generator().manual_seed(9)
    x = torch.randn((m, k), generator=g)
    w, ws = I.quantize_weight_blocks(torch.randn((n, k), generator=g) * k ** -0.5, dtype=torch.float32)

    def f(x, w, ws):
        x_q, xs = ops.quantize_fp8_per_token_group(x)
        # fp8 -> fp32 is exact: the fp32 GEMM computes what the fp8 one would, in the interpreter.
        return ops.gemm_fp8_blockscale(x_q.float(), w, xs, ws) * 2.0

    eager = f(x, w, ws)
    try:
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        y = compiled(x, w, ws)
    finally:
        torch._dynamo.reset()
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert torch.equal(y, eager)
    assert len(launched) == 2 and launched[0] == launched[1]
    x_q, xs = ops.quantize_fp8_per_token_group(x)
    assert _rel_err(y / 2.0, x_q.float(), w, xs, ws) <= I.ERROR_BOUNDS["fp32"]
    assert S.check_feasible(S.config_from_id(launched[0]), S.Problem(m, n, k, "fp16"))[0]


# -- unsure mode --------------------------------------------------------------------------------

RANKED = ["bstiled_m32n64k128_g1_w4s3", "bssplitk_m16n64k128_s2_w4s3", "bsswapab_m16n64k128_s2_w4s3"]


class _RankedDispatcher:
    """A block-scale dispatcher double with a fixed ranking (fp16/fp32 operands have no model)."""
    op = OP
    gpu_name = GPU

    def __init__(self, ranked):
        self.ranked, self.calls = ranked, []

    def rank(self, m, n, k, dtype="fp8", count=8, **kw):
        self.calls.append((m, n, k, dtype, count))
        return [Choice(c, "model") for c in self.ranked[:count]]

    def select(self, *a, **kw):
        return self.rank(*a, **kw)[0]


@pytest.fixture
def unsure_bs(tmp_path, launched):
    fake = _RankedDispatcher(RANKED)
    ops.set_dispatcher(fake, op=OP)
    ops.set_dispatcher(Dispatcher(gpu_name=GPU, models_dir=str(tmp_path / "none")))  # the dense op's
    yield fake, launched
    ops.disable_unsure_mode()
    ops.set_dispatcher(None)


def test_unsure_mode_times_the_top_k_on_the_call_operands_and_persists_the_winner(unsure_bs, tmp_path):
    fake, launched = unsure_bs
    m, n, k = 7, 200, 300
    a, b, as_, bs = _operands(m, n, k, torch.float16, seed=21)
    speed = dict(zip(RANKED, (3.0, 1.0, 2.0)))  # the model's second choice is the fastest
    benched = []

    def bench(fn):
        fn()
        benched.append(launched[-1])
        return speed[launched[-1]]

    cache = tmp_path / "tuned.json"
    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=bench)
    assert ops.choose_fp8_blockscale(a, b, as_, bs) == RANKED[1]
    assert sorted(benched) == sorted(RANKED)
    assert fake.calls == [(m, n, k, "fp16", 3)]  # fp16 operands are decided as fp16, k = 3
    # Known shape: nothing is timed again; the op launches the winner and matches the reference.
    launched.clear()
    y = ops.gemm_fp8_blockscale(a, b, as_, bs)
    assert launched == [RANKED[1]] and len(benched) == 3
    assert _rel_err(y, a, b, as_, bs) <= I.ERROR_BOUNDS["fp16"]

    body = json.loads(cache.read_text())
    assert body["entries"] == {}  # the dense tuned-table part stays a valid (empty) table
    ent = body["ops"][OP][f"fp16:{m}x{n}x{k}"]
    assert ent == {"candidate": RANKED[1], "ms": 1.0, "timed": speed, "model_top1": RANKED[0]}
    Dispatcher(gpu_name=GPU, models_dir=str(tmp_path / "none"), tuned_table=str(cache))

    # A later process reloads the winner: nothing is timed, the model is not asked.
    def no_bench(fn):
        raise AssertionError("a persisted shape must not be timed again")

    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=no_bench)
    assert ops.choose_fp8_blockscale(a, b, as_, bs) == RANKED[1] and len(fake.calls) == 1
    # Another M is another shape: timed (with blockscale_bench, which takes precedence over bench).
    a2, _, as2, _ = _operands(3, n, k, torch.float16, seed=22)
    ops.enable_unsure_mode(k=2, cache_file=str(cache), bench=no_bench, blockscale_bench=lambda fn: (fn(), 5.0)[1])
    assert ops.choose_fp8_blockscale(a2, b, as2, bs) == RANKED[0]  # a tie: the model's order decides
    body = json.loads(cache.read_text())
    assert set(body["ops"][OP]) == {f"fp16:{m}x{n}x{k}", f"fp16:3x{n}x{k}"}


def test_unsure_mode_never_picks_a_candidate_that_disagrees_with_the_model_first_choice(unsure_bs, monkeypatch):
    fake, launched = unsure_bs
    real = I.launch

    def broken(cfg, *a, **kw):
        y = real(cfg, *a, **kw)
        return y * 1.1 if cfg.id == RANKED[1] else y  # a 10% error: far past the gate's bound

    monkeypatch.setattr(I, "launch", broken)
    a, b, as_, bs = _operands(7, 200, 300, torch.float16, seed=23)
    order = []

    def bench(fn):
        order.append(1)
        return [2.0, 3.0][len(order) - 1]  # RANKED[1] is skipped before timing: 2 calls only

    tuner = ops.enable_unsure_mode(k=3, bench=bench)
    assert ops.choose_fp8_blockscale(a, b, as_, bs) == RANKED[0]
    timed = tuner.op_entries[OP]["fp16:7x200x300"]["timed"]
    assert timed == {RANKED[0]: 2.0, RANKED[1]: float("inf"), RANKED[2]: 3.0} and len(order) == 2


def test_unsure_mode_times_with_the_graph_timer_by_default(unsure_bs, monkeypatch):
    fake, launched = unsure_bs
    m, n, k = 7, 200, 300
    a, b, as_, bs = _operands(m, n, k, torch.float16, seed=24)
    asked = []

    def graph_timer(op_name, problem):
        asked.append((op_name, problem))
        return (lambda cid: {RANKED[0]: 2.0, RANKED[1]: 3.0, RANKED[2]: 1.5}[cid]), lambda: asked.append("released")

    monkeypatch.setattr(ops, "_graph_timer", graph_timer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ops.enable_unsure_mode(k=3)
    assert ops.choose_fp8_blockscale(a, b, as_, bs) == RANKED[2]
    # Timed on synthetic copies of the op's own problem, in the operands' dtype, then released.
    assert asked == [(OP, S.Problem(m, n, k, "fp16")), "released"]
