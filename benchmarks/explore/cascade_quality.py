"""Cheaper cascades against the whole model and the oracle (issue 58: the cold decision's
onnxruntime time for fp8_blockscale, MoE and grouped_gemm on the H200 host).

For every evaluation problem of an op in the committed data (rows with ``eval_shape`` true and
status ok, per GPU card and dtype), the shipped model's feature rows are taken from a real
``Dispatcher.select`` (its ``_OnnxModel.best`` is wrapped to record X and the tiebreak), then
scored offline exactly as ``_OnnxModel.best`` does (prefix on every row plus the vendor offset, the
suffix on the prefix's ``keep`` best and every row tied with the keep-th, ``lexsort`` on the
tiebreak) for each (prefix trees, keep) of ``--splits``, with prefix/suffix sessions cut in memory
from the shipped ONNX file (``export.slice_trees``, as ``write_cascade`` cuts them). Per card and
dtype it prints, for the whole model, the shipped cascade and each split:

- picks that differ from the whole model's and from the shipped cascade's;
- the geomean, p99 and worst slowdown of the pick against the oracle (the best measured p50 of
  the problem) and the number of picks without a measured row (left out of the geomean);
- the median onnxruntime time of the split's scoring per problem on this CPU (prefix on every
  row plus suffix on the kept rows; the whole model's is its one call).

The emulation of the shipped cascade is checked against ``select``'s own pick on every problem.

    python benchmarks/explore/cascade_quality.py --op moe
    python benchmarks/explore/cascade_quality.py --op fp8_blockscale --splits 60:48 30:24 20:16
    python benchmarks/explore/cascade_quality.py --op grouped_gemm --splits 20:32 20:8 10:4
    python benchmarks/explore/cascade_quality.py --op moe --models DIR   # a re-exported folder
    python benchmarks/explore/cascade_quality.py --op fp8_blockscale --shortlist 1.03 --heldout

``--shortlist TOL`` adds every split on a runtime shortlist (what ``shortlist_tol`` TOL would give
at training; the shortlist does not change the trees), ``--heldout`` builds it without the
evaluation shapes' rows so that it does not know their best configs.

``--reexport DIR`` rewrites DIR's model of the op (its manifest's shortlist and the cascade files)
from the registry's current settings without retraining (see ``reexport``). ``--json PATH`` writes the per-(card, dtype, split) summary. Data: ``datasets/<op>/`` (only files
with evaluation rows are read). Runs on the CPU; minutes for MoE (~1,900 problems).
"""
from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq

DEFAULT_SPLITS = {
    "fp8_blockscale": ["60:48", "60:32", "60:24", "60:16", "40:32", "40:24", "40:16", "30:32", "30:24",
                       "30:16", "20:32", "20:24", "20:16"],
    "moe": ["60:64", "60:48", "60:32", "60:24", "60:16", "40:32", "40:24", "40:16", "30:32", "30:24",
            "30:16", "20:32", "20:24", "20:16"],
    "grouped_gemm": ["20:32", "20:16", "20:8", "20:4", "10:8", "10:4"],
}


def eval_frame(op: str):
    """Evaluation rows (status ok) of the op's committed data."""
    from gemm_costmodel.data import dataset as D

    files = [f for f in sorted(glob.glob(f"datasets/{op}/**/*.parquet", recursive=True))
             if any(pq.read_table(f, columns=["eval_shape"]).column("eval_shape").to_pylist())]
    df = D.load_dataset(paths=files)
    df = df[df["eval_shape"].astype(bool) & (df["status"].astype(str) == "ok")]
    return df


def sessions(proto, lo: int, hi: int, base: bool):
    import onnxruntime as ort

    from gemm_costmodel.learning.export import slice_trees

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(slice_trees(proto, lo, hi, base).SerializeToString(), sess_options=so,
                                providers=["CPUExecutionProvider"])


