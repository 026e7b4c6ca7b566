"""Issue 58: adaptation curves on the H200 for ops without a device campaign, SIMULATED from the
committed rows (no device time: every point's H200 rows are rows already in datasets/, chosen as a
policy would have measured them and charged the device seconds their sweeps spent on them).

Scheme (docs/decisions/070-simulated-h200-adaptation-curves.md): the H200's evaluation families in
--groups groups of about equal problem counts, each held out at once (learning.curve.family_groups,
evaluate.card_folds(groups=...)): a fold trains on every H100 row none of whose origins is in the
group plus the point's H200 rows outside the group, and scores the H200's evaluation problems of
the group (their oracle exact; no H200 evaluation row ever trains) and, to watch it, the H100's.

Budgets (device-minutes) select rows from the H200's whole training pool (learning.curve.card_pool,
every family: a real campaign measures them all; a fold then drops the rows of its held-out group,
as decision 066 dropped the rows touching evaluation families), each round or sweep charged
--startup-s of precompile:
- random (point "random_rows" in curve.csv): one seeded permutation of the pool's rows, cut where
  its seconds pass the budget;
- randk (point "random" in curve.csv, as decision 066 names it): the MoE campaign's random control:
  a seeded spread of problems, each giving its vendor row and --top random configs of those it has,
  one sweep cut by the budget;
- adapt: rounds at the budget steps (0-2, 2-5, 5-10, ... minutes), each ranked by the fold's model of
  the previous point (learning.curve.guided_round: a seeded spread of problems, unvisited first, each
  giving its vendor row and the model's --top best rows that exist), the model retrained after each.
A point whose budget covers the whole pool is the "all" point and is not trained again.

    python benchmarks/explore/h200_curve_sim.py --op gemm --dtype bf16 --out benchmarks/results/gemm/h200-curve
    python benchmarks/explore/h200_curve_sim.py --op gemm --dtype bf16 --out ... --summarize
    # row seconds from timestamps against the per-shape logs of the H200's fp8_blockscale shards
    # (tar xzf benchmarks/results/fp8_blockscale/h200/fp8bs-train-h200-logs.tar.gz -C LOGDIR):
    python benchmarks/explore/h200_curve_sim.py --check-seconds LOGDIR
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.learning import curve as C
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning import pipeline
from gemm_costmodel.learning import report as R
from gemm_costmodel.learning.model import TrainConfig, shape_ids

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
BUDGETS = (2.0, 5.0, 10.0, 20.0, 40.0)
KEYS = ["arm", "seed", "budget"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load(op, dtype):
    df = pipeline.load_training_frame(root="datasets", op=op, dtypes=[dtype], log=log)
    strs = [c for c in ("dtype", "gpu_name", "variant", "family", "suite", "gpu_uuid", *registry.str_columns())
            if c in df.columns]
    return df.assign(**{c: df[c].astype(str) for c in strs}).reset_index(drop=True)


def summary(ps):
    s = E.summarize(ps)
    return {k: round(float(s[k]), 5) for k in ("shapes", "geomean_slowdown", "match_2pct", "p99_slowdown",
                                                "max_slowdown")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op")
    ap.add_argument("--dtype")
    ap.add_argument("--out")
    ap.add_argument("--check-seconds", metavar="LOGDIR", help="compare row seconds with the shards' shapes.log files")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--arms", nargs="+", default=["none", "all", "adapt", "random", "randk"],
                    help="none, all, adapt (model-guided rounds), random (random rows), randk (random problems, "
                         "--top random configs + vendor each)")
    ap.add_argument("--budgets", nargs="+", type=float, default=list(BUDGETS))
    ap.add_argument("--startup-s", type=float, default=60.0, help="device seconds of each sweep's or round's start")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--miss-problems", type=int, default=100, help="problems per round checked for wanted configs without a row")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--n-estimators", type=int, default=None, help="override the op's shipped tree count (CPU)")
    ap.add_argument("--summarize", action="store_true", help="only rebuild curve.csv and the plot from runs.csv")
    args = ap.parse_args()
    if args.check_seconds:
        return check_seconds(args.check_seconds)
    if not (args.op and args.dtype and args.out):
        ap.error("--op, --dtype and --out are required")
    os.makedirs(args.out, exist_ok=True)
    if args.summarize:
        return summarize(args)
    spec = registry.get(args.op)
    over = {"n_jobs": args.jobs, **({"n_estimators": args.n_estimators} if args.n_estimators else {})}
    cfg = TrainConfig(**{**spec.train_defaults, **over})
    t0 = time.time()
    df = load(args.op, args.dtype)
    sec_all = C.row_seconds(df[df["gpu_name"] == H200])
    pool = C.card_pool(df, H200)
    pool = pool.assign(sec=sec_all.reindex(pool.index).to_numpy()).reset_index(drop=True)
    pool["pid"] = shape_ids(pool)
    total_s = float(pool["sec"].sum())
    by_suite = pool.groupby("suite").agg(rows=("sec", "size"), problems=("pid", "nunique"), seconds=("sec", "sum"))
    log(f"data {len(df)} rows in {time.time() - t0:.0f} s; H200 pool {len(pool)} rows, {pool['pid'].nunique()} "
        f"problems, {total_s / 60:.2f} device-minutes of rows\n{by_suite.round(1).to_string()}")
    groups = C.family_groups(df, H200, args.groups)
    folds = E.card_folds(df, groups=groups, cards=[H200])
    is_h100_eval = (df["gpu_name"] == H100) & df["eval_shape"].astype(bool)
    fold_info = []
    for f, g in zip(folds, groups):
        f.h100 = E.eval_rows(df[is_h100_eval & df["family"].isin(g)])
        f.pool_ok = ~pool["origins"].map(E.families_of).map(lambda s: bool(s & set(g))).to_numpy()
        fold_info.append({"fold": f.name, "families": list(g), "h200_problems": int(f.test["sid"].nunique()),
                          "h100_problems": int(f.h100["sid"].nunique()), "h100_train_rows": len(f.train),
                          "pool_rows_outside": int(f.pool_ok.sum())})
        log(f"fold {fold_info[-1]}")
    meta = {"op": args.op, "dtype": args.dtype, "groups": [list(g) for g in groups], "folds": fold_info,
            "pool_rows": len(pool), "pool_problems": int(pool["pid"].nunique()), "pool_device_s": round(total_s, 1),
            "pool_by_suite": by_suite.round(1).reset_index().to_dict("records"), "startup_s": args.startup_s,
            "top": args.top, "train_config": {k: v for k, v in cfg.__dict__.items()}}
    with open(os.path.join(args.out, "meta.json"), "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1, default=str)
    runs_path = os.path.join(args.out, "runs.csv")
    ps_path = os.path.join(args.out, "per_shape.csv.gz")
    runs = pd.read_csv(runs_path) if os.path.exists(runs_path) else pd.DataFrame()
    shapes = pd.read_csv(ps_path) if os.path.exists(ps_path) else pd.DataFrame()

    def done(arm, seed, budget):
        return bool(len(runs)) and bool(((runs["arm"] == arm) & (runs["seed"] == seed) & (runs["budget"] == budget)).any())

    def point(arm, seed, budget, minutes, picked, extra=None, record=True):
        """One model per fold on its H100 rows + the picked pool rows outside its group (``picked``:
        one mask for every fold, or one per fold); records the held-out figures. Returns the models."""
        nonlocal runs, shapes
        masks = picked if isinstance(picked, list) else [picked] * len(folds)
        frames, models, used = [], [], []
        t = time.time()
        for f, m in zip(folds, masks):
            sel = m & f.pool_ok
            used.append(int(sel.sum()))
            model, ps = C.heldout(pd.concat([f.train, pool[sel].drop(columns=["sec", "pid"])]), f.test, cfg)
            _, ranked = E.model_scores(model, f.h100)
            frames += [ps.assign(fold=f.name), E.per_shape(f.h100, ranked).assign(fold=f.name)]
            models.append(model)
        if not record:
            return models
        ps = pd.concat(frames, ignore_index=True).assign(arm=arm, seed=seed, budget=budget)
        chosen = np.mean([int(m.sum()) for m in masks])
        rows = []
        for gpu, g in ps.groupby("gpu_name"):
            rows.append({"arm": arm, "seed": seed, "budget": budget, "device_minutes": round(minutes, 3),
                         "h200_rows": int(chosen), "h200_rows_trained": int(np.sum(used)),
                         "gpu": gpu, "dtype": args.dtype, **summary(g), **(extra or {})})
        runs = pd.concat([runs, pd.DataFrame(rows)], ignore_index=True)
        shapes = pd.concat([shapes, ps[["arm", "seed", "budget", "fold", "shape", "gpu_name", "pick", "slowdown"]]],
                           ignore_index=True)
        runs.to_csv(runs_path, index=False)
        shapes.to_csv(ps_path, index=False)
        h2 = [r for r in rows if r["gpu"] == H200][0]
        log(f"{arm} seed {seed} @ {budget} min ({minutes:.2f} spent, {int(chosen)} rows chosen, {int(np.sum(used))} "
            f"trained over the folds): H200 {h2['geomean_slowdown']:.4f} / {100 * h2['match_2pct']:.1f}% "
            f"({time.time() - t:.0f} s)")
        return models

    n = len(pool)
    rankers = None
    if "none" in args.arms or "adapt" in args.arms:
        have = done("none", 0, 0.0)
        if not have or "adapt" in args.arms:
            rankers = point("none", 0, 0.0, 0.0, np.zeros(n, dtype=bool), record=not have)
    full_min = (args.startup_s + total_s) / 60
    if "all" in args.arms and not done("all_h200_rows", 0, -1.0):
        point("all_h200_rows", 0, -1.0, full_min, np.ones(n, dtype=bool))
    if "adapt" in args.arms:
        vendor = list(spec.vendor_ids)
        taken = [np.zeros(n, dtype=bool) for _ in folds]
        spent = [0.0 for _ in folds]
        prev = 0.0
        for j, b in enumerate(args.budgets):
            extra = {"problems": 0, "wanted": 0, "missing": 0, "rounds": j + 1}
            for i, f in enumerate(folds):
                scores = rankers[i].score_frame(pool)
                got, s, facts = C.guided_round(pool, scores, pool["sec"].to_numpy(), taken[i],
                                               (b - prev) * 60 - args.startup_s, seed=j, top=args.top,
                                               vendor_ids=vendor)
                new_p = list(dict.fromkeys(pool.loc[got, "pid"]))[: args.miss_problems]
                w, miss = C.space_misses(rankers[i], pool, new_p, args.top, args.op) if new_p else (0, 0)
                taken[i][got] = True
                spent[i] += args.startup_s + s
                extra["problems"] += facts["problems"]
                extra["wanted"] += w
                extra["missing"] += miss
                log(f"adapt round {j} fold {f.name}: {len(got)} rows of {facts['problems']} problems "
                    f"({facts['new_problems']} new), {s:.0f} s; wanted configs without a row {miss} of {w}")
            if all(t.all() for t in taken):
                log(f"adapt @ {b} min: the whole pool taken: the 'all' point")
                break
            # Each fold's rounds were ranked by its own model (trained without its group), so its picks differ.
            rankers = point("adapt", 0, b, float(np.mean(spent)) / 60, [t.copy() for t in taken], extra)
            prev = b
    if "random" in args.arms:
        for seed in args.seeds:
            perm = np.random.default_rng(seed).permutation(n)
            cum = pool["sec"].to_numpy()[perm]
            for b in args.budgets:
                k = C.budget_count(cum, b * 60 - args.startup_s)
                if k >= n:
                    log(f"random seed {seed} @ {b} min: the budget covers the whole pool ({full_min:.2f} min): the 'all' point")
                    break
                if done("random", seed, b):
                    continue
                picked = np.zeros(n, dtype=bool)
                picked[perm[:k]] = True
                point("random", seed, b, (args.startup_s + cum[:k].sum()) / 60, picked,
                      {"problems": int(pool.loc[picked, "pid"].nunique())})
    if "randk" in args.arms:
        # The MoE campaign's random control (decision 066): random training problems, each with its
        # vendor row and --top random configs of those it has, one sweep (one start).
        for seed in args.seeds:
            scores = np.random.default_rng(1000 + seed).random(n)
            for b in args.budgets:
                got, s, facts = C.guided_round(pool, scores, pool["sec"].to_numpy(), np.zeros(n, dtype=bool),
                                               b * 60 - args.startup_s, seed=1000 + seed, top=args.top,
                                               vendor_ids=list(spec.vendor_ids))
                if len(got) >= n:
                    log(f"random per problem seed {seed} @ {b} min: the whole pool: the 'all' point")
                    break
                if done("random_per_problem", seed, b):
                    continue
                picked = np.zeros(n, dtype=bool)
                picked[got] = True
                point("random_per_problem", seed, b, (args.startup_s + s) / 60, picked, {"problems": facts["problems"]})
    summarize(args)


def check_seconds(logdir):
    """learning.curve.row_seconds on each committed H200 fp8_blockscale training shard against the
    seconds its harness logged per shape (``<shard>.shapes.log``): totals and per-problem agreement."""
    import glob
    from gemm_costmodel.data import dataset as D

    tot = [0.0, 0.0]
    for f in sorted(glob.glob("datasets/fp8_blockscale/fp8/fp8bs-train-h200-shard*.parquet")):
        shard = os.path.basename(f).split("-shard")[1][:6]
        logf = os.path.join(logdir, f"fp8bs-train-h200-shard{shard}.shapes.log")
        if not os.path.exists(logf):
            continue
        df = D.load_dataset([f]).reset_index(drop=True)
        key = "fp8:" + df["m"].astype(str) + "x" + df["n"].astype(str) + "x" + df["k"].astype(str)
        ours = C.row_seconds(df).groupby(key).sum()
        logged = pd.Series(dtype=float)
        with open(logf, encoding="utf-8") as fh:
            for line in fh:
                j = json.loads(line)
                logged.loc[j["shape"]] = logged.get(j["shape"], 0.0) + j["seconds"]
        common = ours.index.intersection(logged.index)
        a, b = float(ours[common].sum()), float(logged[common].sum())
        tot[0] += a
        tot[1] += b
        print(f"shard {shard}: {len(common)} problems, timestamps {a:.0f} s, shapes.log {b:.0f} s, ratio {a / b:.3f}, "
              f"per-problem r {np.corrcoef(ours[common], logged[common])[0, 1]:.2f}")
    print(f"all: timestamps {tot[0]:.0f} s, shapes.log {tot[1]:.0f} s, ratio {tot[0] / tot[1]:.3f}")


def summarize(args):
    """curve.csv (one row per point and GPU: random's mean over seeds with its spread) and the plot."""
    runs = pd.read_csv(os.path.join(args.out, "runs.csv"))
    ps = pd.read_csv(os.path.join(args.out, "per_shape.csv.gz"))
    out = []
    # Figures over every fold's problems together: per (arm, seed, budget, GPU) from the per-shape rows.
    for (arm, seed, budget, gpu), g in ps.groupby(["arm", "seed", "budget", "gpu_name"]):
        r = runs[(runs["arm"] == arm) & (runs["seed"] == seed) & (runs["budget"] == budget) & (runs["gpu"] == gpu)]
        x = g["slowdown"].to_numpy()
        out.append({"arm": arm, "seed": seed, "budget": budget, "gpu": gpu,
                    "device_minutes": float(r["device_minutes"].iloc[0]), "h200_rows": int(r["h200_rows"].iloc[0]),
                    "h200_rows_trained": int(r["h200_rows_trained"].iloc[0]),
                    "wanted": r["wanted"].iloc[0] if "wanted" in r else np.nan,
                    "missing": r["missing"].iloc[0] if "missing" in r else np.nan,
                    "shapes": len(x), "geomean_slowdown": E.geomean(x), "match_2pct": float(np.mean(x <= E.MATCH_TOL)),
                    "p99_slowdown": float(np.quantile(x, 0.99)), "max_slowdown": float(x.max())})
    seeds = pd.DataFrame(out)
    seeds.to_csv(os.path.join(args.out, "curve_seeds.csv"), index=False)
    rows = []
    # Point names as the MoE curve's (decision 066): 'random' is random configs of random problems,
    # its random control; random rows are 'random_rows'.
    name = {"none": "none", "all_h200_rows": "all_h200_rows", "adapt": "adapt", "random": "random_rows",
            "random_per_problem": "random"}
    for (arm, budget, gpu), g in seeds.groupby(["arm", "budget", "gpu"], sort=False):
        rows.append({"point": name[arm], "budget_minutes": budget if budget >= 0 else np.nan,
                     "device_minutes": round(g["device_minutes"].mean(), 2), "h200_rows": int(g["h200_rows"].mean()),
                     "gpu": gpu, "dtype": args.dtype, "seeds": len(g), "shapes": int(g["shapes"].iloc[0]),
                     "geomean_slowdown": round(g["geomean_slowdown"].mean(), 4),
                     "geomean_sd": round(g["geomean_slowdown"].std(ddof=0), 4),
                     "geomean_min": round(g["geomean_slowdown"].min(), 4), "geomean_max": round(g["geomean_slowdown"].max(), 4),
                     "match_2pct": round(g["match_2pct"].mean(), 4), "match_sd": round(g["match_2pct"].std(ddof=0), 4),
                     "p99_slowdown": round(g["p99_slowdown"].mean(), 4), "max_slowdown": round(g["max_slowdown"].mean(), 4),
                     "wanted_without_row": (f"{int(g['missing'].iloc[0])}/{int(g['wanted'].iloc[0])}"
                                            if g["wanted"].notna().any() and g["wanted"].iloc[0] > 0 else "")})
    order = {"none": 0, "adapt": 1, "random": 2, "random_rows": 3, "all_h200_rows": 4}
    curve = pd.DataFrame(rows)
    curve["_o"] = curve["point"].map(order)
    curve = curve.sort_values(["_o", "budget_minutes", "gpu"], kind="stable").drop(columns="_o")
    # The plot's x: the budget (nominal device-minutes); 'none' at 0, 'all' at what the pool cost.
    curve["device_minutes"] = np.where(curve["point"].isin(["adapt", "random", "random_rows"]), curve["budget_minutes"],
                                       curve["device_minutes"])
    curve.loc[curve["point"] == "none", "device_minutes"] = 0.0
    curve.to_csv(os.path.join(args.out, "curve.csv"), index=False)
    with open(os.path.join(args.out, "meta.json"), encoding="utf-8") as fh:
        trees = json.load(fh)["train_config"]["n_estimators"]
    R.plot_curve(curve, os.path.join(args.out, "curve.png"),
                 f"{args.op} {args.dtype} on the H200 ({trees} trees), SIMULATED from committed rows: "
                 "held-out figures vs device-minutes")
    print(curve.to_string(index=False))


if __name__ == "__main__":
    main()
