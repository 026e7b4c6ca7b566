"""The XGBoost cost model: one estimator, three formulations of the target.

- ``log_latency``: regression on log2(p50 latency in us).
- ``normalized``: regression on log2(latency / the shape's best measured latency),
  TVM style; only the ordering within a shape matters.
- ``rank``: ``rank:pairwise`` with one query per shape; labels are graded by
  3% steps of slowdown against the shape's best.

Every formulation yields a *score*, lower = predicted faster, which is what
selection uses. Training follows scikit-learn conventions: ``fit`` returns self
and learned state ends in ``_``. xgboost is imported lazily (training only).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from gemm_costmodel import registry
from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware

FORMULATIONS = ("log_latency", "normalized", "rank")
SPLIT_HIGH_ROWS = ("high", "all")
SPLIT_LOW_ROWS = ("low", "all")
# The shape identity: every op's problem fields, from the registry (frames of an op may lack some).
SHAPE_COLS = ["gpu_name", "op"] + registry.shape_columns()
# Grade step of the ranking labels (TrainConfig.rank_step's default): candidates within 3% of
# each other share a grade. RANK_GRADES steps of 3% span slowdowns up to 1.03 ** 30 = 2.43x;
# slower candidates share grade 0. A finer step gets more grades, over the same span.
RANK_STEP = 1.03
RANK_GRADES = 30


def rank_grades(rank_step: float) -> int:
    """The top grade of rank_step-wide bands spanning what RANK_GRADES steps of RANK_STEP span."""
    return int(round(RANK_GRADES * np.log(RANK_STEP) / np.log(rank_step)))


# Upper M edges of the shortlist buckets (the last bucket is open-ended).
SHORTLIST_EDGES = (16, 64, 256, 1024)


def m_bucket_index(m, edges: tuple[int, ...] = SHORTLIST_EDGES) -> np.ndarray:
    """Shortlist bucket of each M: 0 for M <= edges[0], ..., len(edges) above the last edge."""
    return np.searchsorted(np.asarray(edges), np.asarray(m), side="left")


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters. Defaults were picked on leave-family-out validation (see the report)."""

    formulation: str = "rank"
    n_estimators: int = 100
    max_depth: int = 6
    learning_rate: float = 0.2
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 2.0
    reg_lambda: float = 1.0
    max_bin: int = 256
    n_jobs: int = 2
    seed: int = 0
    # Trees grown per boosting round, each on its own row and column subsample, their mean taken
    # (xgboost's num_parallel_tree): an average of differently sampled trees, meant to move the
    # model less from one seed to another; it costs that many times the trees at decision time.
    # On the MoE folds 3 did not narrow the seed spread (docs/decisions/), so every op keeps 1.
    parallel_trees: int = 1
    # Whole boosted models averaged: n_seeds models, trained on the same rows with seeds seed,
    # seed + 1, ..., their margins averaged (merged into one booster by ``merge_boosters``, trees
    # interleaved round by round so the runtime cascade's prefix holds every model's first rounds).
    # The seed alone moved the MoE held-out geomeans by up to 0.4% (docs/decisions/); an average
    # of models fitted with different row and column samples moves less. It costs n_seeds times
    # the training and the trees at decision time.
    n_seeds: int = 1
    stable_only: bool = True
    # Candidates scored at runtime: per M bucket, those within this factor of a training
    # shape's best (plus cuBLAS). Keeps the cold decision cheap; 0 disables the shortlist.
    shortlist_tol: float = 1.05
    # Upper M edges of the shortlist's buckets (the last bucket is open-ended): a bucket's
    # shortlist is the union over its training shapes, so narrower buckets score fewer candidates.
    shortlist_edges: tuple[int, ...] = SHORTLIST_EDGES
    # Weight of an evaluation shape (every candidate measured) against a sampled training
    # shape (48 configs + cuBLAS). Only a complete shape shows where the true best Triton
    # config stands against cuBLAS; in a sampled one cuBLAS only meets a random 48.
    eval_weight: float = 6.0
    # Risk aversion towards the vendor library: its score is lowered by this much, so a Triton
    # config is picked over it only when predicted better by more than the margin (ranking-score
    # units). A pick the model ranks barely above the vendor is a coin flip it often loses, while
    # the vendor is the baseline users compare against (issue 16: never >2% slower than it).
    vendor_margin: float = 0.0
    # Grade step of the ``rank`` labels: a candidate within this factor of the shape's best shares
    # its grade, so pairs inside one step teach the ranker nothing. 3% suited the MMA configs,
    # whose run-to-run noise is 1-2%; finer steps order near-ties (memory-bound GEMV configs
    # within 1-4% of each other) at the risk of learning noise.
    rank_step: float = RANK_STEP
    # Weight factor of a decode shape's query (M <= decode_max_m) on top of eval_weight. A ranker
    # fitted over every M spends its gradient where most queries are; at M <= 4 the fastest
    # candidates are memory-bound configs whose order turns on a few percent, and few queries.
    decode_weight: float = 1.0
    decode_max_m: int = 4
    # Weight factor of the queries measured on one card (``weight_gpu``), on top of the others:
    # adapting to a new card adds a few thousand of its rows to hundreds of thousands of another
    # card's, and unweighted its queries barely move the splits (costmodel adapt; issue 58).
    weight_gpu: str = ""
    gpu_weight: float = 1.0
    # Queries with M <= split_m get trees of their own (0: one model for every M). A ranker fitted
    # over every M shares its trees between decode shapes, where GEMV configs within 1-4% of each
    # other are ordered, and the rest: on the dense family folds the GEMV's rows made the picks at
    # M > 2 0.1-0.5% slower in absolute time (docs/decisions/033-decode-trees-of-their-own-every-m.md, "Decode trees of their own").
    # Two boosters are trained on the two sides and joined tree by tree under a root split on
    # log2_m, so the export, the cascade and the runtime see one booster.
    split_m: int = 0
    # The queries the high side's trees (M > split_m) are fitted on: "high" (its own only) or
    # "all" (every query; the low side still gets trees of its own, fitted on split_low_rows').
    # "all" is for an op whose M > split_m picks learn from the decode queries: fp8_blockscale's
    # split with its own M = 1 queries out of the high side lost 5 points of M > 1 match, while its
    # M = 1 picks gained from trees of their own (docs/decisions/043-m-1-trees-of-their-own.md, "M = 1 trees of their own").
    split_high_rows: str = "high"
    # The queries the low side's trees (M <= split_m) are fitted on: "low" (its own only) or "all"
    # (every query, its own weighted split_low_weight times). Fitted on its decode queries alone, a
    # ranker learns only the order of their best candidates (GEMVs), not of the configs that rarely
    # win there; every query, with the decode ones weighted up, keeps its splits on their near-ties
    # and also orders the rest (fp8_blockscale: docs/decisions/044-a-low-side-fitted-on-every-m.md, "A low side fitted on every M").
    split_low_rows: str = "low"
    split_low_weight: float = 1.0

    def __post_init__(self):
        if self.formulation not in FORMULATIONS:
            raise ValueError(f"formulation must be one of {FORMULATIONS}, got {self.formulation!r}")
        if self.n_estimators < 1 or self.max_depth < 1:
            raise ValueError("n_estimators and max_depth must be >= 1")
        if isinstance(self.parallel_trees, bool) or not isinstance(self.parallel_trees, int) or self.parallel_trees < 1:
            raise ValueError(f"parallel_trees must be an int >= 1, got {self.parallel_trees!r}")
        if isinstance(self.n_seeds, bool) or not isinstance(self.n_seeds, int) or self.n_seeds < 1:
            raise ValueError(f"n_seeds must be an int >= 1, got {self.n_seeds!r}")
        if not self.eval_weight > 0:
            raise ValueError(f"eval_weight must be > 0, got {self.eval_weight!r}")
        if not 0 <= self.vendor_margin < float("inf"):
            raise ValueError(f"vendor_margin must be finite and >= 0, got {self.vendor_margin!r}")
        if not self.gpu_weight > 0 or not np.isfinite(self.gpu_weight):
            raise ValueError(f"gpu_weight must be finite and > 0, got {self.gpu_weight!r}")
        if not self.decode_weight > 0 or not np.isfinite(self.decode_weight):
            raise ValueError(f"decode_weight must be finite and > 0, got {self.decode_weight!r}")
        if isinstance(self.decode_max_m, bool) or not isinstance(self.decode_max_m, int) or self.decode_max_m < 1:
            raise ValueError(f"decode_max_m must be an int >= 1, got {self.decode_max_m!r}")
        if isinstance(self.split_m, bool) or not isinstance(self.split_m, int) or self.split_m < 0:
            raise ValueError(f"split_m must be an int >= 0, got {self.split_m!r}")
        if self.split_high_rows not in SPLIT_HIGH_ROWS:
            raise ValueError(f"split_high_rows must be one of {', '.join(SPLIT_HIGH_ROWS)}, got {self.split_high_rows!r}")
        if self.split_low_rows not in SPLIT_LOW_ROWS:
            raise ValueError(f"split_low_rows must be one of {', '.join(SPLIT_LOW_ROWS)}, got {self.split_low_rows!r}")
        if isinstance(self.split_low_weight, bool) or not isinstance(self.split_low_weight, (int, float)) \
                or not 0 < self.split_low_weight < float("inf"):
            raise ValueError(f"split_low_weight must be finite and > 0, got {self.split_low_weight!r}")
        if self.split_low_weight != 1.0 and self.split_low_rows != "all":
            # Fitted on its own queries alone, a common weight on all of them changes nothing.
            raise ValueError("split_low_weight weighs the low side's queries against the others: it needs "
                             "split_low_rows 'all'")
        if not 1.0 < self.rank_step < 2.0:
            raise ValueError(f"rank_step must be in (1, 2), got {self.rank_step!r}")
        edges = self.shortlist_edges
        if isinstance(edges, list):  # read back from JSON (a training side file, a manifest)
            edges = tuple(edges)
            object.__setattr__(self, "shortlist_edges", edges)
        if not isinstance(edges, tuple) or not edges or any(isinstance(e, bool) or not isinstance(e, int) or e < 1
                                                              for e in edges) \
                or any(a >= b for a, b in zip(edges, edges[1:])):
            raise ValueError(f"shortlist_edges must be a non-empty tuple of increasing ints >= 1, got {edges!r}")
        if self.vendor_margin and self.formulation == "log_latency":
            # That model's score is the latency it reports: a margin would bias the number.
            raise ValueError("vendor_margin needs a relative formulation (rank or normalized), not log_latency")

    def with_(self, **kw) -> "TrainConfig":
        return replace(self, **kw)

    def xgb_params(self) -> dict:
        p = {"eta": self.learning_rate, "max_depth": self.max_depth, "subsample": self.subsample,
             "colsample_bytree": self.colsample_bytree, "min_child_weight": self.min_child_weight,
             "lambda": self.reg_lambda, "max_bin": self.max_bin, "nthread": self.n_jobs, "seed": self.seed,
             "tree_method": "hist"}
        if self.parallel_trees > 1:
            p["num_parallel_tree"] = self.parallel_trees
        if self.formulation == "rank":
            p.update(objective="rank:pairwise", lambdarank_pair_method="topk", lambdarank_num_pair_per_sample=8)
        else:
            p.update(objective="reg:squarederror")
        return p


