"""benchmarks/vllm_compare.py's CPU side: ``prepare`` carries exactly the files a GPU host needs,
and the configs of (i) vLLM as shipped and (ii) vLLM with our export resolve through vLLM's own
lookup functions (skipped without a vLLM 0.33.0 wheel in COSTMODEL_VLLM_SRC); the summary's
speed-ups."""
from __future__ import annotations

import os

import pytest

from gemm_costmodel.benchmarks import vllm_compare as C
from gemm_costmodel.kernels.vllm import source
from gemm_costmodel.util import geomean

WHEEL = os.environ.get(source.ENV_SRC, "")
needs_wheel = pytest.mark.skipif(not WHEEL.endswith(".whl") or not os.path.isfile(WHEEL),
                                 reason=f"set {source.ENV_SRC} to a vLLM 0.33.0 wheel")
pytestmark = pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")


@needs_wheel
def test_prepare_and_resolve(tmp_path):
    names = C.prepare(WHEEL, str(tmp_path / "src"))
    assert set(C.NEEDED) <= set(names)
    assert all(n in C.NEEDED or n.endswith(".json") for n in names)
    src, why = source.find_source(str(tmp_path / "src"))
    assert src is not None, why
    gpu = "NVIDIA H200"
    shipped, ours = C.resolve_configs(src, gpu, [(16, 3200, 4096, 2)], [(2112, 7168), (5120, 8960)], ["bf16"],
                                      work=str(tmp_path / "work"))
    assert shipped.get_w8a8_block_fp8_configs(2112, 7168, 128, 128)  # vLLM tuned it for the H200
    assert shipped.get_w8a8_block_fp8_configs(5120, 8960, 128, 128) is None
    assert shipped.get_moe_configs(16, 3200, None) is None
    for nk in ((2112, 7168), (5120, 8960)):
        assert ours.get_w8a8_block_fp8_configs(*nk, 128, 128)
    assert ours.get_moe_configs(16, 3200, None)
    assert "SPLIT_K" not in ours.try_get_optimal_moe_config((16, 6400, 4096), (16, 4096, 3200), 2, None, 7)


def test_default_layers_are_the_held_out_families():
    from gemm_costmodel.kernels.moe import suites

    assert len(C.default_moe_layers()) == len(suites.HELDOUT_MODELS)


def test_summary_speedups():
    def row(m, method, us, tuned=False):
        return {"op": "fp8_blockscale", "dtype": "fp8", "n": 1, "k": 2, "m": m, "method": method, "status": "ok",
                "us": us, "vllm_tuned": tuned}
    rows = [row(1, "vllm", 4.0), row(1, "vllm_ours", 2.0), row(1, "ours", 1.0),
            row(2, "vllm", 4.0), row(2, "vllm_ours", 8.0), {**row(2, "ours", 1.0), "status": "wrong"}]
    s = C.summarize(rows, geomean)
    (layer,) = s["layers"]
    assert layer["vllm_ours"]["geomean_speedup"] == pytest.approx(1.0) and layer["vllm_ours"]["worst"] == 0.5
    assert layer["ours"]["geomean_speedup"] == pytest.approx(4.0) and layer["ours"]["n_m"] == 1
    assert layer["failures"] == ["2:ours:wrong"]
    assert s["overall"]["fp8_blockscale/untuned/ours"]["layers"] == 1
