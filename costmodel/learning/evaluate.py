"""Held-out evaluation of the cost model against every simpler way of choosing.

Only evaluation shapes count (every feasible candidate measured: the oracle is
exact). Each method turns the rows of an evaluation shape into a *score* per
candidate (lower = chosen first); the metrics read the measured latency of the
candidates in score order. Splits are by model family or by (N, K), never by
row: a test shape's family (or (N, K)) contributes no training row.
"""
from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from tqdm import tqdm

from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel import registry
# The report's M buckets sit below learning: the ops' own report sections group by them too.
from gemm_costmodel.util import m_bucket  # noqa: F401
from gemm_costmodel.learning.model import SHAPE_COLS, CostModel, TrainConfig, shape_cols, training_rows  # noqa: F401
from gemm_costmodel.util import geomean  # noqa: F401 - geomean is part of this API

TOPK = (1, 2, 4, 8)
MATCH_TOL = 1.02
METHODS = ("model", "oracle", "cublas", "default", "vllm_default", "vllm_tuned", "hand_heuristic", "best_static",
           "heuristic", "nearest_neighbor")


def eval_rows(df: pd.DataFrame) -> pd.DataFrame:
    """ok rows of evaluation shapes, with a shape id column ``sid``."""
    ev = df[df["eval_shape"].astype(bool) & (df["status"] == "ok") & df["p50_us"].notna()].copy()
    ev["sid"] = pd.MultiIndex.from_frame(ev[shape_cols(ev)].astype(str)).factorize()[0]
    return ev.reset_index(drop=True)


def families_of(origins: str) -> set[str]:
    """Model families named in an origins string ('family/model/layer/tpN;...')."""
    return {o.split("/")[0] for o in str(origins).split(";") if o}


# -- metrics -------------------------------------------------------------------

def op_of(df: pd.DataFrame) -> registry.OpSpec:
    """The registered op of a frame's rows (one op per evaluation; dense GEMM if no op column)."""
    ops = sorted(df["op"].astype(str).unique()) if "op" in df.columns and len(df) else [registry.LEGACY_OP]
    if len(ops) != 1:
        raise ValueError(f"one op per evaluation, got rows of {', '.join(ops)}")
    return registry.get(ops[0])


def vendor_id(df: pd.DataFrame) -> str:
    """The op's vendor candidate (the 'cublas' method and columns of the metrics)."""
    return op_of(df).vendor_ids[0]


def per_shape(ev: pd.DataFrame, score: np.ndarray) -> pd.DataFrame:
    """One row per evaluation shape: the pick, its slowdown vs the oracle, and top-k facts.

    Ties in score are broken by candidate id, so results are deterministic.
    """
    t = ev[["sid", "candidate", "p50_us"]].assign(score=np.asarray(score, dtype=np.float64))
    t = t.sort_values(["sid", "score", "candidate"], kind="stable")
    t["pos"] = t.groupby("sid").cumcount()
    g = t.groupby("sid")
    oracle = g["p50_us"].min()
    first = t[t["pos"] == 0].set_index("sid")
    out = pd.DataFrame({"pick": first["candidate"], "pick_us": first["p50_us"], "oracle_us": oracle})
    out["slowdown"] = out["pick_us"] / out["oracle_us"]
    is_best = t["p50_us"] == t["sid"].map(oracle)
    out["oracle_pos"] = t[is_best].groupby("sid")["pos"].min()
    for k in TOPK:
        out[f"top{k}_us"] = t[t["pos"] < k].groupby("sid")["p50_us"].min()
    vendor = vendor_id(ev)
    cub = ev[ev["candidate"] == vendor].set_index("sid")["p50_us"]
    out["cublas_us"] = cub.reindex(out.index)
    # The Triton-only view: the method's best-ranked Triton config against the best Triton config.
    tri = t[t["candidate"] != vendor]
    out["triton_pick_us"] = tri.groupby("sid")["p50_us"].first().reindex(out.index)
    out["triton_oracle_us"] = tri.groupby("sid")["p50_us"].min().reindex(out.index)
    # An op's own problem fields (beyond m, n, k, dtype) join the results and its shape ids.
    spec = op_of(ev)
    extra = [c for c in spec.problem_fields if c not in registry.SHARED_PROBLEM and c in ev.columns]
    meta = ev.drop_duplicates("sid").set_index("sid")[["gpu_name", "dtype", "m", "n", "k", "family", "origins",
                                                       *extra]]
    out = out.join(meta)
    out["shape"] = (out["gpu_name"].astype(str) + ":" + out["dtype"].astype(str) + ":" + out["m"].astype(str) + "x"
                    + out["n"].astype(str) + "x" + out["k"].astype(str))
    if extra:
        vals = out[extra].astype(object).to_dict("records")
        out["shape"] += pd.Series([spec.shape_id_suffix({c: str(v[c]) for c in extra}) for v in vals], index=out.index)
    return out


