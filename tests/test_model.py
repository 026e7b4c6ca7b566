"""The XGBoost cost model: config checks, targets by hand, fitting on the committed fp8 subset."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel.learning.model import (FORMULATIONS, SHORTLIST_EDGES, CostModel, TrainConfig, m_bucket_index,
                                           rank_grades, shape_ids, targets, training_rows)
from gemm_costmodel.learning.pipeline import load_training_frame

FP8 = ["datasets/gemm/fp8/eval-fp8-shard01of40.parquet", "datasets/gemm/fp8/train-fp8-shard00of16.parquet"]
# n_jobs=1: OpenMP threads spin when the CPUs are shared, which makes 2 threads far slower than 1.
SMALL = TrainConfig(formulation="log_latency", n_estimators=20, max_depth=4, n_jobs=1)


@pytest.fixture(scope="module")
def fp8():
    return load_training_frame(FP8, op="gemm")


@pytest.fixture(scope="module")
def models(fp8):
    return {f: CostModel(SMALL.with_(formulation=f)).fit(fp8) for f in FORMULATIONS}


# -- config ----------------------------------------------------------------------------

def test_train_config_rejects_unknown_formulation():
    with pytest.raises(ValueError, match="formulation must be one of"):
        TrainConfig(formulation="lambdamart")
    with pytest.raises(ValueError):
        TrainConfig(n_estimators=0)
    with pytest.raises(ValueError):
        TrainConfig(max_depth=0)
    with pytest.raises(ValueError):
        SMALL.with_(formulation="nope")


def test_train_config_xgb_params():
    assert SMALL.xgb_params()["objective"] == "reg:squarederror"
    assert SMALL.with_(formulation="normalized").xgb_params()["objective"] == "reg:squarederror"
    p = SMALL.with_(formulation="rank").xgb_params()
    assert p["objective"] == "rank:pairwise"
    assert p["max_depth"] == 4 and p["nthread"] == 1 and p["seed"] == 0
    assert SMALL.with_(seed=3).seed == 3 and SMALL.seed == 0


def test_m_bucket_index_edges():
    assert SHORTLIST_EDGES == (16, 64, 256, 1024)
    np.testing.assert_array_equal(m_bucket_index([1, 16, 17, 64, 65, 256, 257, 1024, 1025, 10 ** 6]),
                                  [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])


# -- targets by hand ------------------------------------------------------------------------

def hand_frame() -> pd.DataFrame:
    rows = []
    # Shape S (m=16): 10, 10.5, 20, 100 us. Shape T (m=32): 4.2, 4, 8 us (best not first).
    for m, lats in ((16, [10.0, 10.5, 20.0, 100.0]), (32, [4.2, 4.0, 8.0])):
        for i, lat in enumerate(lats):
            rows.append({"gpu_name": "NVIDIA H200", "op": "gemm", "dtype": "fp8", "m": m, "n": 1024, "k": 1024,
                         "e": 1, "top_k": 1, "candidate": f"c{i}", "p50_us": lat, "status": "ok", "stable": True})
    return pd.DataFrame(rows)


def test_shape_ids_in_order_of_appearance():
    np.testing.assert_array_equal(shape_ids(hand_frame()), [0, 0, 0, 0, 1, 1, 1])


def test_targets_log_latency():
    np.testing.assert_allclose(targets(hand_frame(), "log_latency"),
                               np.log2([10.0, 10.5, 20.0, 100.0, 4.2, 4.0, 8.0]))


def test_targets_normalized():
    # latency / best of its shape: S best 10, T best 4.
    np.testing.assert_allclose(targets(hand_frame(), "normalized"),
                               [0.0, math.log2(1.05), 1.0, math.log2(10.0), math.log2(1.05), 0.0, 1.0], atol=1e-12)


def test_targets_rank_grades():
    # grade = clip(30 - floor(ln(slowdown) / ln(1.03)), 0, 30):
    #   1.00 -> 30; 1.05 -> ln 1.05 / ln 1.03 = 1.65 -> 29; 2 -> 23.45 -> 7; 10 -> 77.9 -> clipped to 0.
    np.testing.assert_array_equal(targets(hand_frame(), "rank"), [30, 29, 7, 0, 29, 30, 7])


def test_targets_rank_grades_finer_step():
    # rank_step 1.01 spans the same 2.43x in round(30 ln 1.03 / ln 1.01) = round(89.1) = 89 grades:
    #   1.05 -> ln 1.05 / ln 1.01 = 4.90 -> 85; 2 -> 69.66 -> 20; 10 -> 231.4 -> clipped to 0.
    assert rank_grades(1.03) == 30 and rank_grades(1.01) == 89
    np.testing.assert_array_equal(targets(hand_frame(), "rank", rank_step=1.01), [89, 85, 20, 0, 85, 89, 20])


def test_train_config_rank_step_range():
    assert TrainConfig().rank_step == 1.03
    for bad in (1.0, 0.9, 2.0):
        with pytest.raises(ValueError, match="rank_step must be in"):
            TrainConfig(rank_step=bad)


def test_training_rows_filters():
    df = hand_frame()
    df.loc[1, "stable"] = False
    df.loc[2, "status"] = "crash"
    df.loc[3, "p50_us"] = np.nan
    assert list(training_rows(df).index) == [0, 4, 5, 6]
    assert list(training_rows(df, stable_only=False).index) == [0, 1, 4, 5, 6]


# -- fitting -------------------------------------------------------------------------------

def test_fit_returns_self_and_sets_state(fp8):
    model = CostModel(SMALL)
    assert model.fit(fp8) is model
    assert model.booster_.num_boosted_rounds() == 20
    assert model.feature_names_ == F.FEATURE_NAMES
    assert model.schema_hash_ == F.schema_hash(op="gemm")
    assert model.n_rows_ == int((fp8["status"] == "ok").sum() - (~fp8["stable"]).sum())
    assert model.n_shapes_ == fp8.drop_duplicates(["m", "n", "k"]).shape[0]
    assert model.params()["n_estimators"] == 20


def test_shortlist_has_cublas_and_each_shapes_best(fp8, models):
    model = models["log_latency"]
    sl = model.shortlist_
    assert sorted(sl) == list(range(len(SHORTLIST_EDGES) + 1))
    for ids in sl.values():
        assert "cublas" in ids and ids == sorted(ids)
    best = fp8.loc[fp8.groupby(["m", "n", "k"])["p50_us"].idxmin()]
    for m, cand in zip(best["m"], best["candidate"]):
        assert cand in sl[int(m_bucket_index(m))], (m, cand)
    keep = model.in_shortlist(fp8)
    assert keep.dtype == bool and len(keep) == len(fp8) and 0 < keep.sum() < len(fp8)
    assert keep[(fp8["candidate"] == "cublas").to_numpy()].all()


def test_shortlist_disabled(fp8):
    model = CostModel(SMALL.with_(shortlist_tol=0, n_estimators=2)).fit(fp8)
    assert model.shortlist_ is None
    assert model.in_shortlist(fp8).all()


def test_unstable_and_failed_rows_are_not_trained_on(fp8):
    base = CostModel(SMALL.with_(n_estimators=2)).fit(fp8)
    df = fp8.copy()
    shape = (df["m"] == 128) & (df["n"] == 3584) & (df["k"] == 5120)
    crash = df.index[~shape][:10]
    df.loc[shape, "stable"] = False
    df["status"] = df["status"].astype(str)
    df.loc[crash, "status"] = "crash"
    model = CostModel(SMALL.with_(n_estimators=2)).fit(df)
    lost = int((shape & fp8["stable"]).sum() + fp8.loc[crash, "stable"].sum())
    assert lost > 0 and model.n_rows_ == base.n_rows_ - lost
    assert model.n_shapes_ == base.n_shapes_ - 1
    # Without stable_only the unstable rows are used.
    loose = CostModel(SMALL.with_(n_estimators=2, stable_only=False)).fit(df)
    assert loose.n_rows_ == len(df) - len(crash)


@pytest.mark.parametrize("formulation", ["log_latency", "rank"])
def test_evaluation_shapes_carry_eval_weight(fp8, formulation, monkeypatch):
    import xgboost as xgb

    seen = {}
    real_train = xgb.train

    def spy(params, dtrain, *a, **kw):
        seen["w"] = dtrain.get_weight()
        seen["groups"] = dtrain.get_uint_info("group_ptr")
        return real_train(params, dtrain, *a, **kw)

    monkeypatch.setattr(xgb, "train", spy)
    CostModel(SMALL.with_(n_estimators=2, formulation=formulation, eval_weight=5.0)).fit(fp8)
    rows = training_rows(fp8)
    if formulation == "rank":
        # One weight per query (shape), 5 for evaluation shapes.
        per_shape = rows.groupby(shape_ids(rows))["eval_shape"].first()
        assert len(seen["w"]) == len(seen["groups"]) - 1 == len(per_shape)
        assert sorted(seen["w"]) == sorted(np.where(per_shape, 5.0, 1.0))
    else:
        assert sorted(seen["w"]) == sorted(np.where(rows["eval_shape"].astype(bool), 5.0, 1.0))
    assert (seen["w"] == 5.0).any() and (seen["w"] == 1.0).any()
    with pytest.raises(ValueError, match="eval_weight"):
        SMALL.with_(eval_weight=0)


def test_decode_shapes_carry_decode_weight_on_top_of_eval_weight(fp8, monkeypatch):
    import xgboost as xgb

    seen = {}
    real_train = xgb.train

    def spy(params, dtrain, *a, **kw):
        seen["w"] = dtrain.get_weight()
        return real_train(params, dtrain, *a, **kw)

    monkeypatch.setattr(xgb, "train", spy)
    rows = training_rows(fp8)
    cut = int(np.sort(rows["m"].unique())[0])  # the smallest M counts as decode here
    CostModel(SMALL.with_(n_estimators=2, formulation="rank", eval_weight=5.0, decode_weight=3.0,
                            decode_max_m=cut)).fit(fp8)
    per_shape = rows.groupby(shape_ids(rows)).agg(ev=("eval_shape", "first"), m=("m", "first"))
    want = np.where(per_shape["ev"], 5.0, 1.0) * np.where(per_shape["m"] <= cut, 3.0, 1.0)
    assert sorted(seen["w"]) == sorted(want) and (per_shape["m"] <= cut).any() and (per_shape["m"] > cut).any()
    for bad, match in ((0.0, "decode_weight"), (float("inf"), "decode_weight")):
        with pytest.raises(ValueError, match=match):
            SMALL.with_(decode_weight=bad)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="decode_max_m"):
            SMALL.with_(decode_max_m=bad)


def test_relative_formulations_drop_single_row_shapes(fp8):
    df = fp8.copy()
    # A shape left with one stable row has nothing to compare against.
    shape = (df["m"] == 128) & (df["n"] == 3584) & (df["k"] == 5120)
    df.loc[shape, "stable"] = False
    df.loc[df.index[shape][0], "stable"] = True
    n_log = CostModel(SMALL.with_(n_estimators=2)).fit(df).n_rows_
    n_rel = CostModel(SMALL.with_(n_estimators=2, formulation="normalized")).fit(df).n_rows_
    assert n_rel == n_log - 1


def test_same_seed_same_scores(fp8, models):
    again = CostModel(SMALL).fit(fp8)
    a, b = models["log_latency"].score_frame(fp8), again.score_frame(fp8)
    np.testing.assert_array_equal(a, b)
    other = CostModel(SMALL.with_(seed=1)).fit(fp8)
    assert not np.array_equal(a, other.score_frame(fp8))


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_every_formulation_fits_and_ranks(fp8, models, formulation):
    model = models[formulation]
    s = model.score_frame(fp8)
    assert s.shape == (len(fp8),) and np.all(np.isfinite(s))
    np.testing.assert_array_equal(s, model.score(F.from_frame(fp8, hardware.spec_for)))
    # Lower score = faster: within shapes, score and latency agree on the training data.
    t = fp8[["m", "n", "k", "p50_us"]].assign(s=s)
    rho = t.groupby(["m", "n", "k"]).apply(lambda g: g["s"].corr(g["p50_us"], method="spearman"),
                                            include_groups=False)
    assert rho.mean() > 0.3, rho.describe()
    if formulation == "log_latency":
        # Scores are log2 latencies: close to the truth on the training data.
        assert np.median(np.abs(s - np.log2(fp8["p50_us"]))) < 0.5


def test_rank_score_is_negated_margin(fp8, models):
    import xgboost as xgb

    model = models["rank"]
    X = F.from_frame(fp8.head(50), hardware.spec_for)
    margin = model.booster_.predict(xgb.DMatrix(X), output_margin=True)
    np.testing.assert_array_equal(model.score(X), -margin)


def test_no_trainable_rows_raises(fp8):
    df = fp8.assign(stable=False)
    with pytest.raises(ValueError, match="no trainable rows"):
        CostModel(SMALL).fit(df)
    df = fp8.assign(status="crash")
    with pytest.raises(ValueError, match="no trainable rows"):
        CostModel(SMALL).fit(df)


def test_train_config_parallel_trees():
    assert "num_parallel_tree" not in SMALL.xgb_params()
    assert SMALL.with_(parallel_trees=3).xgb_params()["num_parallel_tree"] == 3
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="parallel_trees must be an int >= 1"):
            SMALL.with_(parallel_trees=bad)


def test_parallel_trees_average_rather_than_add(fp8):
    """3 trees per round are averaged: 3x the trees, margins on the same scale as one tree per
    round (not 3x larger), and a different model from seed to seed no more than one tree per round."""
    one = CostModel(SMALL.with_(n_estimators=10)).fit(fp8)
    three = CostModel(SMALL.with_(n_estimators=10, parallel_trees=3)).fit(fp8)
    assert len(one.booster_.get_dump()) == 10 and len(three.booster_.get_dump()) == 30
    X_ = F.from_frame(fp8.head(500), hardware.spec_for)
    a, b = one.score(X_), three.score(X_)
    assert np.corrcoef(a, b)[0, 1] > 0.95
    assert 0.8 < np.std(b) / np.std(a) < 1.25


def test_train_config_n_seeds():
    assert SMALL.n_seeds == 1
    for bad in (0, -2, 2.0, True, "2"):
        with pytest.raises(ValueError, match="n_seeds must be an int >= 1"):
            SMALL.with_(n_seeds=bad)


def test_n_seeds_is_the_mean_of_the_seeds_models_in_one_booster(fp8):
    """n_seeds=3 scores exactly the mean of the three single models of seeds 0, 1, 2 (to fp32
    rounding), in one booster of 3x the trees, interleaved round by round: its first 3 trees are
    the seeds' first trees, each a third of its weight."""
    cfg = SMALL.with_(formulation="rank", n_estimators=8)
    singles = [CostModel(cfg.with_(seed=s)).fit(fp8) for s in range(3)]
    merged = CostModel(cfg.with_(n_seeds=3)).fit(fp8)
    X_ = F.from_frame(fp8.head(400), hardware.spec_for)
    want = np.mean([m.score(X_) for m in singles], axis=0)
    np.testing.assert_allclose(merged.score(X_), want, rtol=0, atol=2e-5 * max(1.0, np.abs(want).max()))
    assert merged.booster_.num_boosted_rounds() == 24
    import xgboost as xgb

    d = xgb.DMatrix(np.asarray(X_, dtype=np.float32))
    first = merged.booster_[0:3].predict(d, output_margin=True)
    parts = np.mean([m.booster_[0:1].predict(d, output_margin=True) for m in singles], axis=0)
    np.testing.assert_allclose(first, parts, rtol=0, atol=1e-5)
    # The merged booster exports like any other: ONNX gives its margin.
    import onnxruntime as ort

    from gemm_costmodel.learning.export import INPUT_NAME, to_onnx

    sess = ort.InferenceSession(to_onnx(merged.booster_, X_.shape[1]).SerializeToString())
    got = sess.run(None, {INPUT_NAME: np.asarray(X_, dtype=np.float32)})[0].ravel()
    np.testing.assert_allclose(-got, merged.score(X_), rtol=0, atol=1e-4)


