"""Fuzz of the runtime's public API, one test per registered op (issue 57): Dispatcher.select and
rank with random fields, odd, huge, negative and wrong-typed values included, give a feasible
candidate or a ValueError, never another exception, in bounded time per call."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemm_costmodel import registry
from gemm_costmodel.serving.candidates import table
from gemm_costmodel.serving.runtime import DispatchWarning, Dispatcher

GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA RTX A1000 6GB Laptop GPU")
# A cold MoE decision at the largest M is ~0.05 s on the dev CPU; 2 s leaves room for a loaded machine.
CALL_LIMIT_S = 2.0

_dims = st.one_of(st.integers(1, 64), st.integers(1, 16384), st.sampled_from([2**20, 2**31 - 1, 2**31, 2**62]),
                  st.integers(-5, 0), st.just(np.int64(64)), st.just(np.int32(7)),
                  st.sampled_from([1.5, 64.0, True, None, "64", float("nan")]))
_experts = st.one_of(st.sampled_from([1, 2, 8, 16, 64, 256, 512, 513]), st.integers(-2, 600), st.just(None))
_dtype = st.sampled_from(["bf16", "fp16", "fp8", "fp32", "int8", None, 3])
_stage = st.sampled_from(["gate_up", "down", "up", None, 1, ["down"]])
_routing = st.sampled_from(["balanced", "zipf", "hot", "real0", "uniform", None, 5, np.array([1, 2])])
_count = st.one_of(st.integers(-1, 40), st.just(np.int64(3)), st.sampled_from([2.0, None, "4", True]))

_dispatchers: dict = {}


def _dispatcher(op: str, gpu: str) -> Dispatcher:
    if (op, gpu) not in _dispatchers:  # loading a model is not what is fuzzed: one per (op, GPU)
        _dispatchers[(op, gpu)] = Dispatcher(gpu_name=gpu, op=op)
    return _dispatchers[(op, gpu)]


def _check(d: Dispatcher, call, dtype) -> None:
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DispatchWarning)
            out = call()
    except ValueError:
        return
    finally:
        assert time.perf_counter() - t < CALL_LIMIT_S
    choices = out if isinstance(out, list) else [out]
    assert choices
    for c in choices:
        if d.space_arch is None:
            assert c.candidate in d._op.vendor_ids
        else:
            ct = table(d.space_arch, dtype, d.op)
            assert c.candidate in ct.index


def _fuzz(op: str, data) -> None:
    spec = registry.get(op)
    d = _dispatcher(op, data.draw(st.sampled_from(GPUS)))
    # A plausible problem, then at most two of its fields replaced by wild values: wholly random
    # fields mostly stop at the first check, so the later ones would go unfuzzed.
    f = {"m": data.draw(st.integers(1, 9000)), "n": data.draw(st.sampled_from([128, 4096, 7168, 1000])),
         "k": data.draw(st.sampled_from([512, 4096, 4100, 896])), "dtype": data.draw(st.sampled_from(spec.dtypes))}
    wild = {"m": _dims, "n": _dims, "k": _dims, "dtype": _dtype}
    # The op's own problem fields (from its registry entry, no per-op branch): plausible values first.
    fields = spec.problem_fields
    if "e" in fields:
        f["e"] = data.draw(st.sampled_from([8, 64, 256]))
    if "top_k" in fields:
        f["top_k"] = data.draw(st.integers(1, 8))
    if "stage" in fields:
        stages = tuple(getattr(spec.space_module(), "STAGES", ("gate_up", "down")))
        f["stage"] = data.draw(st.sampled_from(stages))
        wild["stage"] = _stage | st.sampled_from(stages)
    if "routing" in fields:
        f["routing"] = data.draw(st.sampled_from(["balanced", "zipf", "hot"]))
        wild["routing"] = _routing
    wild.update(e=_experts, **({"top_k": _experts} if "top_k" in fields else {}))
    for name in data.draw(st.lists(st.sampled_from(sorted(wild)), max_size=2, unique=True)):
        f[name] = data.draw(wild[name])
    m, n, k, dtype = f.pop("m"), f.pop("n"), f.pop("k"), f.pop("dtype")
    if data.draw(st.booleans()):
        _check(d, lambda: d.select(m, n, k, dtype, **f), dtype)
    else:
        count = data.draw(st.integers(1, 40) | _count)
        _check(d, lambda: d.rank(m, n, k, dtype, count=count, **f), dtype)


_SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("op", registry.names())
def test_fuzz_registered_ops_cover_this_file(op):
    # Every ranker op is fuzzed by test_fuzz_ranker_op; a classifier op has a test of its own below.
    assert op in registry.names("ranker") or op == "ck_a8w8_blockscale", f"add a fuzz test for the new op {op}"


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_fuzz_ranker_op(op):
    @_SETTINGS
    @given(st.data())
    def run(data):
        _fuzz(op, data)

    run()


_AMD = ("AMD Instinct MI300X", "AMD Instinct MI308X", "AMD Instinct MI355X", "NVIDIA H100 80GB HBM3", "MI999")


@_SETTINGS
@given(st.data())
def test_fuzz_ck_a8w8_blockscale(data):
    """The AMD classifier op: a CK kernel name feasible for K (from the op's own rule) or a ValueError."""
    from gemm_costmodel.kernels.ck_a8w8_blockscale import space

    gpu = data.draw(st.sampled_from(_AMD))
    try:
        d = _dispatcher("ck_a8w8_blockscale", gpu)
    except ValueError:
        return  # not an AMD part: refused with a reason
    m, n, k = (data.draw(st.integers(1, 70000) | _dims) for _ in range(3))
    dtype = data.draw(st.sampled_from(registry.get("ck_a8w8_blockscale").dtypes) | _dtype)
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = d.rank(m, n, k, dtype, count=data.draw(st.integers(1, 5) | _count)) if data.draw(st.booleans()) \
                else [d.select(m, n, k, dtype)]
    except ValueError:
        return
    finally:
        assert time.perf_counter() - t < CALL_LIMIT_S
    assert out
    for c in out:
        assert isinstance(c.candidate, str) and c.candidate.startswith("a8w8_blockscale_")
        assert space.feasible(c.candidate, int(k))