def training_rows(df, stable_only: bool = True):
    """Rows a model may learn from: timed ok rows (and stable ones only, by default)."""
    keep = (df["status"] == "ok") & df["p50_us"].notna() & (df["p50_us"] > 0)
    if stable_only:
        keep &= df["stable"].astype(bool)
    return df[keep]


def shape_cols(df) -> list[str]:
    """The SHAPE_COLS a frame has: frames of one-stage ops may lack stage and routing."""
    return [c for c in SHAPE_COLS if c in df.columns]


def shape_ids(df) -> np.ndarray:
    """An integer id per distinct shape (SHAPE_COLS), in order of first appearance."""
    import pandas as pd

    return pd.MultiIndex.from_frame(df[shape_cols(df)].astype(str)).factorize()[0]


def slowdowns(df) -> np.ndarray:
    """Each row's p50 over the fastest p50 of its shape."""
    lat = df["p50_us"].to_numpy(dtype=np.float64)
    sid = shape_ids(df)
    best = np.full(sid.max() + 1, np.inf)
    np.minimum.at(best, sid, lat)
    return lat / best[sid]


def targets(df, formulation: str, rank_step: float = RANK_STEP) -> np.ndarray:
    """The regression target or ranking label of each row for a formulation (``rank``: grades of
    rank_step-wide slowdown bands, ``rank_grades(rank_step)`` for the best band, clipped at 0)."""
    if formulation == "log_latency":
        return np.log2(df["p50_us"].to_numpy(dtype=np.float64))
    slow = slowdowns(df)
    if formulation == "normalized":
        return np.log2(slow)
    top = rank_grades(rank_step)
    return np.clip(top - np.floor(np.log(slow) / np.log(rank_step)), 0, top)