def summarize(ps: pd.DataFrame) -> dict:
    """The headline metrics of a per_shape table."""
    s = ps["slowdown"].to_numpy()
    out = {
        "shapes": int(len(ps)),
        "top1_match": float(np.mean(ps["oracle_pos"] == 0)) if len(ps) else float("nan"),
        "match_2pct": float(np.mean(s <= MATCH_TOL)) if len(ps) else float("nan"),
        "geomean_slowdown": geomean(s),
        "p95_slowdown": float(np.quantile(s, 0.95)) if len(ps) else float("nan"),
        "p99_slowdown": float(np.quantile(s, 0.99)) if len(ps) else float("nan"),
        "max_slowdown": float(s.max()) if len(ps) else float("nan"),
        "speedup_vs_cublas": geomean(ps["cublas_us"] / ps["pick_us"]),
    }
    for k in TOPK:
        out[f"recall_top{k}"] = float(np.mean(ps["oracle_pos"] < k)) if len(ps) else float("nan")
        out[f"top{k}_bench_slowdown"] = geomean(ps[f"top{k}_us"] / ps["oracle_us"])
    return out


def loss_breakdown(ps: pd.DataFrame) -> dict:
    """Where a method's log-slowdown comes from, on a per_shape table of one method.

    Shares of the summed log-slowdown: cuBLAS picked where a Triton config is faster,
    a Triton config picked where cuBLAS is faster, a Triton config picked where another
    one is faster; plus how often the pick and the oracle are cuBLAS, and the
    Triton-only slowdown (best-ranked Triton config vs the best Triton config)."""
    lg = np.log(ps["slowdown"].to_numpy(dtype=np.float64))
    picked_cub = (ps["pick"] == "cublas").to_numpy()
    oracle_cub = (ps["cublas_us"] <= ps["oracle_us"]).to_numpy()
    total = lg.sum()

    def share(mask):
        return float(lg[mask].sum() / total) if total > 0 else 0.0

    return {
        "shapes": int(len(ps)),
        "picks_cublas": float(picked_cub.mean()) if len(ps) else float("nan"),
        "oracle_cublas": float(oracle_cub.mean()) if len(ps) else float("nan"),
        "loss_cublas_over_triton": share(picked_cub & ~oracle_cub),
        "loss_triton_over_cublas": share(~picked_cub & oracle_cub),
        "loss_triton_over_triton": share(~picked_cub & ~oracle_cub),
        "triton_pick_slowdown": geomean(ps["triton_pick_us"] / ps["triton_oracle_us"]),
    }


# -- baselines -----------------------------------------------------------------

def _fallback_rank(ev: pd.DataFrame) -> np.ndarray:
    """Heuristic pick first (0), everything else after (1): the rank when a baseline has no answer."""
    out = np.ones(len(ev))
    spec = op_of(ev)
    choose = spec.fallback_rule()
    for sid, g in ev.groupby("sid"):
        r = g.iloc[0]
        sm = hardware.spec_for(str(r["gpu_name"])).sm_count
        cands = g[["variant", *F.PARAMS]].astype({"variant": str}).to_dict("records")
        # The op's own fields its rule takes (MoE: e, top_k), as the runtime passes them.
        kw = {f: str(r[f]) if registry.column_kind(f) == "str" else int(r[f]) for f in spec.fallback_fields()}
        out[g.index[choose(int(r["m"]), int(r["n"]), int(r["k"]), sm, cands, **kw)]] = 0
    return out


