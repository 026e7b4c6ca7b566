"""The convenience ops on CPU tensors through the Triton interpreter (fp16: the ops serve
bf16/fp16/fp8, and the interpreter's bf16 tl.dot is broken): dispatch + launch,
torch.compile, operand validation, and unsure mode with a fake benchmark."""
import json

import pytest
import torch

from gemm_costmodel.serving import ops
from gemm_costmodel.kernels.gemm import kernel as K
from gemm_costmodel.serving.runtime import Choice, Dispatcher

from test_runtime import GPU, tiny_model_dir


@pytest.fixture(scope="module")
def disp(tmp_path_factory):
    return Dispatcher(gpu_name=GPU, models_dir=tiny_model_dir(tmp_path_factory))


@pytest.fixture(autouse=True)
def _ops_dispatcher(disp):
    ops.set_dispatcher(disp)
    yield
    ops.disable_unsure_mode()
    ops.set_dispatcher(None)


@pytest.fixture
def launched(monkeypatch):
    """Config ids passed to kernels.gemm.launch during the test, in order."""
    ids = []
    real_launch = K.launch

    def recording_launch(cfg, *a, **kw):
        ids.append(cfg.id)
        return real_launch(cfg, *a, **kw)

    monkeypatch.setattr(K, "launch", recording_launch)
    return ids


def _operands(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=g).to(torch.float16)
    w = torch.randn((n, k), generator=g).to(torch.float16)
    return x, w


def _rel_err(y, x, w):
    ref = x.float() @ w.float().T
    return float(torch.linalg.norm(y.float() - ref) / torch.linalg.norm(ref))


