"""Adaptation curves from rows a card already has (learning.curve; issue 58): hand-computed groups,
folds, pools, row seconds, budgets and model-guided rounds on tiny frames."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.learning import curve as C
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning.model import TrainConfig

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
T0 = pd.Timestamp("2026-11-21T21:00:00+00:00")


def row(gpu, m, cand, p50, family, eval_shape=True, suite="sweep", origins=None, t=0, uuid="u0"):
    r = {"gpu_name": gpu, "op": "gemm", "dtype": "fp8", "m": m, "n": 1024, "k": 1024, "e": 1, "top_k": 1,
         "candidate": cand, "variant": "vendor" if cand == "cublas" else "tiled", "p50_us": p50, "status": "ok",
         "stable": True, "eval_shape": eval_shape, "family": family, "suite": suite,
         "origins": origins or f"{family}/model/layer/tp1", "gpu_uuid": uuid,
         "timestamp": (T0 + pd.Timedelta(seconds=t)).isoformat()}
    tile = {"block_m": 64, "block_n": 64, "block_k": 64, "group_m": 8, "split_k": 1, "num_warps": 4, "num_stages": 3}
    r.update({q: (0 if cand == "cublas" else v) for q, v in tile.items()})
    return r


def shape(gpu, m, family, **kw):
    return [row(gpu, m, "c1", 1.0, family, **kw), row(gpu, m, "cublas", 2.0, family, **kw)]


def ms(frame):
    return sorted(set(frame["m"]))


def cards():
    """H100: 1 eval a, 2 eval b, 3 eval c, 4 train a, 5 train d (origins d and b).
    H200: 11, 12, 13 eval a; 14, 15 eval b; 16 eval c; 17 eval d; 21 train a; 22 train b;
    23 train c (origins c and a); 11 again as a training row of another sweep (an evaluation
    problem: never in the pool)."""
    return pd.DataFrame(
        shape(H100, 1, "a") + shape(H100, 2, "b") + shape(H100, 3, "c") + shape(H100, 4, "a", eval_shape=False)
        + shape(H100, 5, "d", eval_shape=False, origins="d/m/l/tp1;b/m/l/tp2")
        + sum((shape(H200, m, f) for m, f in ((11, "a"), (12, "a"), (13, "a"), (14, "b"), (15, "b"), (16, "c"),
                                              (17, "d"))), [])
        + shape(H200, 21, "a", eval_shape=False) + shape(H200, 22, "b", eval_shape=False)
        + shape(H200, 23, "c", eval_shape=False, origins="c/m/l/tp1;a/m/l/tp1")
        + shape(H200, 11, "a", eval_shape=False, suite="other"))


def test_family_groups_balance_problem_counts():
    # H200 evaluation problems: a 3, b 2, c 1, d 1. a -> g0 (3); b -> g1 (2); c -> g1 (3);
    # d -> g0 (3 < 3? no: tie, first group) -> g0 (4).
    assert C.family_groups(cards(), H200, 2) == [("a", "d"), ("b", "c")]
    assert C.family_groups(cards(), H200, 1) == [("a", "b", "c", "d")]
    # More groups than families: empty ones dropped.
    assert C.family_groups(cards(), H200, 9) == [("a",), ("b",), ("c",), ("d",)]
    with pytest.raises(ValueError, match="no evaluation rows"):
        C.family_groups(cards(), "NVIDIA A100", 2)


def test_card_folds_hold_out_groups():
    folds = {f.name: f for f in E.card_folds(cards(), groups=[("a", "d"), ("b", "c")], cards=[H200])}
    assert sorted(folds) == [f"{H200}/a+d", f"{H200}/b+c"]
    ad, bc = folds[f"{H200}/a+d"], folds[f"{H200}/b+c"]
    # Scored: the H200's evaluation problems of the group; trained: the H100's rows none of whose
    # origins is in it (5 has origins d and b: out of both), never an H200 row.
    assert ms(ad.test) == [11, 12, 13, 17]
    assert ms(ad.train) == [2, 3]
    assert ms(bc.test) == [14, 15, 16]
    assert ms(bc.train) == [1, 4]
    assert set(ad.train["gpu_name"]) == {H100}
    # Without groups: one fold per family, as before.
    assert sorted(f.name for f in E.card_folds(cards(), cards=[H200])) == [f"{H200}/{x}" for x in "abcd"]


def test_pool_and_outside():
    df = cards()
    pool = C.card_pool(df, H200)
    # The H200's training rows, less the training row of evaluation problem 11.
    assert ms(pool) == [21, 22, 23]
    assert ms(C.outside(pool, ("a", "d"))) == [22]
    assert ms(C.outside(pool, ("b",))) == [21, 23]


def test_row_seconds_from_timestamps():
    # One sweep on one card: problem 1 (2 rows, first: the median per row, 1 s), problem 2 (3 rows, last
    # at +3 s: 3 s, 1 s a row), then a 17 s pause (a precompile) before problem 3 (first row at +20,
    # last at +22: 2 s, 1 s a row), and problem 4 (4 rows ending at +30: 8 s, 2 s a row). A second
    # sweep (other uuid) of one problem: the median of nothing, 0.
    rows = ([row(H200, 1, f"c{i}", 1.0, "a", t=0) for i in range(2)]
            + [row(H200, 2, f"c{i}", 1.0, "a", t=1 + i) for i in range(3)]
            + [row(H200, 3, f"c{i}", 1.0, "a", t=20 + 2 * i) for i in range(2)]
            + [row(H200, 4, f"c{i}", 1.0, "a", t=24 + 2 * i) for i in range(4)]
            + [row(H200, 5, "c0", 1.0, "a", t=0, uuid="u1")])
    df = pd.DataFrame(rows)
    s = C.row_seconds(df)
    per_m = s.groupby(df["m"]).agg(["first", "sum"])
    assert per_m["first"].to_dict() == {1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0, 5: 0.0}
    # problem 1: the median of (1.0, 1.0, 2.0) a row, for each of its 2 rows.
    assert per_m.loc[1, "sum"] == 2.0
    assert C.row_seconds(df, gap_s=60.0)[df["m"] == 3].iloc[0] == pytest.approx(19 / 2)


def test_budget_count():
    assert C.budget_count([1.0, 2.0, 3.0], 0.5) == 0
    assert C.budget_count([1.0, 2.0, 3.0], 3.0) == 2
    assert C.budget_count([1.0, 2.0, 3.0], 100) == 3
    assert C.budget_count([], 10) == 0


def test_guided_round_takes_the_best_rows_of_a_spread():
    # Three problems (pid 0, 1, 2) of 4 rows each: cublas and c1..c3; the model scores c3 best,
    # then c2; every row costs 1 s.
    cands = ["cublas", "c1", "c2", "c3"]
    pool = pd.DataFrame({"pid": np.repeat([0, 1, 2], 4), "candidate": cands * 3})
    scores = np.tile([0.5, 3.0, 2.0, 1.0], 3)
    secs = np.ones(len(pool))
    taken = np.zeros(len(pool), dtype=bool)
    got, spent, facts = C.guided_round(pool, scores, secs, taken, budget_s=4.0, seed=0, top=1, vendor_ids=["cublas"])
    # vendor + the best config (c3) of each problem visited; 4 s pays for two problems.
    assert spent == 4.0 and facts == {"problems": 2, "new_problems": 2}
    assert sorted(pool.loc[got, "candidate"]) == ["c3", "c3", "cublas", "cublas"]
    first = set(pool.loc[got, "pid"])
    taken[got] = True
    # The next round visits the problem not picked yet first, then the others' next-best (c2).
    got2, spent2, facts2 = C.guided_round(pool, scores, secs, taken, budget_s=4.0, seed=1, top=1,
                                          vendor_ids=["cublas"])
    assert facts2 == {"problems": 3, "new_problems": 1} and spent2 == 4.0
    new = pool.loc[got2]
    assert set(new.loc[new["candidate"] == "cublas", "pid"]) == {0, 1, 2} - first
    assert sorted(new.loc[new["pid"].isin(first), "candidate"]) == ["c2", "c2"]
    # A budget that ends inside a problem keeps the rows that fit: the vendor's, then the best.
    got3, spent3, f3 = C.guided_round(pool, scores, secs, np.zeros(len(pool), bool), 3.5, 0, 1, ["cublas"])
    assert spent3 == 3.0 and f3["problems"] == 2
    assert sorted(pool.loc[got3, "candidate"]) == ["c3", "cublas", "cublas"]
    got4, spent4, _ = C.guided_round(pool, scores, secs, np.zeros(len(pool), bool), 0.5, 0, 1, ["cublas"])
    assert len(got4) == 0 and spent4 == 0.0


class _ById:
    """A stand-in model: scores rows by their candidate id's place in sorted order."""

    def score_frame(self, df):
        ids = df["candidate"].astype(str)
        order = {c: i for i, c in enumerate(sorted(set(ids)))}
        return ids.map(order).to_numpy(dtype=np.float64)

    def in_shortlist(self, df):
        return np.ones(len(df), dtype=bool)


