"""CPU benchmark of the runtime dispatcher (issue 5): warm overhead, cold decisions, threads.

- warm: ``select`` on cached problems vs a bare dict lookup of the same keys
  (median over repeats of loops over 1,000 varied problems);
- cold: one decision per new problem (p50/p90/p99 over varied shapes and dtypes), as shipped
  (shortlist and cascade), with the shortlist scored by the whole model, and with every feasible
  candidate scored; per phase (mask, features, whole-model onnxruntime, cascade), and how often
  the cascade's pick is the whole model's; each decision's wall time beside its thread's CPU time,
  so a tail made by the host taking the CPU away (a preempted thread: wall >> CPU) is told apart
  from one the decision's own work makes;
- concurrency: 8 threads x 10,000 mixed dispatches compared with single-threaded answers.

    python -m gemm_costmodel.benchmarks.dispatch_cpu --gpu "NVIDIA H100 80GB HBM3" --out DIR
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import threading
import time

import numpy as np


def _problems(n: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = rng.choice([1, 2, 3, 4, 7, 8, 16, 24, 32, 48, 64, 100, 128, 256, 500, 512, 1024, 2048, 4096, 4097, 8192])
        n_ = rng.choice([512, 896, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 11008, 14336, 28672])
        k = rng.choice([512, 896, 1024, 2048, 3584, 4096, 5120, 7168, 8192, 14336])
        out.append((m, n_, k, rng.choice(["bf16", "bf16", "fp16", "fp8"])))
    return out


def cold_problems(n: int, seed: int = 1) -> list[tuple]:
    """The first n distinct problems of ``_problems`` (the cold benchmark's set for seed 1)."""
    return list(dict.fromkeys(_problems(n * 3, seed=seed)))[:n]


# A decision whose wall time exceeds its thread's CPU time by more than this was off the CPU for
# part of it (preempted, or waiting on a page fault): the host's doing, not the decision's work.
# A cold decision takes 0.15-0.6 ms of CPU, so 0.5 ms off the CPU is far outside timer noise.
OFF_CPU_US = 500.0


def latency_summary(wall_us, cpu_us, off_cpu_us: float = OFF_CPU_US) -> dict:
    """Percentiles of decision wall times and of their threads' CPU times (same decisions, in
    microseconds), the decisions off the CPU for more than off_cpu_us, and the wall p99 of the
    others."""
    wall, cpu = np.asarray(wall_us, dtype=float), np.asarray(cpu_us, dtype=float)
    if wall.shape != cpu.shape or wall.size == 0:
        raise ValueError(f"wall_us and cpu_us must be non-empty and of one length, got {wall.size} and {cpu.size}")
    off = wall - cpu > off_cpu_us
    on = wall[~off] if (~off).any() else wall
    return {"decisions": int(wall.size), "p50_us": float(np.percentile(wall, 50)),
            "p90_us": float(np.percentile(wall, 90)), "p99_us": float(np.percentile(wall, 99)),
            "max_us": float(wall.max()), "cpu_p50_us": float(np.percentile(cpu, 50)),
            "cpu_p99_us": float(np.percentile(cpu, 99)), "cpu_max_us": float(cpu.max()),
            "off_cpu_decisions": int(off.sum()), "p99_us_on_cpu": float(np.percentile(on, 99))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="GPU the decisions are for")
    ap.add_argument("--models", default=None, help="model folder (default: the shipped models)")
    ap.add_argument("--out", default="benchmarks/results/runtime")
    ap.add_argument("--cold", type=int, default=500)
    ap.add_argument("--warm", type=int, default=1000, help="distinct cached problems in the warm loop")
    ap.add_argument("--mixed", type=int, default=10_000, help="dispatches per thread in the concurrency check")
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="onnxruntime intra-op threads of the cold-decision runs (one run each)")
    ap.add_argument("--interleave-phases", action="store_true",
                    help="probe each decision's phases right after it (the protocol before 2026-11-28), not "
                         "in a pass after the timed decisions")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.collect(); gc.freeze() after warm_up, as a server may do after start-up: moves "
                         "start-up objects out of the collector's reach, so a full collection during a "
                         "decision costs less (a comparison switch, not a library default)")
    args = ap.parse_args(argv)

    from gemm_costmodel.serving.runtime import Dispatcher

    res = {"gpu": args.gpu, "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "gc_freeze": bool(args.gc_freeze),
           "phases": "interleaved" if args.interleave_phases else "separate pass"}
    import onnxruntime

    res["onnxruntime"] = onnxruntime.__version__

    # -- cold decisions --------------------------------------------------------------
    # shortlist: as shipped (the shortlist and the cascade); whole_model: the shortlist scored by the
    # whole model (no cascade, as before issue 18's cascade); all_feasible: no shortlist.
    runs = [(f"{label}" + ("" if th == 1 else f"_threads{th}"), strip, th, whole)
            for th in args.threads for label, strip, whole in (("shortlist", False, False),
                                                                ("shortlist_whole_model", False, True),
                                                                ("all_feasible", True, False))]
    for label, strip, th, whole_model in runs:
        d = Dispatcher(gpu_name=args.gpu, models_dir=args.models, threads=th)
        for dt in ("bf16", "fp16", "fp8"):
            model = d.model_for(dt)
            if model is None:
                raise SystemExit(f"no model: {d.fallback_reasons}")
            if strip:
                model.buckets = {}
            if whole_model:
                model.cascade = None
        # First-use costs (sessions' first runs, each dtype's table, feature cache and shortlist
        # masks) are paid once per process, not per decision: a server pays them in warm_up.
        d.warm_up(("bf16", "fp16", "fp8"))
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        probs = cold_problems(args.cold)
        ts, cpu, scored, phases = [], [], [], {"mask": [], "features": [], "onnxruntime": [], "cascade": []}
        picks = []

        def timed_select(p):
            c = time.thread_time_ns()
            t = time.perf_counter()
            picked = d.select(*p).candidate
            ts.append((time.perf_counter() - t) * 1e6)
            cpu.append((time.thread_time_ns() - c) / 1e3)
            picks.append(picked)

        def probe_phases(p):
            # The same decision again, phase by phase (the runtime's own steps, outside select).
            t0 = time.perf_counter()
            ct, idx = d._feasible(p[0], p[1], p[2], p[3])
            t1 = time.perf_counter()
            model = d.model_for(p[3])
            sl = model.shortlist_mask(ct, p[0])
            sel = idx[sl[idx]] if sl is not None and sl[idx].any() else idx
            X = d._features(ct, sel, p[0], p[1], p[2], p[3], 1, 1)
            t2 = time.perf_counter()
            whole = model.score(X)
            t3 = time.perf_counter()
            model.best(X, sel, 1)  # the cascade where the model has one (else the whole model again)
            t4 = time.perf_counter()
            for k_, v in (("mask", t1 - t0), ("features", t2 - t1), ("onnxruntime", t3 - t2), ("cascade", t4 - t3)):
                phases[k_].append(v * 1e6)
            scored.append(len(sel))
            # Does select (through the cascade) pick what the whole model ranks first?
            return ct.ids[sel[np.lexsort((sel, whole))[0]]]

        if args.interleave_phases:
            # Before 2026-11-28: each decision's phase probes ran right after it, so the whole
            # model's trees (which a cascaded select never reads) and a second pass over the same
            # work sat between one timed decision and the next.
            agree = 0
            for p in probs:
                timed_select(p)
                agree += picks[-1] == probe_phases(p)
        else:
            # The timed decisions back to back (a cold select per new problem, as a server meets
            # them), then the phase probes in a pass of their own: instrumentation that runs the
            # whole model between two timed decisions evicts the cascade's trees from the CPU's
            # caches and slows the next decision (docs/decisions/038-a-finer-shortlist.md, "A finer shortlist").
            for p in probs:
                timed_select(p)
            agree = sum(pk == probe_phases(p) for p, pk in zip(probs, picks))
        res[f"cold_{label}"] = {**latency_summary(ts, cpu),
                                "candidates_scored_median": float(np.median(scored)),
                                "phase_p50_us": {k_: float(np.median(v)) for k_, v in phases.items()},
                                "candidates_scored_max": int(np.max(scored)),
                                "cascade": {dt: (d.model_for(dt).manifest.get("cascade") or {}).get("prefix_trees")
                                            for dt in ("bf16", "fp16", "fp8")},
                                "cascade_agreement": agree / len(probs)}
        print(label, res[f"cold_{label}"], flush=True)

    # -- warm overhead -----------------------------------------------------------------
    d = Dispatcher(gpu_name=args.gpu, models_dir=args.models)
    probs = cold_problems(args.warm, seed=2)
    for p in probs:
        d.select(*p)
    bare = {(m, n, k, dt, 1, 1): "x" for m, n, k, dt in probs}
    per_sel, per_dict = [], []
    for _ in range(30 if args.warm >= 1000 else 5):
        t = time.perf_counter()
        for m, n, k, dt in probs:
            d.select(m, n, k, dt)
        per_sel.append((time.perf_counter() - t) / len(probs) * 1e9)
        t = time.perf_counter()
        for m, n, k, dt in probs:
            bare.get((m, n, k, dt, 1, 1))
        per_dict.append((time.perf_counter() - t) / len(probs) * 1e9)
    res["warm"] = {"select_ns": statistics.median(per_sel), "bare_dict_ns": statistics.median(per_dict),
                   "overhead_ns": statistics.median(per_sel) - statistics.median(per_dict)}
    print("warm", res["warm"], flush=True)

    # -- concurrency ----------------------------------------------------------------------
    d1 = Dispatcher(gpu_name=args.gpu, models_dir=args.models, cache_size=256)
    mixed = _problems(args.mixed, seed=3)
    expected = [d1.select(*p).candidate for p in mixed]
    d8 = Dispatcher(gpu_name=args.gpu, models_dir=args.models, cache_size=256)  # small cache: evictions race too
    errors, mismatches = [], [0]
    lock = threading.Lock()

    def worker(tid: int) -> None:
        order = list(range(len(mixed)))
        random.Random(tid).shuffle(order)
        bad = 0
        try:
            for i in order:
                if d8.select(*mixed[i]).candidate != expected[i]:
                    bad += 1
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors.append(repr(exc))
        with lock:
            mismatches[0] += bad

    t = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    res["concurrency"] = {"threads": 8, "dispatches_per_thread": len(mixed), "errors": len(errors),
                          "mismatches_vs_single_thread": mismatches[0], "seconds": time.perf_counter() - t,
                          "first_error": errors[0] if errors else None}
    print("concurrency", res["concurrency"], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dispatch_cpu.json"), "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