def test_merge_boosters_rejects_mismatched_boosters(fp8):
    from gemm_costmodel.learning.model import merge_boosters

    a = CostModel(SMALL.with_(n_estimators=4)).fit(fp8).booster_
    b = CostModel(SMALL.with_(n_estimators=5)).fit(fp8).booster_
    with pytest.raises(ValueError, match="same number of rounds"):
        merge_boosters([a, b])
    c = CostModel(SMALL.with_(n_estimators=4, parallel_trees=2)).fit(fp8).booster_
    with pytest.raises(ValueError, match="one tree per round"):
        merge_boosters([a, c])


def test_cli_training_config_takes_rank_step_from_the_op_then_the_command_line():
    import argparse

    from gemm_costmodel.cli import _train_config

    def cfg(op, rank_step=None):
        ns = argparse.Namespace(op=op, formulation=None, trees=None, depth=None, eta=None, jobs=1, seed=0,
                                eval_weight=None, shortlist_tol=None, vendor_margin=None, parallel_trees=None,
                                rank_step=rank_step)
        return _train_config(ns)

    # Every registered op grades in 1% steps (registry train_defaults); TrainConfig's own default,
    # for an op that sets none, stays 3%.
    assert cfg("gemm").rank_step == 1.01 and cfg("moe").rank_step == 1.01
    assert cfg("fp8_blockscale").rank_step == 1.01
    assert TrainConfig().rank_step == 1.03
    assert cfg("gemm", rank_step=1.02).rank_step == 1.02
    with pytest.raises(ValueError, match="rank_step must be in"):
        cfg("gemm", rank_step=1.0)


