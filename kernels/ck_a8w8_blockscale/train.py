"""The ck_a8w8_blockscale selector: held-out evaluation, the final classifier and its ONNX export.

    python -m gemm_costmodel.kernels.ck_a8w8_blockscale.train [--models DIR] [--report DIR] [--threads 2]

Labels: AITER's tables keep only the winning kernel per (cu_num, M, N, K) and its time (no loser
times), so the model is a classifier over the kernels that win on the arch (one XGBoost
multi-class model per arch, plain layout only). Hyperparameters are fixed (``PARAMS``), not
searched on the held-out folds.

Evaluation: leave one model family out (the per-model file; the shared table's rows are one family
per (N, K)), per cu_num. "Match": the picked kernelName equals the tuned winner's. Scored: the
model, the seed's hand heuristic (space.heuristic), and AITER's single untuned default kernel.

The cost of a wrong pick (``pick_bounds``): a kernel's time at fixed (cu_num, N, K) does not fall as
M grows (more tiles of the same kernel; assumed, not measured here). So where the picked kernel p
is the tuned winner at a neighbouring M' of the same (cu_num, N, K) in any table, its time there
bounds its time at M: t_p(M) <= t_p(M_hi) for the nearest M_hi > M where p won, and t_p(M) >=
max(t_w(M), t_p(M_lo)) for the nearest M_lo < M. The upper bound over the winner's time, ub =
t_p(M_hi) / t_w(M), is a conservative slowdown; "within 5%" counts exact matches plus mismatches
with ub <= 1.05. Mismatches with no M_hi have no estimate and count as misses there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from . import features as FT
from . import space

PARAMS = {"n_estimators": 100, "max_depth": 6, "learning_rate": 0.1, "tree_method": "hist"}
TOL = 1.05
# The seed's own evaluation set: the three VLMs it tuned (Qwen3-VL-235B, Qwen3-VL-32B, Qwen3.6-27B) on
# gfx942; AITER's per-model files of those models.
SEED_FAMILIES = ("qwen36_27b", "qwen3_vl_235b", "qwen3_vl_32b")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rows(t: pd.DataFrame) -> pd.DataFrame:
    """The op's modelled rows: plain layout."""
    return t[t["layout"] == "plain"].reset_index(drop=True)