def _pick_score(ev: pd.DataFrame, wanted: pd.Series) -> np.ndarray:
    """Score 0 for the wanted candidate of each shape (wanted: sid -> candidate); missing -> heuristic."""
    hit = ev["candidate"].to_numpy() == ev["sid"].map(wanted).to_numpy()
    has = pd.Series(hit).groupby(ev["sid"].to_numpy()).transform("any").to_numpy()
    return np.where(has, np.where(hit, 0.0, 2.0), 1.0 + _fallback_rank(ev))


def static_ranking(train_ev: pd.DataFrame) -> pd.Series:
    """Candidate -> geomean slowdown over fully measured training shapes (its rank for best-static)."""
    best = train_ev.groupby("sid")["p50_us"].transform("min")
    slow = (train_ev["p50_us"] / best).rename("slow")
    piv = train_ev.assign(slow=slow).pivot_table(index="sid", columns="candidate", values="slow")
    n = len(piv)
    # A config infeasible on some shapes is penalised there as 10x, so 'best static' is one that runs everywhere.
    return np.exp(np.log(piv.fillna(10.0)).sum() / max(n, 1)).sort_values()


def nn_table(train: pd.DataFrame) -> pd.DataFrame:
    """Tuned table from training shapes: the fastest measured candidate per shape."""
    ok = training_rows(train, stable_only=False)
    idx = ok.groupby(shape_cols(ok), observed=True)["p50_us"].idxmin()
    return ok.loc[idx, ["gpu_name", "dtype", "m", "n", "k", "candidate"]].reset_index(drop=True)


def nn_pick(table: pd.DataFrame, gpu: str, dtype: str, m: int, n: int, k: int) -> str | None:
    """vLLM/AITER-style lookup: the nearest tuned (N, K) (log distance), then its nearest M."""
    t = table[(table["gpu_name"].astype(str) == gpu) & (table["dtype"].astype(str) == dtype)]
    if t.empty:
        t = table[table["dtype"].astype(str) == dtype]
    if t.empty:
        return None
    nk = t[["n", "k"]].drop_duplicates().to_numpy(dtype=np.float64)
    d = np.abs(np.log2(nk[:, 0] / n)) + np.abs(np.log2(nk[:, 1] / k))
    bn, bk = nk[int(np.argmin(d))]
    rows = t[(t["n"] == bn) & (t["k"] == bk)]
    dm = np.abs(np.log2(rows["m"].to_numpy(dtype=np.float64) / m))
    return str(rows["candidate"].iloc[int(np.argmin(dm))])


def baseline_scores(ev: pd.DataFrame, train: pd.DataFrame) -> dict[str, np.ndarray]:
    """Scores of every baseline on the evaluation rows, each fitted on the training frame only."""
    out = {"oracle": ev["p50_us"].to_numpy(dtype=np.float64)}
    spec = op_of(ev)
    vendor = spec.vendor_ids[0]
    out["cublas"] = np.where(ev["candidate"] == vendor, 0.0, 1.0)
    if not (ev["candidate"] == vendor).groupby(ev["sid"]).any().all():
        out["cublas"] = _pick_score(ev, pd.Series(vendor, index=ev["sid"].unique()))
    out["default"] = _pick_score(ev, pd.Series(spec.default_config, index=ev["sid"].unique()))
    train_ev = eval_rows(train)
    if len(train_ev):
        rank = static_ranking(train_ev)
        pos = pd.Series(np.arange(len(rank), dtype=np.float64), index=rank.index)
        out["best_static"] = ev["candidate"].map(pos).fillna(len(rank) + 1).to_numpy()
    out["heuristic"] = _fallback_rank(ev)
    table = nn_table(train)
    first = ev.drop_duplicates("sid").set_index("sid")
    wanted = pd.Series({sid: nn_pick(table, str(r["gpu_name"]), str(r["dtype"]), int(r["m"]), int(r["n"]),
                                     int(r["k"])) for sid, r in first.iterrows()})
    out["nearest_neighbor"] = _pick_score(ev, wanted)
    # The op's own baselines (registry ``baselines``): their picks, fitted on the same training rows.
    for method, wanted in spec.baseline_picks(ev, train_ev).items():
        out[method] = _pick_score(ev, wanted)
    return out