def test_space_misses_counts_wanted_configs_without_a_row():
    from gemm_costmodel import registry

    spec = registry.get("gemm")
    problem = spec.problem(m=256, n=1024, k=1024, dtype="bf16")
    ids = sorted(c.id for c in spec.feasible_configs(problem, "sm90", include_vendor=False))
    base = row(H200, 256, ids[0], 1.0, "a", eval_shape=False)
    base["dtype"] = "bf16"
    # The pool holds the best-ranked config (ids[0]) and the fourth (ids[3]), not the 2nd and 3rd.
    pool = pd.DataFrame([{**base, "candidate": c} for c in (ids[0], ids[3], "cublas")]).assign(pid=0)
    assert C.space_misses(_ById(), pool, [0], top=3, op="gemm") == (3, 2)
    assert C.space_misses(_ById(), pool, [0], top=1, op="gemm") == (1, 0)


def test_model_scores_and_heldout():
    df = cards()
    ev = E.eval_rows(df[df["gpu_name"] == H200])
    raw, ranked = E.model_scores(_ById(), ev)
    assert np.array_equal(raw, ranked)
    # Every training row says c1 beats the vendor 2x: the fitted model picks c1 on every held-out
    # problem, at the oracle.
    train = df[df["gpu_name"] == H100]
    model, ps = C.heldout(train, ev, TrainConfig(n_estimators=5, n_jobs=1, shortlist_tol=0.0, min_child_weight=0.0))
    assert len(ps) == 7 and set(ps["pick"]) == {"c1"} and np.allclose(ps["slowdown"], 1.0)


def test_guided_round_passes_again_until_the_budget_is_spent():
    # One problem of 4 rows, top 1: pass 1 takes cublas + c3, pass 2 c2, pass 3 c1; then the pool
    # is empty and the round ends below its budget.
    pool = pd.DataFrame({"pid": [0] * 4, "candidate": ["cublas", "c1", "c2", "c3"]})
    got, spent, facts = C.guided_round(pool, [0.5, 3.0, 2.0, 1.0], np.ones(4), np.zeros(4, bool), 100.0, 0, 1,
                                       ["cublas"])
    assert list(pool.loc[got, "candidate"]) == ["cublas", "c3", "c2", "c1"]
    assert spent == 4.0 and facts == {"problems": 1, "new_problems": 1}