def test_cli_n_seeds_reaches_the_training_config():
    from gemm_costmodel.cli import _train_config, build_parser

    args = build_parser().parse_args(["train", "--op", "moe", "--n-seeds", "3"])
    assert _train_config(args).n_seeds == 3
    assert _train_config(build_parser().parse_args(["train", "--op", "moe"])).n_seeds == 1


def test_train_config_split_m():
    assert TrainConfig().split_m == 0
    for bad in (-1, 2.0, True, "2"):
        with pytest.raises(ValueError, match="split_m must be an int >= 0"):
            SMALL.with_(split_m=bad)


@pytest.mark.parametrize("formulation", ["rank", "log_latency"])
def test_split_m_scores_each_side_with_the_model_fitted_on_that_side_alone(fp8, formulation):
    """split_m=2: rows with M <= 2 score exactly as a model fitted on the M <= 2 queries alone, the
    others as one fitted on the M > 2 queries alone (to fp32 rounding), in one booster of the same
    number of trees, which exports to ONNX with the same margin."""
    import xgboost as xgb

    cfg = SMALL.with_(formulation=formulation, n_estimators=8)
    low = fp8["m"] <= 2
    assert low.any() and not low.all()
    split = CostModel(cfg.with_(split_m=2)).fit(fp8)
    lo, hi = CostModel(cfg).fit(fp8[low]), CostModel(cfg).fit(fp8[~low])
    assert split.booster_.num_boosted_rounds() == 8
    # Both sides of the threshold, M = 1, 2 against 3 and 4097 included.
    rows = pd.concat([fp8[low].head(150), fp8[~low].head(150)])
    rows = pd.concat([rows, rows.head(3).assign(m=3), rows.head(3).assign(m=4097)])
    X_ = F.from_frame(rows, hardware.spec_for)
    is_low = rows["m"].to_numpy() <= 2
    want = np.where(is_low, lo.score(X_), hi.score(X_))
    np.testing.assert_allclose(split.score(X_), want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))
    # n_seeds on top: each seed's split model, averaged.
    two = CostModel(cfg.with_(split_m=2, n_seeds=2)).fit(fp8)
    singles = [CostModel(cfg.with_(split_m=2, seed=s)).fit(fp8) for s in range(2)]
    np.testing.assert_allclose(two.score(X_), np.mean([m.score(X_) for m in singles], axis=0), rtol=0,
                               atol=1e-4 * max(1.0, np.abs(want).max()))
    import onnxruntime as ort

    from gemm_costmodel.learning.export import INPUT_NAME, to_onnx

    sess = ort.InferenceSession(to_onnx(split.booster_, X_.shape[1]).SerializeToString())
    got = sess.run(None, {INPUT_NAME: np.asarray(X_, dtype=np.float32)})[0].ravel()
    margin = split.booster_.predict(xgb.DMatrix(np.asarray(X_, dtype=np.float32)), output_margin=True)
    np.testing.assert_allclose(got, margin, rtol=0, atol=1e-4 * max(1.0, np.abs(margin).max()))


