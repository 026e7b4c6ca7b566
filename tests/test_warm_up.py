"""Dispatcher.warm_up: each dtype's once-per-process costs paid up front, decisions unchanged."""
import warnings

import pytest

from gemm_costmodel.serving.runtime import DispatchWarning, Dispatcher

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
PROBLEMS = [(1, 4096, 4096, "fp16"), (7, 5120, 1536, "bf16"), (4097, 8192, 1024, "fp8"), (64, 896, 4096, "fp8"),
            (300, 14336, 4096, "bf16")]


def test_warm_up_builds_every_dtype_and_decides_the_same():
    cold = Dispatcher(gpu_name=H100)
    want = [cold.select(*p) for p in PROBLEMS]
    d = Dispatcher(gpu_name=H100)
    assert d.warm_up() == ["bf16", "fp16", "fp8"]
    # Nothing was cached: the trial decisions are not in the cache.
    assert d.cache_info()["entries"] == 0
    # Each dtype's feature cache and every M bucket's shortlist mask exist before any decision.
    assert {key[1] for key in d._featurizers} == {"bf16", "fp16", "fp8"}
    for dt in ("bf16", "fp16", "fp8"):
        model = d.model_for(dt)
        assert {key[2] for key in model._masks if key[1] == dt} == set(range(len(model._m_edges) + 1))
    assert [d.select(*p) for p in PROBLEMS] == want


def test_warm_up_skips_what_the_gpu_cannot_run_and_names_a_bad_dtype():
    d = Dispatcher(gpu_name=A100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)  # the sm90 models do not serve sm80
        assert d.warm_up() == ["bf16", "fp16"]  # no fp8 before Hopper
    with pytest.raises(ValueError, match="dtype must be one of .* got 'int8'"):
        Dispatcher(gpu_name=H100).warm_up(["bf16", "int8"])


def test_warm_up_an_op_with_extra_fields():
    # MoE decisions need a stage: warm_up builds the tables and masks but runs no trial decision.
    d = Dispatcher(gpu_name=H100, op="moe")
    assert d.warm_up(["bf16"]) == ["bf16"]
    assert ("sm90", "bf16", "moe") in d._featurizers and d.cache_info()["entries"] == 0
