"""Cold and warm decisions of every registered ranker op, per dtype (issue 58's acceptance: a cold
decision <= 0.5 ms p50 and <= 1 ms p99 on the H200 host for every op, the warm one unchanged).

For each op of ``registry.names('ranker')`` and each of its dtypes: problems drawn from the op's
evaluation suite (its first suite if it has no 'eval', e.g. the dense GEMM's 'foundation'), half of
them with a random M in 1..16384 (log-uniform) instead of the suite's; each problem's fields come
from the registry (``problem_fields``, ``fixed``), so no op is named here.

- cold: ``clear_cache()`` then one timed ``select`` per problem (wall time and the thread's CPU
  time, ``dispatch_cpu.latency_summary``), after ``warm_up`` and a few untimed decisions (the
  once-per-process costs a server pays at start-up); apart for the suite's own M (repeats of a
  problem find per-problem caches filled) and for the random M (new problems);
- warm: the same problems cached, ``select`` in a loop (median over repeats) vs a dict lookup.

An op/dtype with no usable model (e.g. MoE's fp8bs before its model ships) is timed all the same:
its decisions are the fallback rule's, and the result says so (``decided_by``, the reason).

    python -m gemm_costmodel.benchmarks.dispatch_ops --gpu "NVIDIA H200" --out DIR

Writes DIR/dispatch_ops.json and DIR/dispatch_ops.md.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import random
import statistics
import time
import warnings
import zlib

from gemm_costmodel import registry
from gemm_costmodel.benchmarks.dispatch_cpu import latency_summary

M_MAX = 16384
WARMUP_DECISIONS = 10  # untimed first decisions: onnxruntime's first runs of each session allocate
SLOWEST = 5  # the slowest decisions kept with their problems


def suite_name(spec: registry.OpSpec) -> str:
    """The suite the problems come from: 'eval' where the op has one, else its first."""
    return "eval" if "eval" in spec.suites else next(iter(spec.suites))


def problem_kwargs(spec: registry.OpSpec, item) -> dict:
    """A suite item's problem as ``select`` keywords: the op's problem fields (from the item, or
    its ``problem`` where the suite wraps one) and its fixed fields."""
    src = getattr(item, "problem", item)
    out = {f: getattr(src, f) for f in spec.problem_fields}
    for f, v in spec.fixed.items():
        out.setdefault(f, v)
    return out


def draw_problems(spec: registry.OpSpec, dtype: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` problems of the op's suite for ``dtype`` (drawn with replacement), every other one
    with a random M (log-uniform over 1..M_MAX)."""
    pool = [problem_kwargs(spec, s) for s in spec.suite(suite_name(spec), dtype)]
    if not pool:
        return []
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = dict(rng.choice(pool))
        if i % 2:
            p["m"] = int(round(math.exp(rng.uniform(0.0, math.log(M_MAX)))))
        out.append(p)
    return out


def _select(d, p: dict):
    kw = {f: v for f, v in p.items() if f not in ("m", "n", "k", "dtype")}
    return d.select(p["m"], p["n"], p["k"], p["dtype"], **kw)


def bench_op(op: str, dtype: str, gpu: str, decisions: int, warm_repeats: int, models=None, seed: int = 0) -> dict:
    """Cold and warm decision times of one op and dtype (module docstring)."""
    from gemm_costmodel.serving.runtime import Dispatcher

    spec = registry.get(op)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = Dispatcher(gpu_name=gpu, models_dir=models, op=op)
        d.warm_up((dtype,))
        model = d.model_for(dtype)
        # A seed of the op and dtype's own: the same random M values in two dtypes of one op would
        # find the first dtype's per-problem caches (dtype-free, e.g. MoE routing counts) filled.
        probs = draw_problems(spec, dtype, decisions + WARMUP_DECISIONS, seed=seed + zlib.crc32(f"{op}:{dtype}".encode()))
        for p in probs[:WARMUP_DECISIONS]:
            _select(d, p)
        probs = probs[WARMUP_DECISIONS:]
        wall, cpu, timed, sources, skipped = [], [], [], collections.Counter(), 0
        random_m = []  # draw_problems gives every other problem (odd draw index) a random M
        for i, p in enumerate(probs, start=WARMUP_DECISIONS):
            d.clear_cache()
            c = time.thread_time_ns()
            t = time.perf_counter()
            try:
                choice = _select(d, p)
            except ValueError:  # a random M the op refuses (none does today): counted, not timed
                skipped += 1
                continue
            wall.append((time.perf_counter() - t) * 1e6)
            cpu.append((time.thread_time_ns() - c) / 1e3)
            timed.append(p)
            random_m.append(i % 2 == 1)
            sources[choice.source] += 1
    reason = None
    if model is None:
        reason = d.fallback_reasons.get(dtype) or "; ".join(sorted({str(w.message) for w in caught})) or "no model"
        # The results are committed: the model folder by what was asked for, not this machine's path.
        reason = reason.replace(os.path.abspath(d.models_dir), models or "the shipped models folder")
    out = {"op": op, "dtype": dtype, "suite": suite_name(spec), "decisions": len(wall), "skipped": skipped,
           "decided_by": "model" if model is not None else "fallback rule", "fallback_reason": reason,
           "sources": dict(sources)}
    if not wall:
        return out
    out["cold"] = latency_summary(wall, cpu)
    # Apart: the suite's own problems (drawn with replacement, so a repeat finds the process's
    # per-problem caches filled, e.g. a routing's expert counts) and the random-M ones (new).
    for name, want in (("cold_suite_m", False), ("cold_random_m", True)):
        idx = [i for i, r in enumerate(random_m) if r == want]
        if idx:
            out[name] = latency_summary([wall[i] for i in idx], [cpu[i] for i in idx])
    # The tail's problems, by the decision's own CPU time: what a slow decision spends it on shows
    # in which problems it is (e.g. a first use of something per problem, not per process).
    order = sorted(range(len(cpu)), key=lambda i: -cpu[i])[:SLOWEST]
    out["slowest"] = [{"cpu_us": round(cpu[i], 1), "wall_us": round(wall[i], 1), "problem": timed[i]} for i in order]
    # Warm: every problem cached (one decision each), then select over them in a loop.
    d.clear_cache()
    done = []
    for p in probs:
        try:
            _select(d, p)
            done.append(p)
        except ValueError:
            pass
    keys = [(p["m"], p["n"], p["k"], p["dtype"], tuple(sorted(p.items()))) for p in done]
    bare = dict.fromkeys(keys, "x")
    per_sel, per_dict = [], []
    for _ in range(warm_repeats):
        t = time.perf_counter()
        for p in done:
            _select(d, p)
        per_sel.append((time.perf_counter() - t) / len(done) * 1e9)
        t = time.perf_counter()
        for key in keys:
            bare.get(key)
        per_dict.append((time.perf_counter() - t) / len(done) * 1e9)
    out["warm"] = {"select_ns": statistics.median(per_sel), "bare_dict_ns": statistics.median(per_dict)}
    return out