def test_split_high_rows_all_fits_the_high_side_on_every_query(fp8):
    """split_high_rows="all": rows with M <= 2 score as a model fitted on the M <= 2 queries alone,
    the others as the model fitted on every query (the unsplit model), to fp32 rounding."""
    cfg = SMALL.with_(formulation="rank", n_estimators=6)
    low = fp8["m"] <= 2
    split = CostModel(cfg.with_(split_m=2, split_high_rows="all")).fit(fp8)
    lo, whole = CostModel(cfg).fit(fp8[low]), CostModel(cfg).fit(fp8)
    rows = pd.concat([fp8[low].head(100), fp8[~low].head(100)])
    rows = pd.concat([rows, rows.head(3).assign(m=3), rows.head(3).assign(m=1)])
    X_ = F.from_frame(rows, hardware.spec_for)
    want = np.where(rows["m"].to_numpy() <= 2, lo.score(X_), whole.score(X_))
    np.testing.assert_allclose(split.score(X_), want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))
    # The default fits the high side on its own queries: a different model there.
    hi = rows["m"].to_numpy() > 2
    assert not np.allclose(CostModel(cfg.with_(split_m=2)).fit(fp8).score(X_)[hi], whole.score(X_)[hi])
    with pytest.raises(ValueError, match="split_high_rows must be one of high, all"):
        SMALL.with_(split_high_rows="low")