# -- cross-validation -------------------------------------------------------------

@dataclass
class Fold:
    name: str
    train: pd.DataFrame
    test: pd.DataFrame  # evaluation rows (eval_rows) of the held-out group


def family_folds(df: pd.DataFrame) -> list[Fold]:
    """Leave-one-family-out: test = evaluation shapes whose first family is F;
    train = every shape none of whose origins is in F."""
    fams = df["origins"].map(families_of)
    ev = df[df["eval_shape"].astype(bool)]
    out = []
    for fam in sorted(ev["family"].astype(str).unique()):
        test = eval_rows(ev[ev["family"].astype(str) == fam])
        train = df[~fams.map(lambda s: fam in s)]
        if len(test) and len(train):
            out.append(Fold(fam, train, test))
    return out


# The suite (sweep name) of rows measured because a model chose them: `costmodel adapt` names its
# rounds' shards '<op>-adapt<round>-<suite>-<dtype>-<gpu>' (adapt.round_name), and the first H200
# round was measured by a campaign as 'moe-adapt0-h200'. The leave-one-card-out variant that
# keeps a card's adaptation rows tells them from its other rows (sampled sweeps, oracles) by this.
ADAPT_SUITE = re.compile(r"(?:^|-)adapt\d+(?:-|$)")

CARD_SCHEMES = ("card", "card_adapt")
SCHEMES = ("family", "nk", *CARD_SCHEMES)


def adaptation_rows(df: pd.DataFrame) -> pd.Series:
    """Boolean mask of the rows measured in adaptation rounds (their suite matches ADAPT_SUITE);
    all False for data without a suite column."""
    if "suite" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["suite"].astype(str).str.contains(ADAPT_SUITE)


def card_folds(df: pd.DataFrame, adapt: bool = False, groups=None, cards=None) -> list[Fold]:
    """Leave-one-card-out, still held out by family: for each card X with evaluation shapes and each
    family F of them, test = X's evaluation shapes of F; train = the other cards' rows none of whose
    origins is in F (their evaluation shapes of other families too, as in family_folds), and none
    of X's rows: how the model does on a card it never saw. With ``adapt``, X's adaptation rows
    outside F train as well (adaptation_rows): what a few model-chosen measurements on X buy; a
    card without adaptation rows then has no fold (its figures would be the plain scheme's).
    Fold names are 'GPU/family'.

    ``groups`` (optional): collections of families, each held out at once in place of single
    families (fold names 'GPU/fam1+fam2'; test = X's evaluation shapes whose family is in the group,
    train = the rows none of whose origins is in it); ``cards`` (optional): only these held-out
    cards. Fewer, larger folds: the adaptation curves (learning.curve) train one model per fold and
    point."""
    fams = df["origins"].map(families_of)
    gpu = df["gpu_name"].astype(str)
    is_eval = df["eval_shape"].astype(bool)
    adapted = adaptation_rows(df)
    out = []
    for card in sorted(gpu[is_eval].unique()):
        if cards is not None and card not in set(map(str, cards)):
            continue
        on_card = gpu == card
        keep_card = on_card & adapted if adapt else pd.Series(False, index=df.index)
        if adapt and not keep_card.any():
            continue
        ev = df[is_eval & on_card]
        held = ([(f,) for f in sorted(ev["family"].astype(str).unique())] if groups is None
                else [tuple(sorted(map(str, g))) for g in groups])
        for group in held:
            gset = set(group)
            test = eval_rows(ev[ev["family"].astype(str).isin(gset)])
            train = df[(~on_card | keep_card) & ~fams.map(lambda s: bool(s & gset))]
            if len(test) and len(train):
                out.append(Fold(f"{card}/{'+'.join(group)}", train, test))
    return out


