"""TrainConfig.vendor_margin: the vendor library's ranking offset, in training, export and runtime."""
import json

import numpy as np
import pytest

from gemm_costmodel.learning.model import CostModel, TrainConfig
from gemm_costmodel.learning.pipeline import export_model, load_training_frame
from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel.serving.runtime import Dispatcher

H100 = "NVIDIA H100 80GB HBM3"
DATA = ["datasets/gemm/fp8/eval-fp8-shard01of40.parquet"]
SMALL = dict(formulation="rank", n_estimators=10, max_depth=4, n_jobs=1)


@pytest.fixture(scope="module")
def frame():
    return load_training_frame(DATA, op="gemm")


@pytest.fixture(scope="module")
def plain(frame):
    return CostModel(TrainConfig(**SMALL)).fit(frame)


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan")])
def test_margin_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match="vendor_margin"):
        TrainConfig(vendor_margin=bad)


def test_latency_models_take_no_margin():
    with pytest.raises(ValueError, match="vendor_margin needs a relative formulation"):
        TrainConfig(formulation="log_latency", vendor_margin=0.5)


def test_margin_lowers_only_the_vendor_rows_score(frame, plain):
    # Same booster (same seed, same data): the margin is an offset on the vendor rows alone.
    shifted = CostModel(TrainConfig(**SMALL, vendor_margin=0.75)).fit(frame)
    X = F.from_frame(frame.head(400), hardware.spec_for)
    vendor = X[:, F.feature_names("gemm").index("is_vendor")] == 1
    assert vendor.any() and (~vendor).any()
    diff = plain.score(X) - shifted.score(X)
    np.testing.assert_allclose(diff[vendor], 0.75, rtol=0, atol=1e-5)
    np.testing.assert_allclose(diff[~vendor], 0.0, rtol=0, atol=1e-6)


def test_runtime_applies_the_exported_margin(frame, tmp_path):
    # A margin larger than any score gap makes the vendor every decision, through the cascade too;
    # without one the same booster picks Triton configs on some of these shapes.
    shapes = [(1, 4096, 4096), (16, 8192, 2048), (64, 4096, 14336), (256, 1024, 4096), (7, 5120, 5120)]
    picks = {}
    for margin in (0.0, 1e3):
        out = tmp_path / f"m{margin}"
        export_model(CostModel(TrainConfig(**SMALL, vendor_margin=margin)).fit(frame), frame, str(out),
                     log=lambda m: None)
        man = json.loads((out / "gemm-sm90.json").read_text())
        assert man["vendor_margin"] == margin
        assert man["feature_names"][man["vendor_feature"]] == "is_vendor"
        d = Dispatcher(gpu_name=H100, models_dir=str(out))
        picks[margin] = [d.select(m, n, k, "fp8").candidate for m, n, k in shapes]
        assert [c.candidate for c in d.rank(64, 4096, 14336, "fp8", count=2)][0] == picks[margin][2]
    assert set(picks[1e3]) == {"cublas"}
    assert any(c != "cublas" for c in picks[0.0])