def test_split_low_rows_all_fits_the_low_side_on_every_query_weighted(fp8):
    """split_low_rows="all" with weight w: rows with M <= 2 score as one model fitted on every query
    with the M <= 2 ones weighted w (decode_weight w up to M = 2), the others as the model of the
    M > 2 queries alone (split_high_rows "high"), to fp32 rounding."""
    cfg = SMALL.with_(formulation="rank", n_estimators=6)
    low = fp8["m"] <= 2
    split = CostModel(cfg.with_(split_m=2, split_low_rows="all", split_low_weight=5.0)).fit(fp8)
    lo = CostModel(cfg.with_(decode_weight=5.0, decode_max_m=2)).fit(fp8)
    hi = CostModel(cfg).fit(fp8[~low])
    rows = pd.concat([fp8[low].head(100), fp8[~low].head(100)])
    X_ = F.from_frame(rows, hardware.spec_for)
    m2 = rows["m"].to_numpy() <= 2
    want = np.where(m2, lo.score(X_), hi.score(X_))
    np.testing.assert_allclose(split.score(X_), want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))
    # The weight is what the low side learns from: weight 1 is the whole unweighted model there.
    even = CostModel(cfg.with_(split_m=2, split_low_rows="all")).fit(fp8).score(X_)
    np.testing.assert_allclose(even[m2], CostModel(cfg).fit(fp8).score(X_)[m2], rtol=0,
                               atol=1e-4 * max(1.0, np.abs(want).max()))
    assert not np.allclose(even[m2], want[m2])


