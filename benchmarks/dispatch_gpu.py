"""GPU end-to-end check of the runtime (issue 5), in one run on one GPU.

For evaluation shapes of this GPU (every candidate measured in the dataset, so
the oracle candidate is known), time three candidates in the same process, with
the harness's CUDA-graph timer over rotating buffers (>= 2x L2): the dispatched
one (shipped model through ``Dispatcher``), the dataset's oracle, and cuBLAS.
Each is correctness-gated first. Also measure the host overhead of the
convenience op (``ops.gemm``) against a direct launch of the same kernel.

    python -m gemm_costmodel.benchmarks.dispatch_gpu --data 'datasets/*/eval-*h100*.parquet' --out DIR
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import time

import numpy as np

from gemm_costmodel.util import geomean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", required=True, help="parquet files/globs with evaluation shapes")
    ap.add_argument("--n", type=int, default=150, help="at most this many shapes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--overhead-shapes", type=int, default=12)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--time-budget", type=float, default=420)
    ap.add_argument("--holdout-models", default=None,
                    help="also time the choice of a model trained without these evaluation shapes")
    args = ap.parse_args(argv)

    import torch

    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.serving import ops
    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.benchmarks import provenance
    from gemm_costmodel.kernels.timing import GraphTimer, copies_for
    from gemm_costmodel.kernels.gemm import kernel as K
    from gemm_costmodel.kernels.gemm.space import Problem, config_from_id
    from gemm_costmodel.serving.runtime import Dispatcher

    paths = sorted(p for pat in args.data for p in glob.glob(pat))
    df = D.load_dataset(paths)
    gpu = torch.cuda.get_device_name()
    ev = df[df["eval_shape"] & (df["status"] == "ok") & (df["gpu_name"].astype(str) == gpu)]
    if ev.empty:
        raise SystemExit(f"no evaluation shapes of {gpu} in {paths}")
    best = ev.loc[ev.groupby(["dtype", "m", "n", "k"], observed=True)["p50_us"].idxmin()]
    best = best.sample(frac=1.0, random_state=0).head(args.n)
    os.makedirs(args.out, exist_ok=True)
    prov = provenance.collect(torch.cuda.current_device())
    d = Dispatcher()
    ops.set_dispatcher(d)
    dh = Dispatcher(models_dir=args.holdout_models) if args.holdout_models else None
    from gemm_costmodel.benchmarks import precompile

    todo = []
    for r in best.itertuples(index=False):
        p = Problem(int(r.m), int(r.n), int(r.k), str(r.dtype))
        ids = {d.select(p.m, p.n, p.k, p.dtype).candidate, str(r.candidate)}
        if dh is not None:
            ids.add(dh.select(p.m, p.n, p.k, p.dtype).candidate)
        todo.append((p, [config_from_id(c) for c in ids if c != "cublas"]))
    d.clear_cache()
    precompile.precompile(todo, log=lambda m: print(m, flush=True), op="gemm")
    timer = GraphTimer()
    l2 = prov.get("l2_bytes") or 50 * 2**20
    rows = []
    t0 = time.perf_counter()
    for r in best.itertuples(index=False):
        if time.perf_counter() - t0 > args.time_budget:
            break
        dtype = str(r.dtype)
        p = Problem(int(r.m), int(r.n), int(r.k), dtype)
        t_sel = time.perf_counter()
        choice = d.select(p.m, p.n, p.k, dtype)
        cold_us = (time.perf_counter() - t_sel) * 1e6
        gen = torch.Generator(device="cuda")
        gen.manual_seed(C.seed_for(p, 0))
        first = C.make_operands(p, "cuda", gen)
        n_copies = copies_for(first.nbytes, l2)
        opsets = [first] + [C.make_operands(p, "cuda", gen) for _ in range(n_copies - 1)]
        ref = C.reference(first)
        row = {"dtype": dtype, "m": p.m, "n": p.n, "k": p.k, "dispatched": choice.candidate, "source": choice.source,
               "predicted_us": choice.predicted_us, "oracle": str(r.candidate), "data_oracle_us": float(r.p50_us),
               "cold_decision_us": cold_us, "n_copies": n_copies}
        cands = [("dispatched", choice.candidate), ("oracle", str(r.candidate)), ("cublas", "cublas")]
        if dh is not None:
            row["holdout_dispatched"] = dh.select(p.m, p.n, p.k, dtype).candidate
            cands.append(("holdout", row["holdout_dispatched"]))
        for label, cid in cands:
            cfg = config_from_id(cid)
            status, err, detail = C.gate(cfg, first, ref, dtype)
            row[f"{label}_status"] = status
            if status != C.STATUS_OK:
                row[f"{label}_us"] = float("nan")
                row[f"{label}_error"] = detail
                continue
            t = timer.measure(lambda i, c=cfg: opsets[i].run(c), n_copies, key=cid)
            row[f"{label}_us"] = t.p50_us
            row[f"{label}_stable"] = t.stable
        rows.append(row)
        print(json.dumps(row), flush=True)
        del opsets, first, ref
    torch.cuda.empty_cache()

    # Host overhead of the convenience op vs a direct launch of the same kernel (eager, small shapes:
    # launch-bound, so the difference is the dispatch + custom-op cost).
    small = sorted(rows, key=lambda x: x["m"] * x["n"] * x["k"])[: args.overhead_shapes]
    over = []
    for x in small:
        p = Problem(x["m"], x["n"], x["k"], x["dtype"])
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1)
        o = C.make_operands(p, "cuda", gen)
        cfg = config_from_id(x["dispatched"])
        sa, sb = o.scale_a, o.scale_b
        op = (lambda: ops.gemm(o.x, o.w)) if x["dtype"] != "fp8" else (lambda: ops.gemm_fp8(o.x, o.w, sa, sb))
        direct = lambda: K.launch(cfg, o.x, o.w, None, sa, sb)  # noqa: E731
        res = {}
        for name, fn in (("op", op), ("direct", direct)):
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            per = []
            for _ in range(5):
                ts = time.perf_counter()
                for _ in range(args.calls // 5):
                    fn()
                per.append((time.perf_counter() - ts) / (args.calls // 5) * 1e6)
                torch.cuda.synchronize()
            res[name] = statistics.median(per)
        over.append({"shape": f"{p.dtype}:{p.m}x{p.n}x{p.k}", "candidate": x["dispatched"],
                     "op_us_per_call": res["op"], "direct_us_per_call": res["direct"],
                     "overhead_us": res["op"] - res["direct"]})
        print(json.dumps(over[-1]), flush=True)

    ok = [x for x in rows if x.get("dispatched_status") == "ok" and x.get("oracle_status") == "ok"]
    summary = {
        "gpu": gpu, "provenance": {k: v for k, v in prov.items() if k != "hostname"},
        "shapes": len(rows), "shapes_timed": len(ok),
        "dispatched_over_oracle_geomean": geomean([x["dispatched_us"] / x["oracle_us"] for x in ok]),
        "dispatched_over_cublas_geomean": geomean([x["dispatched_us"] / x["cublas_us"] for x in ok
                                                    if x.get("cublas_status") == "ok"]),
        "oracle_over_cublas_geomean": geomean([x["oracle_us"] / x["cublas_us"] for x in ok
                                                if x.get("cublas_status") == "ok"]),
        "match_2pct": float(np.mean([x["dispatched_us"] <= 1.02 * x["oracle_us"] for x in ok])) if ok else float("nan"),
        "same_as_oracle": float(np.mean([x["dispatched"] == x["oracle"] for x in ok])) if ok else float("nan"),
        "by_dtype": {},
        "holdout_over_oracle_geomean": geomean([x["holdout_us"] / x["oracle_us"] for x in ok
                                                 if x.get("holdout_status") == "ok"]),
        "holdout_over_cublas_geomean": geomean([x["holdout_us"] / x["cublas_us"] for x in ok
                                                 if x.get("holdout_status") == "ok" and x.get("cublas_status") == "ok"]),
        "holdout_match_2pct": float(np.mean([x["holdout_us"] <= 1.02 * x["oracle_us"] for x in ok
                                             if x.get("holdout_status") == "ok"])) if dh is not None and ok else None,
        "cold_decision_us_p50": statistics.median([x["cold_decision_us"] for x in rows]) if rows else None,
        "op_overhead_us_median": statistics.median([o["overhead_us"] for o in over]) if over else None,
        "op_us_per_call_median": statistics.median([o["op_us_per_call"] for o in over]) if over else None,
        "direct_us_per_call_median": statistics.median([o["direct_us_per_call"] for o in over]) if over else None,
        "failures": [x for x in rows if x.get("dispatched_status") != "ok"],
        "l2_policy": "CUDA-graph replays over rotating input copies covering >= 2x L2",
    }
    for dt in sorted({x["dtype"] for x in ok}):
        sub = [x for x in ok if x["dtype"] == dt]
        summary["by_dtype"][dt] = {
            "shapes": len(sub),
            "dispatched_over_oracle_geomean": geomean([x["dispatched_us"] / x["oracle_us"] for x in sub]),
            "dispatched_over_cublas_geomean": geomean([x["dispatched_us"] / x["cublas_us"] for x in sub
                                                        if x.get("cublas_status") == "ok"]),
            "holdout_over_oracle_geomean": geomean([x["holdout_us"] / x["oracle_us"] for x in sub
                                                     if x.get("holdout_status") == "ok"]),
        }
    with open(os.path.join(args.out, "dispatch_gpu.jsonl"), "w", encoding="utf-8") as fh:
        for x in rows:
            fh.write(json.dumps(x) + "\n")
    with open(os.path.join(args.out, "dispatch_gpu_summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, default=str)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("failures", "provenance")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