def _scale_leaves(tree: dict, factor: float, offset: float = 0.0) -> dict:
    """A copy of an xgboost JSON tree with its leaf values times factor, plus offset."""
    out = dict(tree)
    leaf = [c == -1 for c in tree["left_children"]]
    for key in ("split_conditions", "base_weights"):
        out[key] = [v * factor + offset if is_leaf else v for v, is_leaf in zip(tree[key], leaf)]
    return out


def gate_trees(low: dict, high: dict, feature: int, threshold: float, low_offset: float = 0.0) -> dict:
    """One xgboost JSON tree that is ``low`` where feature < threshold and ``high`` elsewhere: a new
    root split with both trees' nodes renumbered after it; ``low_offset`` is added to low's leaves
    (to carry a difference of base scores)."""
    low = _scale_leaves(low, 1.0, low_offset)
    n_low = len(low["left_children"])
    n_high = len(high["left_children"])

    def renumbered(t, off):
        kids = lambda key: [c + off if c != -1 else -1 for c in t[key]]  # noqa: E731
        return kids("left_children"), kids("right_children"), [0] + [p + off for p in t["parents"][1:]]

    (a_left, a_right, a_par), (b_left, b_right, b_par) = renumbered(low, 1), renumbered(high, 1 + n_low)
    both = lambda key: list(low[key]) + list(high[key])  # noqa: E731
    for key in ("categories", "categories_nodes", "categories_segments", "categories_sizes"):
        if low.get(key) or high.get(key):
            raise ValueError("gate_trees does not join trees with categorical splits")
    return {
        "left_children": [1] + a_left + b_left,
        "right_children": [1 + n_low] + a_right + b_right,
        "parents": [2147483647] + a_par + b_par,
        "split_indices": [int(feature)] + both("split_indices"),
        "split_conditions": [float(threshold)] + both("split_conditions"),
        "split_type": [0] + both("split_type"),
        "default_left": [0] + both("default_left"),
        "base_weights": [0.0] + both("base_weights"),
        "loss_changes": [0.0] + both("loss_changes"),
        "sum_hessian": [float(low["sum_hessian"][0]) + float(high["sum_hessian"][0])] + both("sum_hessian"),
        "categories": [], "categories_nodes": [], "categories_segments": [], "categories_sizes": [],
        "id": int(high.get("id", 0)),
        "tree_param": {**high["tree_param"], "num_nodes": str(1 + n_low + n_high), "num_deleted": "0"},
    }