def feasible_mask(classes: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(rows, classes) bool: which kernels may be picked for each row's K (space.feasible)."""
    v3 = np.array([space.tile_of(c).pipeline == "v3" for c in classes])
    return ~((np.asarray(k) < 384)[:, None] & v3[None, :])


def fit(X: np.ndarray, labels: np.ndarray, threads: int = 2, seed: int = 0):
    """(XGBClassifier, class names) on the given rows."""
    import xgboost as xgb

    classes = np.array(sorted(set(labels)))
    y = np.searchsorted(classes, labels)
    clf = xgb.XGBClassifier(**PARAMS, n_jobs=threads, random_state=seed, verbosity=0)
    clf.fit(X, y)
    return clf, classes


def pick(proba: np.ndarray, classes: np.ndarray, k: np.ndarray) -> np.ndarray:
    p = np.where(feasible_mask(classes, k), proba, -1.0)
    return classes[p.argmax(axis=1)]


def evaluate(d: pd.DataFrame, threads: int = 2, log=print) -> pd.DataFrame:
    """Leave-one-family-out picks per cu_num: one row per evaluated shape."""
    out = []
    for cu in sorted(d["cu_num"].unique()):
        a = d[d["cu_num"] == cu].reset_index(drop=True)
        X = FT.features(a["m"].values, a["n"].values, a["k"].values, a["cu_num"].values)
        for fam in sorted(a["family"].unique()):
            te = (a["family"] == fam).values
            clf, classes = fit(X[~te], a["candidate"].values[~te], threads)
            e = a[te].copy()
            e["pick_model"] = pick(clf.predict_proba(X[te]), classes, e["k"].values)
            seen = set(zip(a["n"][~te], a["k"][~te]))
            e["nk_seen"] = [(n, k) in seen for n, k in zip(e["n"], e["k"])]
            out.append(e)
            log(f"cu_num {cu} {fam}: {te.sum()} shapes, match {np.mean(e['pick_model'] == e['candidate']):.4f}")
    e = pd.concat(out, ignore_index=True)
    e["pick_heuristic"] = [space.heuristic(m, n, k) for m, n, k in zip(e["m"], e["n"], e["k"])]
    e["pick_default"] = space.DEFAULT_KERNEL
    return e


def pick_bounds(e: pd.DataFrame, table: pd.DataFrame, col: str) -> pd.DataFrame:
    """(lower, upper) bounds of pick/winner time ratios for column ``col``'s picks (module doc).
    Exact matches get (1, 1); a mismatch without a neighbour above gets NaN upper bound."""
    # Per (cu_num, N, K, kernel): the sorted Ms where it won and its times there (every table).
    won = {key: (g["m"].values, g["latency_us"].values)
           for key, g in table.sort_values("m").groupby(["cu_num", "n", "k", "candidate"])}
    lo, hi = np.ones(len(e)), np.ones(len(e))
    for i, (cu, m, n, k, w, p, tw) in enumerate(zip(e["cu_num"], e["m"], e["n"], e["k"], e["candidate"], e[col],
                                                    e["latency_us"])):
        if p == w:
            continue
        ms, ts = won.get((cu, n, k, p), (np.array([]), np.array([])))
        j = np.searchsorted(ms, m, side="right")
        hi[i] = ts[j] / tw if j < len(ms) else np.nan
        lo[i] = max(1.0, ts[j - 1] / tw) if j > 0 else 1.0
    return pd.DataFrame({"lo": lo, "hi": hi}, index=e.index)


METHODS = (("model", "pick_model"), ("heuristic", "pick_heuristic"), ("default", "pick_default"))


def summarize(e: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Per cu_num (and the seed's families): shapes, match rate and within-5% rate per method."""
    bounds = {name: pick_bounds(e, table, col) for name, col in METHODS}
    groups = []
    for cu in sorted(e["cu_num"].unique()):
        sel = e["cu_num"] == cu
        groups.append((f"cu_num {cu} ({space.part_of(space.ARCH_OF_CU[cu], cu)}), every family", sel))
        if cu == 304:
            groups.append(("cu_num 304, the seed's 3 VLM families", sel & e["family"].isin(SEED_FAMILIES)))
        groups.append((f"cu_num {cu}, shapes whose (N, K) no training family has", sel & ~e["nk_seen"]))
    recs = []
    for label, sel in groups:
        r = {"group": label, "shapes": int(sel.sum())}
        for name, col in METHODS:
            match = (e.loc[sel, col] == e.loc[sel, "candidate"])
            ub = bounds[name].loc[sel, "hi"]
            r[f"{name}_match"] = int(match.sum())
            r[f"{name}_match_rate"] = float(match.mean()) if len(match) else float("nan")
            r[f"{name}_within5"] = float(((ub <= TOL) | match).mean()) if len(match) else float("nan")
            mis = ~match
            r[f"{name}_mismatch_bounded"] = int((mis & ub.notna()).sum())
            r[f"{name}_geomean_ub_bounded"] = float(np.exp(np.log(ub[ub.notna()]).mean())) if ub.notna().any() \
                else float("nan")
        recs.append(r)
    return pd.DataFrame(recs)


def per_family(e: pd.DataFrame) -> pd.DataFrame:
    g = e.assign(**{f"{n}_hit": e[c] == e["candidate"] for n, c in METHODS}).groupby(["cu_num", "family"])
    return g.agg(shapes=("m", "size"), nk_seen=("nk_seen", "mean"),
                 **{f"{n}_match_rate": (f"{n}_hit", "mean") for n, _ in METHODS}).reset_index()


def export(d: pd.DataFrame, arch: str, models_dir: str, commit: str, threads: int = 2) -> dict:
    """Fit on every row of the arch and write <op>-<arch>.onnx and .json (class names, features)."""
    from onnxmltools.convert import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    a = d[d["arch"] == arch].reset_index(drop=True)
    X = FT.features(a["m"].values, a["n"].values, a["k"].values, a["cu_num"].values)
    clf, classes = fit(X, a["candidate"].values, threads)
    booster = clf.get_booster()
    booster.feature_names = None  # onnxmltools expects f0..fN
    proto = convert_xgboost(clf, initial_types=[("features", FloatTensorType([None, X.shape[1]]))],
                            target_opset=15)
    base = f"{space.OP}-{arch}"
    onnx_path = os.path.join(models_dir, base + ".onnx")
    data = proto.SerializeToString()
    with open(onnx_path, "wb") as fh:
        fh.write(data)
    man = {"op": space.OP, "arch": arch, "kind": "classifier", "file": base + ".onnx",
           "onnx_bytes": len(data), "onnx_sha256": hashlib.sha256(data).hexdigest(),
           "classes": [str(c) for c in classes], "feature_names": list(FT.FEATURE_NAMES),
           "schema_hash": FT.schema_hash(), "cu_nums": sorted(int(c) for c in a["cu_num"].unique()),
           "params": PARAMS, "rows": int(len(a)), "families": sorted(a["family"].unique()),
           "data": {"repository": "https://github.com/ROCm/aiter", "commit": commit,
                    "tables": sorted(a["source_file"].unique())},
           "created": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}
    with open(os.path.join(models_dir, base + ".json"), "w") as fh:
        json.dump(man, fh, indent=1, sort_keys=True)
    # The exported graph must give the booster's probabilities (the runtime reads them).
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {"features": X[:2000]})
    prob = outs[1] if len(outs) > 1 else outs[0]
    prob = np.array([[r[i] for i in range(len(classes))] for r in prob]) if isinstance(prob, list) else prob
    if not np.allclose(prob, clf.predict_proba(X[:2000]), atol=1e-4):
        raise RuntimeError(f"{onnx_path}: ONNX probabilities differ from the booster's")
    return man


def _pct(x) -> str:
    return f"{100 * x:.2f}%"


def write_report(report_dir: str, commit: str) -> str:
    """report.md from the committed summary.csv and families.csv (so it can be rebuilt alone)."""
    s = pd.read_csv(os.path.join(report_dir, "summary.csv"))
    f = pd.read_csv(os.path.join(report_dir, "families.csv"))
    lines = [f"# {space.OP}: learned CK kernel pick vs the seed's heuristic (AITER tables)", "",
             f"Data: AITER (https://github.com/ROCm/aiter) commit `{commit}`, every plain-layout a8w8 block-scale "
             "GEMM tuned table (datasets/ck_a8w8_blockscale/aiter/). Written by "
             "`python -m gemm_costmodel.kernels.ck_a8w8_blockscale.train`.", "",
             "Held out by model family (leave one family out, per cu_num; the shared table's rows are one "
             f"family per (N, K)). Classifier: XGBoost {PARAMS}, fixed before any held-out run. "
             "**Match**: the picked kernelName equals the tuned winner's. **Within 5%**: a match, or a miss "
             "whose picked kernel won at the nearest larger M of the same (cu_num, N, K) in a time <= 1.05x "
             "the winner's time at this M (a kernel's time is assumed not to fall as M grows; misses without "
             "such a neighbour count as misses). Heuristic: the seed's 7 arms (written for gfx942; on gfx950 "
             "outside its scope). Default: AITER's untuned fallback kernel (16x128 tile, KPerBLOCK 256, v1).", "",
             "| group | shapes | model match | heuristic match | default match | model within 5% | "
             "heuristic within 5% |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in s.itertuples():
        lines.append(f"| {r.group} | {r.shapes} | {_pct(r.model_match_rate)} ({r.model_match}) | "
                     f"{_pct(r.heuristic_match_rate)} ({r.heuristic_match}) | {_pct(r.default_match_rate)} | "
                     f"{_pct(r.model_within5)} | {_pct(r.heuristic_within5)} |")
    lines += ["", "Cost of a miss (upper bound t_pick(M_hi) / t_winner(M), over the misses that have one): "
              + "; ".join(f"{r.group}: model {r.model_geomean_ub_bounded:.3f} over {r.model_mismatch_bounded}, "
                          f"heuristic {r.heuristic_geomean_ub_bounded:.3f} over {r.heuristic_mismatch_bounded}"
                          for r in s.itertuples()),
              "A miss has a bound only where its kernel won at a larger M of the same (cu_num, N, K); AITER's "
              "default kernel almost never wins, so its within-5% column is close to its match rate by "
              "construction, not a measured slowdown. The seed's residual 1.044x is on its own 211-shape "
              "benchmark, which is not public; it is not reproduced here.", "",
              "Reading: on gfx942 (the heuristic's own arch) the model matches more held-out shapes than the "
              "heuristic in every family. On gfx950 the heuristic (written for gfx942) matches more overall: "
              "its families share almost no (N, K) and their winners include CK-tile kernels that win nowhere "
              "else; a pick there is a model's, not a tuned one, and worse than the hand rule on some "
              "families (per family below).", "",
              "Per family (held out):", "",
              "| cu_num | family | shapes | (N, K) seen in training | model | heuristic | default |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for r in f.itertuples():
        lines.append(f"| {r.cu_num} | {r.family} | {r.shapes} | {_pct(r.nk_seen)} | {_pct(r.model_match_rate)} | "
                     f"{_pct(r.heuristic_match_rate)} | {_pct(r.default_match_rate)} |")
    path = os.path.join(report_dir, "report.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    from .importer import DATA_DIR, PROVENANCE, load

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    ap.add_argument("--report", default=os.path.join(ROOT, "models", "report", space.OP))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-eval", action="store_true", help="export only")
    ap.add_argument("--report-only", action="store_true", help="rebuild report.md from the committed CSVs")
    args = ap.parse_args(argv)
    with open(os.path.join(DATA_DIR, PROVENANCE)) as fh:
        commit = json.load(fh)["commit"]
    if args.report_only:
        print(write_report(args.report, commit))
        return 0
    t, _ = load()
    d = rows(t)
    os.makedirs(args.report, exist_ok=True)
    if not args.no_eval:
        e = evaluate(d, args.threads)
        s = summarize(e, d)
        f = per_family(e)
        e[["cu_num", "family", "m", "n", "k", "candidate", "latency_us", "pick_model", "pick_heuristic",
           "nk_seen", "source_file", "source_line"]].to_csv(os.path.join(args.report, "picks.csv.gz"), index=False)
        s.to_csv(os.path.join(args.report, "summary.csv"), index=False)
        f.to_csv(os.path.join(args.report, "families.csv"), index=False)
        print(s.to_string())
        print(f.to_string())
        print(write_report(args.report, commit))
    for arch in space.ARCHS:
        man = export(d, arch, args.models, commit, args.threads)
        print(f"{man['file']}: {len(man['classes'])} classes, {man['rows']} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