def pick(model, X, tb, cas):
    """_OnnxModel.best(X, tb, 1)[0][0] with cascade cas = (prefix, suffix, keep) or None (whole
    model); returns (row, onnxruntime seconds)."""
    bias = -model.vendor_margin * X[:, model.vendor_feature] if model.vendor_margin else 0.0
    t0 = time.perf_counter()
    if cas is not None and len(X) > cas[2]:
        prefix, suffix, keep = cas
        s = model.score(X, prefix) + bias
        top = np.flatnonzero(s <= np.partition(s, keep - 1)[keep - 1])
        s = s[top] + model.score(X[top], suffix)
        dt = time.perf_counter() - t0
        return int(top[np.lexsort((tb[top], s))[0]]), dt
    s = model.score(X) + bias
    dt = time.perf_counter() - t0
    return int(np.lexsort((tb, s))[0]), dt


def shortlist(op: str, tol: float, edges: tuple, heldout: bool, frame=None) -> dict:
    """{bucket: set of ids}: CostModel._shortlist on the rows ``costmodel train`` would fit (sm90
    harness rows of the op), without the evaluation shapes' rows if heldout."""
    from types import SimpleNamespace

    from gemm_costmodel.learning.model import CostModel, training_rows
    from gemm_costmodel.learning.pipeline import load_training_frame

    if frame is None:
        frame = load_training_frame(None, op=op)
    rows = training_rows(frame, stable_only=False)
    if heldout:
        rows = rows[~rows["eval_shape"].astype(bool)]
    fake = SimpleNamespace(config=SimpleNamespace(shortlist_tol=tol, shortlist_edges=edges))
    return {int(b): set(ids) for b, ids in CostModel._shortlist(fake, rows).items()}