def _base_score(raw: dict) -> float:
    return float(str(raw["learner"]["learner_model_param"]["base_score"]).strip("[]"))


def _round_trees(boosters, what: str) -> tuple[list[dict], list[dict]]:
    """(raw JSON, gbtree model) of each booster, checked to hold one tree per round, one output and
    the same number of rounds (what merge_boosters and gate_boosters combine round by round)."""
    import json

    raws = [json.loads(b.save_raw("json")) for b in boosters]
    models = [r["learner"]["gradient_booster"]["model"] for r in raws]
    for m in models:
        if int(m["gbtree_model_param"]["num_parallel_tree"]) != 1 or any(t != 0 for t in m["tree_info"]):
            raise ValueError(f"{what} needs one tree per round and one output (parallel_trees 1)")
    if any(len(m["trees"]) != len(models[0]["trees"]) for m in models):
        raise ValueError(f"{what} needs boosters of the same number of rounds")
    return raws, models


def _load_raw(raw: dict):
    import json

    import xgboost as xgb

    out = xgb.Booster()
    out.load_model(bytearray(json.dumps(raw).encode()))
    return out


def gate_boosters(low, high, feature: int, threshold: float):
    """One booster whose margin is ``low``'s where feature < threshold and ``high``'s elsewhere
    (exactly: ``high``'s base score is kept and the difference carried in ``low``'s first tree).
    Round r of the result joins round r of both (gate_trees), so a prefix of its trees is both
    boosters' first rounds, which the runtime's cascade scores every candidate with."""
    raws, models = _round_trees((low, high), "gate_boosters")
    offset = _base_score(raws[0]) - _base_score(raws[1])
    trees = [gate_trees(lo, hi, feature, threshold, offset if r == 0 else 0.0)
             for r, (lo, hi) in enumerate(zip(*(m["trees"] for m in models)))]
    for i, t in enumerate(trees):
        t["id"] = i
    out = raws[1]
    out["learner"]["gradient_booster"]["model"]["trees"] = trees
    return _load_raw(out)


