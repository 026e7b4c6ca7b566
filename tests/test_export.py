"""ONNX export: parity with the booster for every formulation, the manifest, the file size."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning import export as X
from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel.learning import pipeline
from gemm_costmodel.serving.candidates import table as candidate_table
from gemm_costmodel.kernels.gemm.space import generate_configs, space_hash
from gemm_costmodel.learning.model import FORMULATIONS, SHORTLIST_EDGES, CostModel, TrainConfig

ort = pytest.importorskip("onnxruntime")
xgb = pytest.importorskip("xgboost")

FP8 = ["datasets/gemm/fp8/eval-fp8-shard01of40.parquet", "datasets/gemm/fp8/train-fp8-shard00of16.parquet"]
SMALL = TrainConfig(formulation="log_latency", n_estimators=20, max_depth=4, n_jobs=1)
TOL = 1e-5


@pytest.fixture(scope="module")
def fp8():
    return pipeline.load_training_frame(FP8, op="gemm")


@pytest.fixture(scope="module")
def fp8_hash(fp8):
    return X.data_hash(fp8)


@pytest.fixture(scope="module")
def exported(fp8, tmp_path_factory):
    """formulation -> (model, onnx path, manifest)."""
    out = {}
    for f in FORMULATIONS:
        model = CostModel(SMALL.with_(formulation=f)).fit(fp8)
        d = tmp_path_factory.mktemp(f)
        onnx_path, man_path = pipeline.export_model(model, fp8, str(d), arch="sm90", metrics={"x": {"y": 1.0}},
                                                    log=lambda msg: None)
        with open(man_path, encoding="utf-8") as fh:
            out[f] = (model, onnx_path, json.load(fh))
    return out


def session(path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def onnx_out(sess, X_) -> np.ndarray:
    return np.asarray(sess.run(None, {X.INPUT_NAME: np.asarray(X_, dtype=np.float32)})[0]).reshape(-1)


def random_rows(seed=0, shapes=40) -> np.ndarray:
    """Features of random fp8 shapes x their feasible candidates, as the runtime builds them."""
    rng = np.random.default_rng(seed)
    ct = candidate_table("sm90", "fp8", op="gemm")
    spec = hardware.spec_for("NVIDIA H200")
    out = []
    for i in range(shapes):
        m = int(rng.choice([1, 2, 7, 16, 33, 100, 513, 4097])) if i % 2 else int(rng.integers(1, 20000))
        # Half the shapes have N, K multiples of 16 (cuBLAS feasible for fp8), half do not.
        n, k = (int(v) for v in rng.integers(1, 4000, size=2) * (16 if i % 2 else 1) + (0 if i % 2 else 1))
        idx = np.flatnonzero(ct.feasible_mask(m, n, k))
        cols = {"m": m, "n": n, "k": k, "e": 1, "top_k": 1, "dtype_code": F.DTYPE_CODES["fp8"],
                "variant_code": ct.variant_code[idx], **{p: ct.params[p][idx] for p in F.PARAMS},
                **F.gpu_columns(spec, "fp8")}
        out.append(F.compute(cols, op="gemm"))
    return np.concatenate(out)


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_onnx_matches_booster_margin(exported, formulation):
    model, path, _ = exported[formulation]
    X_ = random_rows()
    assert X_.dtype == np.float32 and len(X_) > 1000
    got = onnx_out(session(path), X_)
    want = model.booster_.predict(xgb.DMatrix(X_), output_margin=True)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    assert np.std(want) > 0  # the model is not a constant


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_onnx_rankings_agree_on_evaluation_shapes(fp8, exported, formulation):
    model, path, man = exported[formulation]
    ev = E.eval_rows(fp8)
    X_ = F.from_frame(ev, hardware.spec_for)
    runtime = man["score_sign"] * onnx_out(session(path), X_).astype(np.float64)
    train = model.score(X_).astype(np.float64)
    np.testing.assert_allclose(runtime, train, rtol=TOL, atol=TOL)
    cand = ev["candidate"].to_numpy()
    for sid, g in ev.groupby("sid"):
        i = g.index.to_numpy()
        o_rt = i[np.lexsort((cand[i], runtime[i]))]
        o_tr = i[np.lexsort((cand[i], train[i]))]
        # Same order up to near-ties: walking the runtime's order, the training scores never drop by > TOL.
        np.testing.assert_allclose(train[o_rt], train[o_tr], atol=2 * TOL)
        # Where the winner is clear, both pick the same candidate.
        top2 = np.sort(train[i])[:2]
        if top2[1] - top2[0] > 1e-4:
            assert cand[o_rt[0]] == cand[o_tr[0]], sid
    # Same held-out metrics from either set of scores.
    a = E.summarize(E.per_shape(ev, runtime))
    b = E.summarize(E.per_shape(ev, train))
    assert a["geomean_slowdown"] == pytest.approx(b["geomean_slowdown"], rel=1e-3)


def test_as_regressor_keeps_margin(exported):
    model = exported["rank"][0]
    X_ = random_rows(seed=1, shapes=5)
    reg = X.as_regressor(model.booster_)
    np.testing.assert_array_equal(reg.predict(xgb.DMatrix(X_), output_margin=True),
                                  model.booster_.predict(xgb.DMatrix(X_), output_margin=True))
    assert json.loads(reg.save_raw("json"))["learner"]["objective"]["name"] == "reg:squarederror"


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_manifest_fields(fp8_hash, exported, formulation):
    model, path, man = exported[formulation]
    assert os.path.basename(path) == "gemm-sm90.onnx"
    assert man["op"] == "gemm" and man["dtypes"] == ["fp8"] and man["arch"] == "sm90"
    assert man["formulation"] == formulation
    assert man["score_sign"] == (-1.0 if formulation == "rank" else 1.0)
    assert man["predicts_log2_latency_us"] is (formulation == "log_latency")
    assert man["input_name"] == X.INPUT_NAME == session(path).get_inputs()[0].name
    assert session(path).get_inputs()[0].shape[-1] == len(F.FEATURE_NAMES)
    assert man["feature_schema_hash"] == F.schema_hash(op="gemm")
    assert man["feature_names"] == list(F.FEATURE_NAMES)
    assert man["config_space_hash"] == {"fp8": space_hash(generate_configs("sm90", "fp8"))}
    assert man["config_space_hash"]["fp8"] == candidate_table("sm90", "fp8", op="gemm").space_hash
    assert man["training_data_hash"] == fp8_hash
    assert man["training_rows"] == model.n_rows_ and man["training_shapes"] == model.n_shapes_
    assert man["training_gpus"] == ["NVIDIA H200"]
    assert man["shortlist"]["m_edges"] == list(SHORTLIST_EDGES)
    assert man["shortlist"]["buckets"] == {str(k): v for k, v in model.shortlist_.items()}
    assert all("cublas" in v for v in man["shortlist"]["buckets"].values())
    assert man["hyperparameters"] == model.params()
    assert man["metrics"] == {"x": {"y": 1.0}}
    assert set(man["versions"]) >= {"xgboost", "onnxmltools", "onnx", "numpy", "python"}
    assert man["onnx_bytes"] == os.path.getsize(path)
    with open(path, "rb") as fh:
        assert man["onnx_sha256"] == hashlib.sha256(fh.read()).hexdigest()
    assert man["created"]


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_onnx_file_under_5mb(exported, formulation):
    _, path, _ = exported[formulation]
    assert os.path.getsize(path) < 5 * 2**20


def test_data_hash_is_order_independent_and_sensitive(fp8):
    part = fp8.head(500)
    h = X.data_hash(part)
    assert h == X.data_hash(part.sample(frac=1.0, random_state=0))
    changed = part.copy()
    changed.loc[changed.index[0], "p50_us"] *= 2
    assert X.data_hash(changed) != h


def test_model_name():
    assert X.model_name("gemm", "sm90") == "gemm-sm90"


# -- the decision model's cascade (issue 18) ------------------------------------------------------
@pytest.mark.parametrize("formulation", ["rank", "log_latency"])
def test_cascade_parts_sum_to_the_model(exported, formulation):
    """prefix (trees 0..3, with the base value) + suffix (trees 4..19) == the whole model, on
    runtime-built rows; the manifest names both files with their sizes and digests."""
    _, onnx_path, man = exported[formulation]
    cas = man["cascade"]
    # The dense op's registry entry keeps 16, the MoE op's 48 of a 30-tree prefix, fp8_blockscale's
    # 24 of a 40-tree prefix (the defaults, X.CASCADE_KEEP and X.CASCADE_PREFIX_FRACTION, are 32 and 0.2); each
    # shipped manifest carries its op's.
    from gemm_costmodel import registry

    assert (cas["trees"], cas["prefix_trees"], cas["keep"]) == (20, 4, registry.get("gemm").cascade["keep"])
    assert registry.get("moe").cascade == {"keep": 48, "prefix_trees": 30}
    assert registry.get("fp8_blockscale").cascade == {"keep": 24, "prefix_trees": 40} and X.CASCADE_KEEP == 32
    import json

    for op in ("gemm", "moe", "fp8_blockscale"):
        with open(os.path.join("models", f"{op}-sm90.json"), encoding="utf-8") as fh:
            shipped = json.load(fh)["cascade"]
        opts = registry.get(op).cascade
        assert shipped["keep"] == opts.get("keep", X.CASCADE_KEEP), op
        assert shipped["prefix_trees"] == opts.get(
            "prefix_trees", round(shipped["trees"] * opts.get("prefix_fraction", X.CASCADE_PREFIX_FRACTION))), op
    d = os.path.dirname(onnx_path)
    rows = random_rows(seed=3, shapes=12)
    parts = []
    for part in ("prefix", "suffix"):
        path = os.path.join(d, cas[part]["file"])
        data = open(path, "rb").read()
        assert cas[part]["onnx_bytes"] == len(data)
        assert cas[part]["onnx_sha256"] == hashlib.sha256(data).hexdigest()
        parts.append(onnx_out(session(path), rows))
    whole = onnx_out(session(onnx_path), rows)
    np.testing.assert_allclose(parts[0] + parts[1], whole, rtol=0, atol=1e-5)
    # The prefix alone is a different (coarser) model: it must not equal the whole.
    assert not np.allclose(parts[0], whole, atol=1e-5)


def test_slice_trees_by_hand(exported):
    """Slicing keeps exactly the named trees: the sum over a partition of the trees is the model."""
    import onnx

    _, onnx_path, _ = exported["rank"]
    proto = onnx.load(onnx_path)
    assert X.tree_count(proto) == 20
    rows = random_rows(seed=4, shapes=6)
    outs = [onnx_out(ort.InferenceSession(X.slice_trees(proto, lo, hi, lo == 0).SerializeToString(),
                                          providers=["CPUExecutionProvider"]), rows)
            for lo, hi in ((0, 1), (1, 7), (7, 20))]
    np.testing.assert_allclose(sum(outs), onnx_out(session(onnx_path), rows), rtol=0, atol=1e-5)
    assert X.tree_count(X.slice_trees(proto, 7, 20, False)) == 13
    with pytest.raises(ValueError, match="no trees"):
        X.slice_trees(proto, 20, 30, False)


def test_write_cascade_options(exported, tmp_path):
    import shutil

    _, onnx_path, _ = exported["rank"]
    src = os.path.dirname(onnx_path)
    for name in ("gemm-sm90.onnx", "gemm-sm90.json"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    o, j = str(tmp_path / "gemm-sm90.onnx"), str(tmp_path / "gemm-sm90.json")
    assert X.write_cascade(o, j, prefix_trees=10, keep=3)["prefix_trees"] == 10
    assert json.load(open(j))["cascade"]["keep"] == 3
    # A prefix of every tree leaves nothing to cascade: the manifest then has no cascade.
    assert X.write_cascade(o, j, prefix_trees=20) is None
    assert "cascade" not in json.load(open(j))
    with pytest.raises(ValueError, match="keep must be >= 1"):
        X.write_cascade(o, j, keep=0)


def test_parallel_trees_export_matches_the_booster_and_splits(fp8, tmp_path):
    """parallel_trees=3: 3 trees per round, their mean in the booster; the ONNX model holds all
    of them and equals the booster's margin, and the cascade's parts still sum to it."""
    cfg = SMALL.with_(formulation="rank", n_estimators=8, parallel_trees=3, subsample=0.7)
    model = CostModel(cfg).fit(fp8)
    assert len(model.booster_.get_dump()) == 24
    onnx_path, man_path = pipeline.export_model(model, fp8, str(tmp_path), arch="sm90", metrics={},
                                                log=lambda msg: None)
    man = json.load(open(man_path, encoding="utf-8"))
    assert man["hyperparameters"]["parallel_trees"] == 3
    rows = random_rows(seed=5, shapes=10)
    want = model.booster_.predict(xgb.DMatrix(rows), output_margin=True)
    whole = onnx_out(session(onnx_path), rows)
    np.testing.assert_allclose(whole, want, rtol=TOL, atol=TOL)
    cas = man["cascade"]
    assert cas["trees"] == 24
    d = os.path.dirname(onnx_path)
    parts = [onnx_out(session(os.path.join(d, cas[p]["file"])), rows) for p in ("prefix", "suffix")]
    np.testing.assert_allclose(parts[0] + parts[1], whole, rtol=0, atol=1e-5)