# A problem measured on a sample of its candidates (a `sample:K` or `pick:CSV` sweep) can be held out
# as well, scored against the best candidate measured on it: an op whose evaluation problems are not
# measured in full yet (vLLM's kernels, issue 59) still gets held-out figures. They are NOT the
# full-space oracle's: the best of ~10 measured candidates is an easier target than the best of
# ~1,250, and a baseline whose config was not measured has no figure there (see ``sampled_mask``).
# A problem needs this many ok timed candidates to be held out so.
SAMPLED_MIN_CANDIDATES = 4


def sampled_mask(df: pd.DataFrame, min_candidates: int = SAMPLED_MIN_CANDIDATES) -> pd.Series:
    """eval_shape, or True on every row of a problem with at least ``min_candidates`` ok timed rows:
    the problems ``folds_of(..., sampled=True)`` holds out."""
    ok = training_rows(df, stable_only=False)
    n = ok.groupby(shape_cols(ok), observed=True, sort=False).size().rename("_n")
    counts = df[shape_cols(df)].join(n, on=shape_cols(df))["_n"].fillna(0).to_numpy()
    return df["eval_shape"].astype(bool) | pd.Series(counts >= min_candidates, index=df.index)


def folds_of(df: pd.DataFrame, scheme: str, sampled: bool = False) -> list[Fold]:
    """The folds of a held-out scheme (SCHEMES). ``sampled``: hold out the problems measured on a
    sample of their candidates too (``sampled_mask``); their training side keeps the rows' own
    eval_shape flags (the weight of a fully measured problem), only the held-out side changes."""
    if sampled:
        marked = df.assign(eval_shape=sampled_mask(df))
        return [Fold(f.name, df.loc[f.train.index], f.test) for f in folds_of(marked, scheme)]
    if scheme == "family":
        return family_folds(df)
    if scheme == "nk":
        return nk_folds(df)
    if scheme in CARD_SCHEMES:
        return card_folds(df, adapt=scheme == "card_adapt")
    raise ValueError(f"unknown scheme {scheme!r} (one of {', '.join(SCHEMES)})")


def nk_folds(df: pd.DataFrame, n_folds: int = 5, seed: int = 0) -> list[Fold]:
    """Leave-(N, K)-out: the op's split key (the registry's ``split_key``; (N, K) for dense
    GEMM) split into n_folds groups by a seeded shuffle."""
    cols = op_of(df).split_key
    keys = list(zip(*(df[c].astype(int) for c in cols)))
    pairs = sorted(set(keys))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pairs))
    group = {pairs[i]: j % n_folds for j, i in enumerate(order)}
    g = np.array([group[key] for key in keys])
    out = []
    for f in range(n_folds):
        test = eval_rows(df[(g == f) & df["eval_shape"].astype(bool).to_numpy()])
        if len(test):
            out.append(Fold(f"nk{f}", df[g != f], test))
    return out