def merge_boosters(boosters):
    """One booster whose margin is the mean of the boosters' margins.

    Every tree's leaves are divided by the number of boosters and the base score is their mean;
    the trees are interleaved round by round (round 0 of each booster, then round 1, ...), so any
    prefix of the merged trees averages the boosters' first rounds (what the runtime's cascade
    scores every candidate with). The boosters must share the objective, features and tree shape
    per round (one tree per round)."""
    raws, models = _round_trees(boosters, "merge_boosters")
    k, rounds = len(raws), len(models[0]["trees"])
    trees = []
    for r in range(rounds):
        for m in models:
            t = _scale_leaves(m["trees"][r], 1.0 / k)
            t["id"] = len(trees)
            trees.append(t)
    base = [_base_score(r) for r in raws]
    out = raws[0]
    model = out["learner"]["gradient_booster"]["model"]
    model["trees"] = trees
    model["tree_info"] = [0] * len(trees)
    model["iteration_indptr"] = list(range(len(trees) + 1))
    model["gbtree_model_param"]["num_trees"] = str(len(trees))
    out["learner"]["learner_model_param"]["base_score"] = f"[{float(np.mean(base)):.9E}]"
    return _load_raw(out)


def _label(progress, text: str) -> None:
    """Name the part being fitted on a progress callback that shows one (pipeline._Progress)."""
    if progress is not None and hasattr(progress, "label"):
        progress.label = text