@pytest.mark.parametrize("kw, match", [
    ({"split_low_rows": "high"}, "split_low_rows must be one of low, all"),
    ({"split_low_rows": "all", "split_low_weight": 0.0}, "split_low_weight must be finite and > 0"),
    ({"split_low_rows": "all", "split_low_weight": float("inf")}, "split_low_weight must be finite and > 0"),
    ({"split_low_rows": "all", "split_low_weight": True}, "split_low_weight must be finite and > 0"),
    ({"split_low_weight": 20.0}, "needs split_low_rows 'all'"),
])
def test_split_low_rows_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SMALL.with_(**kw)


def test_split_m_with_one_side_empty_is_one_model(fp8):
    cfg = SMALL.with_(formulation="rank", n_estimators=4)
    high = fp8[fp8["m"] > 2]
    X_ = F.from_frame(high.head(50), hardware.spec_for)
    np.testing.assert_array_equal(CostModel(cfg.with_(split_m=2)).fit(high).score(X_),
                                  CostModel(cfg).fit(high).score(X_))


def test_gate_trees_rejects_categorical_splits():
    from gemm_costmodel.learning.model import gate_trees

    t = {"left_children": [-1], "right_children": [-1], "parents": [2147483647], "split_indices": [0],
         "split_conditions": [0.5], "split_type": [0], "default_left": [0], "base_weights": [0.5],
         "loss_changes": [0.0], "sum_hessian": [1.0], "categories": [1], "categories_nodes": [0],
         "categories_segments": [0], "categories_sizes": [1], "id": 0,
         "tree_param": {"num_nodes": "1", "num_deleted": "0", "num_feature": "1", "size_leaf_vector": "1"}}
    with pytest.raises(ValueError, match="categorical"):
        gate_trees(t, t, 0, 1.0)