def shortlisted(ev: pd.DataFrame, score: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Scores with off-shortlist candidates ranked last; a shape with no shortlisted
    candidate keeps all of them (the runtime does the same)."""
    any_keep = pd.Series(keep).groupby(ev["sid"].to_numpy()).transform("any").to_numpy()
    # float64: in float32, score + 1e6 would round off-list scores to 1/16 and reorder them.
    score = np.asarray(score, dtype=np.float64)
    return np.where(keep | ~any_keep, score, score + 1e6)


def model_scores(model, test: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(raw, ranked) scores of a fitted model on evaluation rows: the raw prediction, and the one
    the held-out figures rank by (off-shortlist candidates last, as the runtime does)."""
    raw = model.score_frame(test)
    return raw, shortlisted(test, raw, model.in_shortlist(test))


def train_on_gpus(folds: list[Fold], gpus) -> list[Fold]:
    """The folds with their training side cut to the rows of the GPUs named in ``gpus`` (their
    held-out side keeps every GPU): how a model learned on one card ranks another card's shapes.
    Raises ValueError naming a GPU the data lacks, or a fold left with no training row."""
    if not gpus:
        return folds
    gpus = [str(g) for g in gpus]
    have = set()
    for f in folds:
        have |= set(f.train["gpu_name"].astype(str).unique()) | set(f.test["gpu_name"].astype(str).unique())
    missing = [g for g in gpus if g not in have]
    if missing:
        raise ValueError(f"train_gpus: no rows of GPU {missing[0]!r} in the data (GPUs in it: {', '.join(sorted(have))})")
    out = []
    for f in folds:
        train = f.train[f.train["gpu_name"].astype(str).isin(gpus)]
        if train.empty:
            raise ValueError(f"train_gpus: fold {f.name} has no training row of {', '.join(gpus)}")
        out.append(Fold(f.name, train, f.test))
    return out


def cross_validate(df: pd.DataFrame, config: TrainConfig, scheme: str = "family", baselines: bool = True,
                   log: Callable[[str], None] | None = None, train_gpus=None,
                   sampled: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held-out results over the folds of ``scheme`` (one of SCHEMES: 'family', 'nk', 'card',
    'card_adapt').

    ``sampled``: problems measured on a sample of their candidates are held out too, each scored
    against the best candidate measured on it (``folds_of``); the 'oracle' is then that best.

    ``train_gpus``: if given, each fold's model (and the baselines fitted on training shapes) learns
    from those GPUs' rows only, while every GPU's held-out shapes are scored (``train_on_gpus``).

    Returns (per-shape results, long: one row per (method, shape), with a ``fold``
    column; the model's held-out row-level scores: candidate, p50_us, score)."""
    folds = folds_of(df, scheme, sampled=sampled)
    if not folds:
        if eval_rows(df.assign(eval_shape=sampled_mask(df)) if sampled else df).empty:
            raise ValueError("no evaluation shapes to hold out (none has an ok row)")
        if scheme == "card_adapt":
            raise ValueError("no card with evaluation shapes has adaptation rows (suites named like "
                             "'<op>-adapt<round>-...', as `costmodel adapt` writes them)")
        if scheme == "card":
            raise ValueError("no evaluation shapes to hold out with training data left: leaving a card "
                             "out needs rows of another card outside the held-out family")
        group = "a model family" if scheme == "family" else "an (N, K)"
        raise ValueError("no evaluation shapes to hold out with training data left: every shape shares "
                         f"{group} with them")
    folds = train_on_gpus(folds, train_gpus)
    frames, rows = [], []
    t0 = time.perf_counter()
    # A bar with an ETA over the folds (stderr, terminals only: tqdm disables itself elsewhere);
    # the per-fold lines carry the elapsed time for logs.
    for i, fold in enumerate(tqdm(folds, desc=f"{scheme} folds", unit="fold", file=sys.stderr,
                                  disable=None if log else True, leave=False)):
        if log:
            log(f"[{scheme} {i + 1}/{len(folds)}, {time.perf_counter() - t0:.0f} s] hold out {fold.name}: "
                f"{fold.test['sid'].nunique()} shapes, train on {len(fold.train)} rows")
        model = CostModel(config).fit(fold.train)
        raw, ranked = model_scores(model, fold.test)
        scores = {"model": ranked}
        # The raw prediction (the report plots 2**score): the shortlist offset is for ranking only.
        rows.append(fold.test[["gpu_name", "dtype", "m", "n", "k", "candidate", "p50_us"]].assign(
            score=raw, fold=fold.name))
        if baselines:
            scores.update(baseline_scores(fold.test, fold.train))
        for method, sc in scores.items():
            frames.append(per_shape(fold.test, sc).assign(method=method, fold=fold.name))
    return pd.concat(frames).reset_index(names="sid"), pd.concat(rows, ignore_index=True)


def metrics_table(results: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """summarize() per method (and per the extra columns in ``by``)."""
    keys = ["method", *(by or [])]
    rows = []
    for key, g in results.groupby(keys, observed=True, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key)), **summarize(g)})
    out = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(METHODS)}
    return out.sort_values(keys, key=lambda s: s.map(order) if s.name == "method" else s).reset_index(drop=True)