class CostModel:
    """Gradient-boosted latency model over the feature registry."""

    def __init__(self, config: TrainConfig | None = None):
        self.config = config or TrainConfig()

    def fit(self, df, progress=None) -> "CostModel":
        """Train on a dataset frame (gemm_costmodel.data.dataset schema). Returns self."""
        rows = training_rows(df, self.config.stable_only)
        if len(rows) == 0:
            raise ValueError("no trainable rows (status ok, timed, stable)")
        if self.config.formulation != "log_latency":
            # Relative targets need each query's rows together and at least two candidates.
            rows = rows.assign(_sid=shape_ids(rows)).sort_values("_sid", kind="stable")
            sizes = rows.groupby("_sid").size()
            rows = rows[rows["_sid"].isin(sizes.index[sizes >= 2])]
            if len(rows) == 0:
                raise ValueError(f"no shape with two or more trainable candidates: a {self.config.formulation} "
                                 "model learns the order of candidates within a shape")
        op = self._op(df)
        names = F.feature_names(op)
        low = rows["m"].to_numpy() <= self.config.split_m
        if self.config.split_m and low.any() and not low.all():
            # Decode queries and the rest each get their own trees (TrainConfig.split_m), joined
            # under a root split halfway (in log2) between split_m and split_m + 1.
            feature = names.index("log2_m")
            threshold = float(np.log2(self.config.split_m + 0.5))
            high = rows if self.config.split_high_rows == "all" else rows[~low]
            _label(progress, f"M <= {self.config.split_m} trees: ")
            if self.config.split_low_rows == "all":
                own = np.where(low, self.config.split_low_weight, 1.0)
                lows = self._boosters(rows, progress, own)
            else:
                lows = self._boosters(rows[low], progress)
            _label(progress, f"M > {self.config.split_m} trees: ")
            highs = self._boosters(high, progress)
            boosters = [gate_boosters(lo, hi, feature, threshold) for lo, hi in zip(lows, highs)]
        else:
            boosters = self._boosters(rows, progress)
        self.booster_ = boosters[0] if len(boosters) == 1 else merge_boosters(boosters)
        self.shortlist_ = self._shortlist(training_rows(df, stable_only=False))
        self.op_ = op
        self.feature_names_ = names
        self.schema_hash_ = F.schema_hash(self.op_)
        self.n_rows_ = int(len(rows))
        self.n_shapes_ = int(len(np.unique(shape_ids(rows))))
        return self

    @staticmethod
    def _op(df) -> str:
        """The op of the rows (one op per model; rows without an op column are dense GEMM rows)."""
        ops = sorted(df["op"].astype(str).unique()) if "op" in df.columns else [registry.LEGACY_OP]
        if len(ops) != 1:
            raise ValueError(f"one op per model, got rows of {', '.join(ops)}")
        return ops[0]

    def _boosters(self, rows, progress=None, factor=None) -> list:
        """The n_seeds boosters fitted on ``rows`` (sorted by query, as fit leaves them); ``factor``:
        a weight factor per row (the same on a query's rows), on top of the config's weights."""
        import xgboost as xgb

        X = F.from_frame(rows, hardware.spec_for)
        y = targets(rows, self.config.formulation, self.config.rank_step)
        dm = xgb.DMatrix(X, label=y)
        weight = np.where(rows["eval_shape"].astype(bool).to_numpy(), self.config.eval_weight, 1.0)
        weight = weight * np.where(rows["m"].to_numpy() <= self.config.decode_max_m, self.config.decode_weight, 1.0)
        if self.config.weight_gpu and self.config.gpu_weight != 1.0:
            on_card = rows["gpu_name"].astype(str).to_numpy() == self.config.weight_gpu
            weight = weight * np.where(on_card, self.config.gpu_weight, 1.0)
        if factor is not None:
            weight = weight * np.asarray(factor, dtype=float)
        if self.config.formulation == "rank":
            dm.set_group(rows.groupby("_sid", sort=True).size().to_numpy())
            # Ranking weights are per query: a shape's rows share its eval_shape flag.
            weight = rows.assign(_w=weight).groupby("_sid", sort=True)["_w"].max().to_numpy()
        dm.set_weight(weight)
        callbacks = [progress] if progress is not None else None
        return [xgb.train({**self.config.xgb_params(), "seed": self.config.seed + i}, dm,
                          num_boost_round=self.config.n_estimators, callbacks=callbacks)
                for i in range(self.config.n_seeds)]

    def _shortlist(self, rows) -> dict[int, list[str]] | None:
        if not self.config.shortlist_tol:
            return None
        good = rows[slowdowns(rows) <= self.config.shortlist_tol]
        edges = self.config.shortlist_edges
        b = m_bucket_index(good["m"].to_numpy(), edges)
        out = {}
        for i in range(len(edges) + 1):
            ids = set(good["candidate"].astype(str)[b == i]) | {"cublas"}
            out[i] = sorted(ids)
        return out

    def in_shortlist(self, df) -> np.ndarray:
        """Whether each row's candidate is on its M bucket's shortlist (all True without one)."""
        if not getattr(self, "shortlist_", None):
            return np.ones(len(df), dtype=bool)
        b = m_bucket_index(df["m"].to_numpy(), self.config.shortlist_edges)
        cand = df["candidate"].astype(str).to_numpy()
        sets = {int(i): set(v) for i, v in self.shortlist_.items()}
        return np.array([c in sets[int(i)] for c, i in zip(cand, b)], dtype=bool)

    def score(self, X: np.ndarray) -> np.ndarray:
        """Lower = predicted faster (the vendor's lowered by ``vendor_margin``). For log_latency, the
        predicted log2 latency in us."""
        import xgboost as xgb

        X = np.asarray(X, dtype=np.float32)
        margin = self.booster_.predict(xgb.DMatrix(X), output_margin=True)
        s = -margin if self.config.formulation == "rank" else margin
        if self.config.vendor_margin:
            # The runtime applies the same offset (export writes it to the manifest).
            s = s - self.config.vendor_margin * X[:, self.feature_names_.index("is_vendor")]
        return s

    def score_frame(self, df) -> np.ndarray:
        """Scores of the rows of a dataset frame."""
        return self.score(F.from_frame(df, hardware.spec_for))

    def params(self) -> dict:
        """The hyperparameters, for manifests (tuples as lists, as JSON reads them back)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.config).items()}