def reexport(op: str, models_dir: str) -> None:
    """Rewrite <models_dir>/<op>-sm90.json's shortlist and cascade from the registry's current
    ``train_defaults`` (shortlist_tol, shortlist_edges) and ``cascade``, without retraining: the
    shortlist is what ``CostModel.fit`` would compute from the same rows (checked through the
    manifest's training_data_hash), and neither it nor the cascade changes the trees. The
    decision model's .onnx is not touched; its -prefix/-suffix files are cut again."""
    from gemm_costmodel import registry
    from gemm_costmodel.learning.export import CASCADE_KEEP, CASCADE_PREFIX_FRACTION, data_hash, write_cascade
    from gemm_costmodel.learning.pipeline import load_training_frame
    from gemm_costmodel.serving.runtime import seal_manifest

    spec = registry.get(op)
    stem = os.path.join(models_dir, f"{op}-sm90")
    with open(stem + ".json", encoding="utf-8") as fh:
        man = json.load(fh)
    frame = load_training_frame(None, op=op, dtypes=man["dtypes"])
    got = data_hash(frame)
    if got != man["training_data_hash"]:
        raise SystemExit(f"{op}: the data's hash {got} is not the manifest's {man['training_data_hash']}")
    tol = float(spec.train_defaults.get("shortlist_tol", 0.0))
    edges = tuple(spec.train_defaults["shortlist_edges"])
    sl = shortlist(op, tol, edges, heldout=False, frame=frame) if tol else None
    man["shortlist"] = ({"m_edges": list(edges), "buckets": {str(b): sorted(v) for b, v in sorted(sl.items())}}
                        if sl else None)
    man["hyperparameters"] = {**man["hyperparameters"], "shortlist_tol": tol, "shortlist_edges": list(edges)}
    with open(stem + ".json", "w", encoding="utf-8") as fh:
        json.dump(seal_manifest(man), fh, indent=1, sort_keys=True)
    opts = spec.cascade
    entry = write_cascade(stem + ".onnx", stem + ".json", prefix_trees=opts.get("prefix_trees"),
                          keep=opts.get("keep", CASCADE_KEEP),
                          prefix_fraction=opts.get("prefix_fraction", CASCADE_PREFIX_FRACTION))
    print(f"{op}: shortlist tol {tol} ({' '.join(str(len(v)) for _, v in sorted((sl or {}).items()))}), "
          f"cascade {entry['prefix_trees']}/{entry['trees']} trees, keep {entry['keep']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="moe", choices=sorted(DEFAULT_SPLITS))
    ap.add_argument("--splits", nargs="+", default=None, help="prefix_trees:keep (default: a grid per op)")
    ap.add_argument("--models", default=None, help="models folder (default: the shipped models/)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--limit", type=int, default=0, help="first N problems per card (a quick look)")
    ap.add_argument("--shortlist", type=float, default=0.0,
                    help="also every split on a shortlist of this tolerance (TrainConfig.shortlist_tol, built "
                         "as training builds it from the op's sm90 harness rows)")
    ap.add_argument("--heldout", action="store_true",
                    help="build that shortlist without the evaluation shapes' rows (an honest check)")
    ap.add_argument("--edges", default="1,2,4,8,16,32,64,128,256,512,1024,4096",
                    help="the shortlist's M bucket edges (default: the dense model's)")
    ap.add_argument("--reexport", default=None, metavar="DIR",
                    help="instead: rewrite DIR's model of --op with the registry's shortlist and cascade")
    ap.add_argument("--picks", default=None, metavar="CSV", help="write every problem's pick per split")
    ap.add_argument("--against", default=None, metavar="CSV",
                    help="a --picks CSV of another models folder: compare this run's served picks with its "
                         "'whole' and served ones (before/after a re-export)")
    args = ap.parse_args()
    if args.reexport:
        reexport(args.op, args.reexport)
        return 0
    import onnx

    from gemm_costmodel import registry
    from gemm_costmodel.learning.export import tree_count
    from gemm_costmodel.serving.candidates import table as candidate_table
    from gemm_costmodel.serving.runtime import Dispatcher

    spec = registry.get(args.op)
    splits = args.splits or DEFAULT_SPLITS[args.op]
    df = eval_frame(args.op)
    fields = [f for f in spec.problem_fields if f in df.columns]
    extra = [f for f in fields if f not in ("m", "n", "k", "dtype")]
    key = ["gpu_name", *fields]
    for c in key:
        df[c] = df[c].astype(str) if c in ("gpu_name", "dtype", "stage", "routing") else df[c].astype(int)
    best = df.groupby(key, observed=True).p50_us.min()
    lat = df.groupby([*key, "candidate"], observed=True).p50_us.min()
    lat = dict(zip(lat.index, lat.to_numpy()))
    sl, edges = None, tuple(int(v) for v in args.edges.split(","))
    if args.shortlist:
        sl = shortlist(args.op, args.shortlist, edges, args.heldout)
        print(f"shortlist tol {args.shortlist}{' (held out)' if args.heldout else ''}: bucket sizes "
              + " ".join(str(len(sl[b])) for b in sorted(sl)))
    summary, pick_rows = [], []
    for card in sorted(df.gpu_name.unique()):
        disp = Dispatcher(op=args.op, gpu_name=card, models_dir=args.models)
        probs = [p for p in best.index if p[0] == card]
        if args.limit:
            probs = probs[:args.limit]
        for dtype in sorted({p[fields.index("dtype") + 1] for p in probs}):
            model = disp.model_for(dtype)
            if model is None:
                print(f"{card} {dtype}: no model ({disp.fallback_reasons.get(dtype)})")
                continue
            proto = onnx.load(model.path)
            n_trees = tree_count(proto)
            cas = {}
            for sp in splits:
                p, keep = (int(v) for v in sp.split(":"))
                cas[sp] = (sessions(proto, 0, p, True), sessions(proto, p, n_trees, False), keep)
            shipped = model.cascade
            shipped_name = f"shipped {model.manifest['cascade']['prefix_trees']}:{shipped[2]}" if shipped else "shipped (none)"
            seen = []
            orig = model.best

            def rec(X, tb, count, _orig=orig, _seen=seen):
                _seen.append((X.copy(), tb.copy()))
                return _orig(X, tb, count)

            model.best = rec
            variants = [("whole", False, None), (shipped_name, False, shipped),
                        *((sp, False, cas[sp]) for sp in splits)]
            if sl is not None:
                variants += [("sl+whole", True, None), *((f"sl+{sp}", True, cas[sp]) for sp in splits)]
            names = [v[0] for v in variants]
            rows_scored = {"all": [], "shortlist": []}
            picks = {nm: [] for nm in names}
            secs = {nm: [] for nm in names}
            mism = 0
            dprobs = [p for p in probs if p[fields.index("dtype") + 1] == dtype]
            ct_ids = None
            for prob in dprobs:
                f = dict(zip(fields, prob[1:]))
                disp.clear_cache()
                seen.clear()
                choice = disp.select(f["m"], f["n"], f["k"], dtype, **{x: f[x] for x in extra})
                X, tb = seen[-1]
                if ct_ids is None:
                    ct_ids = candidate_table(disp.space_arch, dtype, args.op).ids
                rows_scored["all"].append(len(tb))
                if sl is not None:
                    ids = sl[bisect.bisect_left(edges, f["m"])]
                    on = np.flatnonzero([ct_ids[i] in ids for i in tb])
                    if not len(on):  # the runtime's rule: no shortlisted feasible candidate, score all
                        on = np.arange(len(tb))
                    rows_scored["shortlist"].append(len(on))
                for nm, use_sl, c in variants:
                    Xv, tbv = (X[on], tb[on]) if use_sl else (X, tb)
                    r, dt = pick(model, Xv, tbv, c)
                    picks[nm].append(ct_ids[tbv[r]])
                    secs[nm].append(dt)
                if picks[shipped_name][-1] != choice.candidate:
                    mism += 1
            model.best = orig
            oracle = np.array([best[p] for p in dprobs])
            for nm in names:
                served = nm == shipped_name
                for p, c, o in zip(dprobs, picks[nm], oracle):
                    pick_rows.append({"card": card, "dtype": dtype, "problem": "/".join(map(str, p[1:])),
                                      "split": "served" if served else nm, "pick": c,
                                      "slowdown": lat.get((*p, c), np.nan) / o})
            print(f"\n{card} {dtype}: {len(dprobs)} problems, {n_trees} trees, scored rows p50 "
                  f"{np.median(rows_scored['all']):.0f}"
                  + (f" (shortlist {np.median(rows_scored['shortlist']):.0f})" if sl is not None else "")
                  + f"; emulated shipped cascade != select: {mism}")
            print(f"  {'split':>16} {'!=whole':>8} {'!=shipped':>9} {'geomean':>8} {'p99':>6} {'worst':>6} {'unmeas':>6} {'ort us p50':>10}")
            for nm in names:
                r = np.array([lat.get((*p, c), np.nan) for p, c in zip(dprobs, picks[nm])]) / oracle
                ok = ~np.isnan(r)
                row = {"card": card, "dtype": dtype, "split": nm, "problems": len(dprobs),
                       "differ_whole": int(sum(a != b for a, b in zip(picks[nm], picks["whole"]))),
                       "differ_shipped": int(sum(a != b for a, b in zip(picks[nm], picks[shipped_name]))),
                       "geomean": float(np.exp(np.mean(np.log(r[ok])))), "p99": float(np.percentile(r[ok], 99)),
                       "worst": float(r[ok].max()), "unmeasured": int((~ok).sum()),
                       "ort_us_p50": float(np.median(secs[nm]) * 1e6), "emulation_mismatches": mism}
                summary.append(row)
                print(f"  {nm:>16} {row['differ_whole']:>8} {row['differ_shipped']:>9} {row['geomean']:>8.4f} "
                      f"{row['p99']:>6.3f} {row['worst']:>6.3f} {row['unmeasured']:>6} {row['ort_us_p50']:>10.1f}")
    if args.picks or args.against:
        import pandas as pd

        cur = pd.DataFrame(pick_rows)
        if args.picks:
            cur.to_csv(args.picks, index=False)
        if args.against:
            old = pd.read_csv(args.against, dtype=str)
            key = ["card", "dtype", "problem"]
            now = cur[cur.split == "served"]
            print(f"\nthis run's served picks against {args.against}:")
            for ref in ("whole", "served"):
                j = now.merge(old[old.split == ref], on=key, suffixes=("", "_ref"))
                for (card, dtype), g in j.groupby(["card", "dtype"]):
                    lg = lambda v: float(np.exp(np.nanmean(np.log(v.astype(float)))))  # noqa: E731
                    print(f"  vs its {ref:>6}: {card} {dtype}: {int((g.pick != g.pick_ref).sum())} of {len(g)} "
                          f"picks differ; geomean {lg(g.slowdown_ref):.5f} -> {lg(g.slowdown):.5f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