def test_cli_split_m_from_the_op_then_the_command_line():
    from gemm_costmodel.cli import _train_config, build_parser

    # The dense op splits off M <= 2 and MoE M <= 4 (registry train_defaults); fp8_blockscale M = 1,
    # its M > 1 trees fitted on every query.
    assert _train_config(build_parser().parse_args(["train"])).split_m == 2
    assert _train_config(build_parser().parse_args(["train", "--op", "moe"])).split_m == 4
    assert _train_config(build_parser().parse_args(["train", "--op", "fp8_blockscale"])).split_m == 1
    assert _train_config(build_parser().parse_args(["train", "--op", "fp8_blockscale"])).split_high_rows == "all"
    fp8bs = _train_config(build_parser().parse_args(["train", "--op", "fp8_blockscale"]))
    assert (fp8bs.split_low_rows, fp8bs.split_low_weight) == ("all", 20.0)
    assert _train_config(build_parser().parse_args(["train", "--split-m", "0"])).split_m == 0
    assert _train_config(build_parser().parse_args(["train"])).split_high_rows == "high"
    assert _train_config(build_parser().parse_args(["train", "--split-high-rows", "all"])).split_high_rows == "all"
    cfg = _train_config(build_parser().parse_args(["train", "--split-low-rows", "all", "--split-low-weight", "3"]))
    assert (cfg.split_low_rows, cfg.split_low_weight) == ("all", 3.0)
    assert (_train_config(build_parser().parse_args(["train"])).split_low_rows,
            _train_config(build_parser().parse_args(["train"])).split_low_weight) == ("low", 1.0)


def test_cli_weight_gpu_from_the_op_then_the_command_line():
    from gemm_costmodel.cli import _train_config, build_parser

    for cmd in ("train", "evaluate", "run"):
        cfg = _train_config(build_parser().parse_args([cmd, "--op", "gemm"]))
        assert (cfg.weight_gpu, cfg.gpu_weight) == ("", 1.0)
        cfg = _train_config(build_parser().parse_args([cmd, "--op", "gemm", "--weight-gpu", "NVIDIA H200",
                                                       "--gpu-weight", "2.5"]))
        assert (cfg.weight_gpu, cfg.gpu_weight) == ("NVIDIA H200", 2.5)
    with pytest.raises(ValueError, match="gpu_weight"):
        _train_config(build_parser().parse_args(["train", "--gpu-weight", "0"]))