def markdown(res: dict) -> str:
    """The summary table of a run's results."""
    head = ["op", "dtype", "decided by", "decisions", "cold p50 (us)", "p90", "p99", "max", "CPU p50", "CPU p99",
            "off CPU", "p99 on CPU", "suite M: p50 / p99", "random M: p50 / p99", "warm select (ns)"]
    L = [f"# Cold and warm decisions per op: {res['gpu']}\n",
         f"`python -m gemm_costmodel.benchmarks.dispatch_ops --gpu \"{res['gpu']}\" --decisions "
         f"{res['decisions']}` on {res['cpus']} CPUs ({res['machine']}, Python {res['python']}, onnxruntime "
         f"{res['onnxruntime']}), {res['date']}. Problems: each op's evaluation suite (else its first), every "
         f"other one with a random M in 1..{M_MAX} (suite M: drawn with replacement, so a repeated problem "
         "finds the process's per-problem caches filled; random M: new problems). Cold: `clear_cache()` then "
         "`select`, wall time and the "
         "thread's CPU time; \"off CPU\": decisions whose wall time exceeds their CPU time by more than 0.5 ms "
         "(the host took the CPU away). Warm: `select` of a cached problem.\n",
         "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in res["results"]:
        c, w = r.get("cold"), r.get("warm", {})
        if c is None:
            L.append(f"| {r['op']} | {r['dtype']} | {r['decided_by']} | 0 |" + " |" * (len(head) - 4))
            continue
        L.append("| " + " | ".join([r["op"], r["dtype"], r["decided_by"], str(r["decisions"])]
                                   + [f"{c[k]:.0f}" for k in ("p50_us", "p90_us", "p99_us", "max_us", "cpu_p50_us",
                                                               "cpu_p99_us")]
                                   + [str(c["off_cpu_decisions"]), f"{c['p99_us_on_cpu']:.0f}"]
                                   + [f"{r[x]['p50_us']:.0f} / {r[x]['p99_us']:.0f}" if x in r else ""
                                      for x in ("cold_suite_m", "cold_random_m")]
                                   + [f"{w.get('select_ns', float('nan')):.0f}"]) + " |")
        slow = r["slowest"][0]
        fields = ", ".join(f"{f}={v}" for f, v in slow["problem"].items())
        notes.append(f"- {r['op']} {r['dtype']}: slowest decision {slow['cpu_us'] / 1e3:.2f} ms of CPU ({fields}).")
        if r["decided_by"] != "model":
            notes.append(f"- {r['op']} {r['dtype']}: no model serves it, the times are the fallback rule's "
                         f"({r['fallback_reason']}).")
    return "\n".join(L + ["", "The slowest decision of each (by its CPU time; the JSON lists the five slowest):\n"]
                     + notes) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="NVIDIA H200", help="GPU the decisions are for")
    ap.add_argument("--models", default=None, help="model folder (default: the shipped models)")
    ap.add_argument("--out", required=True, help="folder for dispatch_ops.json and dispatch_ops.md")
    ap.add_argument("--decisions", type=int, default=300, help="timed cold decisions per op and dtype")
    ap.add_argument("--warm-repeats", type=int, default=20, help="loops over the cached problems (median)")
    ap.add_argument("--ops", nargs="+", default=None, choices=registry.names("ranker"),
                    help="only these ops (default: every ranker op)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import onnxruntime

    res = {"gpu": args.gpu, "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__, "decisions": args.decisions,
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "results": []}
    for op in args.ops or registry.names("ranker"):
        for dtype in registry.get(op).dtypes:
            r = bench_op(op, dtype, args.gpu, args.decisions, args.warm_repeats, models=args.models, seed=args.seed)
            res["results"].append(r)
            c = r.get("cold", {})
            print(f"{op} {dtype} ({r['decided_by']}): cold p50 {c.get('p50_us', float('nan')):.0f} us, "
                  f"p99 {c.get('p99_us', float('nan')):.0f} us; warm {r.get('warm', {}).get('select_ns', 0):.0f} ns",
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dispatch_ops.json"), "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=1)
    with open(os.path.join(args.out, "dispatch_ops.md"), "w", encoding="utf-8") as fh:
        fh.write(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