SHAPES = [(1, 33, 65), (7, 40, 100), (17, 64, 64), (65, 48, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_matches_reference(disp, shape):
    m, n, k = shape
    x, w = _operands(m, n, k)
    assert ops.dispatcher(op="gemm") is disp
    cid = ops.choose(x, w)
    assert cid == disp.select(m, n, k, "fp16").candidate
    assert disp.select(m, n, k, "fp16").source == "model"
    y = ops.gemm(x, w)
    assert y.shape == (m, n) and y.dtype == torch.float16
    assert _rel_err(y, x, w) < 2e-3, cid


@pytest.mark.parametrize("shape,cid", [
    ((1, 33, 65), "splitk_m16n32k64_s2_w4s3"),
    ((7, 40, 100), "tiled_m16n32k64_g8_w4s4"),
    ((17, 64, 64), "persistent_m64n64k64_g8_w4s3"),
    ((65, 48, 32), "tiled_m64n64k64_g8_w4s3"),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_gemm_launches_the_dispatched_triton_variant(disp, launched, shape, cid):
    # The tiny model mostly picks cuBLAS for these small shapes; a tuned table makes the ops
    # launch each Triton variant instead.
    m, n, k = shape
    d = Dispatcher(gpu_name=GPU, models_dir=disp.models_dir, tuned_table={f"fp16:{m}x{n}x{k}": cid})
    assert d.select(m, n, k, "fp16") == Choice(cid, "table")
    ops.set_dispatcher(d)
    x, w = _operands(m, n, k, seed=3)
    assert ops.choose(x, w) == cid
    y = ops.gemm(x, w)
    assert launched == [cid]
    assert _rel_err(y, x, w) < 2e-3


def test_gemm_under_torch_compile(disp):
    x, w = _operands(7, 40, 100, seed=1)

    def f(a, b):
        return ops.gemm(a, b) * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    y = compiled(x, w)
    assert y.shape == (7, 40)
    assert _rel_err(y / 2.0, x, w) < 2e-3
    torch._dynamo.reset()


@pytest.mark.parametrize("case", ["noncontiguous_w", "noncontiguous_x", "k_mismatch", "dtype_mismatch", "1d_x",
                                  "fp32"])
def test_bad_operands_raise_value_error(case):
    x, w = _operands(4, 8, 16)
    if case == "noncontiguous_w":
        w = torch.randn(16, 8).to(torch.float16).t()
        assert w.shape == (8, 16) and not w.is_contiguous()
        match = "w must be contiguous"
    elif case == "noncontiguous_x":
        x = torch.randn(16, 4).to(torch.float16).t()
        match = "x must be contiguous"
    elif case == "k_mismatch":
        w = torch.randn(8, 32).to(torch.float16)
        match = "K mismatch"
    elif case == "dtype_mismatch":
        w = w.float()
        match = "dtype mismatch"
    elif case == "1d_x":
        x = x[0]
        match = "2-D"
    else:  # fp32 is the interpreter-only kernel dtype: the ops serve bf16/fp16/fp8
        x, w = x.float(), w.float()
        match = "dtype"
    with pytest.raises(ValueError, match=match):
        ops.choose(x, w)
    with pytest.raises(ValueError, match=match):
        ops.gemm(x, w)


@pytest.mark.parametrize("name, x_shape, w_shape", [("M", (2**31, 16), (16, 16)), ("N", (16, 16), (2**31, 16)),
                                                   ("K", (16, 2**31), (16, 2**31))])
def test_dims_above_int32_raise_value_error_naming_the_field(tmp_path, name, x_shape, w_shape):
    # Meta tensors: the shapes of a 64 GiB operand without the memory; the ops refuse before any launch.
    x = torch.empty(x_shape, dtype=torch.float16, device="meta")
    w = torch.empty(w_shape, dtype=torch.float16, device="meta")
    match = rf"^{name} must be <= 2\*\*31 - 1 \(2147483647\), got 2147483648$"
    for call in (ops.choose, ops.gemm):
        with pytest.raises(ValueError, match=match):
            call(x, w)
    ops.enable_unsure_mode(k=2, cache_file=str(tmp_path / "tuned.json"), bench=lambda fn: 1.0)
    with pytest.raises(ValueError, match=match):
        ops.gemm(x, w)
    assert not (tmp_path / "tuned.json").exists()


def test_unsure_mode_picks_the_fastest_of_the_top_k_and_persists_it(disp, tmp_path, launched):
    m, n, k = 5, 48, 64
    x, w = _operands(m, n, k, seed=2)
    ranked = disp.rank(m, n, k, "fp16", count=3)
    assert len(ranked) == 3
    # Deterministic fake times by candidate: the model's third choice is the fastest.
    fake = {c.candidate: 3.0 - i for i, c in enumerate(ranked)}
    winner = ranked[2].candidate

    benched = []

    def bench(fn):
        fn()
        benched.append(launched[-1])
        return fake[launched[-1]]

    cache = tmp_path / "sub" / "tuned.json"
    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=bench)
    assert ops.choose(x, w) == winner
    assert sorted(benched) == sorted(fake)
    # Known shape: no more benchmarking; the op launches the winner and is correct.
    y = ops.gemm(x, w)
    assert launched[-1] == winner and len(benched) == 3
    assert _rel_err(y, x, w) < 2e-3

    data = json.loads(cache.read_text())
    assert data["format"] == "gemm_costmodel.tuned/1"
    prov = data["provenance"]
    assert prov["gpu_name"] == GPU and prov["k"] == 3
    assert {"torch", "git_sha", "updated"} <= set(prov)
    entry = data["entries"][f"fp16:{m}x{n}x{k}"]
    assert entry["candidate"] == winner and entry["ms"] == fake[winner]
    assert entry["timed"] == fake and entry["model_top1"] == ranked[0].candidate

    # A later process: the file is a tuned table, and unsure mode reloads its winners.
    d2 = Dispatcher(gpu_name=GPU, models_dir=disp.models_dir, tuned_table=str(cache))
    assert d2.select(m, n, k, "fp16") == Choice(winner, "table")

    def no_bench(fn):
        raise AssertionError("a persisted shape must not be benchmarked again")

    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=no_bench)
    assert ops.choose(x, w) == winner


def test_unsure_mode_rejects_bad_k():
    for bad in (0, 2.0, None):
        with pytest.raises(ValueError, match="k must be"):
            ops.enable_unsure_mode(k=bad)


class _FakeGraphTimer:
    """Stands in for ops._graph_timer (which needs CUDA): records what it was asked to time."""

    def __init__(self, times=None, oom=False):
        self.times, self.oom, self.problems, self.released = times or {}, oom, [], 0

    def __call__(self, op_name, problem):
        self.problems.append((op_name, problem))
        if self.oom:
            raise torch.OutOfMemoryError("no room for the timing copies")

        def release():
            self.released += 1

        return (lambda cid: self.times[cid]), release


def test_unsure_mode_times_with_the_graph_timer_by_default_and_keeps_the_model_pick_without_memory(
        disp, tmp_path, launched, monkeypatch):
    from gemm_costmodel.kernels.gemm.space import Problem

    m, n, k = 6, 40, 72
    x, w = _operands(m, n, k, seed=3)
    ranked = [c.candidate for c in disp.rank(m, n, k, "fp16", count=3)]
    fake = _FakeGraphTimer(dict(zip(ranked, (2.0, 3.0, 1.0))))
    monkeypatch.setattr(ops, "_graph_timer", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    tuner = ops.enable_unsure_mode(k=3)
    assert ops.choose(x, w) == ranked[2]
    # One timer per shape, for the dense op's problem (the operands' dtype), released after use.
    assert fake.problems == [("gemm", Problem(m, n, k, "fp16"))] and fake.released == 1
    assert tuner.entries[f"fp16:{m}x{n}x{k}"]["timed"] == dict(zip(ranked, (2.0, 3.0, 1.0)))
    # No device memory for the copies: the model's first choice, untimed.
    x2, w2 = _operands(m + 1, n, k, seed=4)
    monkeypatch.setattr(ops, "_graph_timer", _FakeGraphTimer(oom=True))
    assert ops.choose(x2, w2) == disp.select(m + 1, n, k, "fp16").candidate
    assert tuner.entries[f"fp16:{m + 1}x{n}x{k}"] == {
        "candidate": disp.select(m + 1, n, k, "fp16").candidate, "ms": None, "timed": {},
        "model_top1": disp.select(m + 1, n, k, "fp16").candidate}
    # Without CUDA (the interpreter), nothing is timed either.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ops, "_graph_timer", _FakeGraphTimer(oom=True))
    x3, w3 = _operands(m + 2, n, k, seed=5)
    assert ops.choose(x3, w3) == disp.select(m + 2, n, k, "fp16").candidate
