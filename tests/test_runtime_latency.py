"""The latency companion: a rank decision model reports predicted latencies through it."""
import json
import shutil

import pytest

from gemm_costmodel.kernels.gemm.space import Problem, check_feasible, config_from_id
from gemm_costmodel.learning.model import CostModel, TrainConfig
from gemm_costmodel.learning.pipeline import LATENCY_COMPANION, export_model, load_training_frame
from gemm_costmodel.serving.runtime import Dispatcher

H100 = "NVIDIA H100 80GB HBM3"
DATA = ["datasets/gemm/fp8/eval-fp8-shard01of40.parquet"]


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank_models")
    df = load_training_frame(DATA, op="gemm")
    export_model(CostModel(TrainConfig(formulation="rank", n_estimators=10, max_depth=4, n_jobs=1)).fit(df), df,
                 str(out), log=lambda m: None)
    export_model(CostModel(LATENCY_COMPANION.with_(n_estimators=10, max_depth=4, n_jobs=1)).fit(df), df,
                 str(out), log=lambda m: None, role="latency")
    return out


def test_rank_model_reports_companion_latencies(rank_dir):
    d = Dispatcher(gpu_name=H100, models_dir=str(rank_dir))
    top = d.rank(64, 4096, 4096, "fp8", count=4)
    assert [c.source for c in top] == ["model"] * 4
    # Best first by the rank score; latencies come from the companion, in microseconds.
    assert [c.score for c in top] == sorted(c.score for c in top)
    assert all(c.predicted_us is not None and 0.5 < c.predicted_us < 1e6 for c in top)
    assert d.select(64, 4096, 4096, "fp8").candidate == top[0].candidate
    for c in top:
        assert check_feasible(config_from_id(c.candidate), Problem(64, 4096, 4096, "fp8"))[0]


def test_without_companion_latencies_are_none(rank_dir, tmp_path):
    only = tmp_path / "only"
    only.mkdir()
    for ext in (".onnx", ".json"):
        shutil.copy(rank_dir / f"gemm-sm90{ext}", only / f"gemm-sm90{ext}")
    d = Dispatcher(gpu_name=H100, models_dir=str(only))
    c = d.select(64, 4096, 4096, "fp8")
    assert c.source == "model" and c.predicted_us is None


def test_companion_is_never_the_decision_model(rank_dir, tmp_path):
    # A folder holding only the latency companion has no decision model: the heuristic decides.
    only = tmp_path / "lat"
    only.mkdir()
    for ext in (".onnx", ".json"):
        shutil.copy(rank_dir / f"gemm-sm90-latency{ext}", only / f"gemm-sm90-latency{ext}")
    assert json.loads((only / "gemm-sm90-latency.json").read_text())["role"] == "latency"
    with pytest.warns(UserWarning, match="no gemm model"):
        c = Dispatcher(gpu_name=H100, models_dir=str(only)).select(64, 4096, 4096, "fp8")
    assert c.source == "heuristic"


def test_precompute_at_load_time(rank_dir):
    d = Dispatcher(gpu_name=H100, models_dir=str(rank_dir), precompute={"fp8": [(4096, 4096), (1024, 7168)]})
    assert d.cache_info()["entries"] == 2 * 15  # two (N, K) x M in 1, 2, 4, ..., 16384
    hit = d.select(64, 4096, 4096, "fp8")
    assert d.select(64, 4096, 4096, "fp8") is hit


@pytest.mark.parametrize("bad", [[1, 2], {"op": "gemm", "dtypes": 5, "arch": "sm90"}, "text"])
def test_malformed_manifest_falls_back_without_raising(rank_dir, tmp_path, bad):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(rank_dir / "gemm-sm90.onnx", folder / "gemm-sm90.onnx")
    (folder / "gemm-sm90.json").write_text(json.dumps(bad))
    with pytest.warns(UserWarning):
        c = Dispatcher(gpu_name=H100, models_dir=str(folder)).select(64, 4096, 4096, "fp8")
    assert c.source == "heuristic"


def test_companion_latency_is_computed_on_first_read(rank_dir):
    import pickle

    import numpy as np

    from gemm_costmodel.serving import features as F
    from gemm_costmodel.serving.runtime import Choice

    d = Dispatcher(gpu_name=H100, models_dir=str(rank_dir))
    c = d.select(64, 4096, 4096, "fp8")
    # The decision did not run (or even load) the companion: a cold decision pays only for the pick.
    assert c._estimate is not None and d._latency_models.get("fp8") is None
    # Read: the companion's estimate for the pick's own feature row, in microseconds.
    cols = F.problem_columns(64, 4096, 4096, "fp8", d.spec, *_pick_columns(c.candidate))
    want = float(np.exp2(d.latency_model_for("fp8").score(F.compute(cols, op="gemm")))[0])
    assert c.predicted_us == pytest.approx(want, rel=1e-6) and c._estimate is None
    # A value like a frozen dataclass: equal to its eager twin, hashable, immutable, picklable.
    twin = Choice(c.candidate, "model", c.predicted_us, c.score)
    assert c == twin and hash(c) == hash(twin) and pickle.loads(pickle.dumps(c)) == twin
    assert "predicted_us=" in repr(c)
    with pytest.raises(AttributeError, match="immutable"):
        c.source = "table"


def _pick_columns(cid):
    import numpy as np

    from gemm_costmodel.serving.candidates import table

    ct = table("sm90", "fp8", op="gemm")
    i = ct.index[cid]
    return np.asarray([ct.variant_code[i]]), {p: np.asarray([ct.params[p][i]]) for p in ct.params}