def test_gate_boosters_rejects_mismatched_boosters(fp8):
    from gemm_costmodel.learning.model import gate_boosters

    a = CostModel(SMALL.with_(n_estimators=4)).fit(fp8).booster_
    b = CostModel(SMALL.with_(n_estimators=5)).fit(fp8).booster_
    with pytest.raises(ValueError, match="gate_boosters needs boosters of the same number of rounds"):
        gate_boosters(a, b, 0, 1.3)
    c = CostModel(SMALL.with_(n_estimators=4, parallel_trees=2)).fit(fp8).booster_
    with pytest.raises(ValueError, match="gate_boosters needs one tree per round"):
        gate_boosters(a, c, 0, 1.3)


def test_train_config_shortlist_edges():
    assert TrainConfig().shortlist_edges == SHORTLIST_EDGES
    # Read back from JSON (a training side file): a list becomes the tuple.
    assert SMALL.with_(shortlist_edges=[1, 2, 8]).shortlist_edges == (1, 2, 8)
    for bad in ((), (4, 2), (2, 2), (0, 4), (1.0, 4), (True, 4), "1,2", None):
        with pytest.raises(ValueError, match="shortlist_edges must be a non-empty tuple of increasing ints"):
            SMALL.with_(shortlist_edges=bad)


def test_m_bucket_index_with_own_edges():
    # M <= 1 -> 0, M = 2 -> 1, 3..8 -> 2, above 8 -> 3.
    np.testing.assert_array_equal(m_bucket_index([1, 2, 3, 8, 9, 4096], (1, 2, 8)), [0, 1, 2, 2, 3, 3])


def test_shortlist_follows_its_edges(fp8):
    edges = (1, 64, 512)
    model = CostModel(SMALL.with_(shortlist_edges=edges, n_estimators=2)).fit(fp8)
    sl = model.shortlist_
    assert sorted(sl) == [0, 1, 2, 3]
    best = fp8.loc[fp8.groupby(["m", "n", "k"])["p50_us"].idxmin()]
    for m, cand in zip(best["m"], best["candidate"]):
        assert cand in sl[int(m_bucket_index(m, edges))], (m, cand)
    # in_shortlist reads the same buckets: a row is kept iff its candidate is on its M's bucket.
    keep = model.in_shortlist(fp8)
    b = m_bucket_index(fp8["m"].to_numpy(), edges)
    expect = [c in set(sl[int(i)]) for c, i in zip(fp8["candidate"].astype(str), b)]
    np.testing.assert_array_equal(keep, expect)
    assert model.params()["shortlist_edges"] == [1, 64, 512]  # JSON-shaped, as the manifest holds it


def test_cli_shortlist_edges_from_the_op_then_the_command_line():
    from gemm_costmodel.cli import _train_config, build_parser

    fine = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
    assert _train_config(build_parser().parse_args(["train"])).shortlist_edges == fine
    assert _train_config(build_parser().parse_args(["train"])).shortlist_tol == 1.03
    # MoE and fp8_blockscale take the dense op's edges too (issue 58); grouped_gemm the defaults.
    assert _train_config(build_parser().parse_args(["train", "--op", "moe"])).shortlist_edges == fine
    assert _train_config(build_parser().parse_args(["train", "--op", "fp8_blockscale"])).shortlist_tol == 1.03
    assert _train_config(build_parser().parse_args(["train", "--op", "grouped_gemm"])).shortlist_edges == SHORTLIST_EDGES
    args = build_parser().parse_args(["train", "--shortlist-edges", "4,64"])
    assert _train_config(args).shortlist_edges == (4, 64)
    with pytest.raises(SystemExit):  # argparse names the option
        build_parser().parse_args(["train", "--shortlist-edges", "4,x"])
