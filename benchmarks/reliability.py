"""Acceptance run of the sweep-reliability issue: one process sweeps 150+ shapes of
mixed size in full (every feasible candidate), bf16 and fp8, and this module checks
what came back: rows lost to memory, reserved memory per shape, throughput.

    python -m gemm_costmodel.benchmarks.reliability shapes --out shapes.csv
    costmodel bench --shapes shapes.csv --dtype bf16 fp8 --mode all --name reliability --out DIR
    python -m gemm_costmodel.benchmarks.reliability check DIR/reliability-shard00of01.jsonl

The shape list mixes decode and prefill (M 1-16384) over layers up to N = 151936
(vocabulary projections) and K = 28672, the sizes at which a 160-shape sweep once
ran out of memory from its 14th shape on. Its estimated sweep time is kept under a
budget so that it fits one device call.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import Counter

# (N, K) of common layers, small to vocabulary-sized.
NK = ((2048, 2048), (4096, 4096), (6144, 4096), (11008, 4096), (4096, 11008), (8192, 8192),
      (28672, 8192), (8192, 28672), (57344, 8192), (73728, 8192), (65536, 5120), (128256, 4096),
      (151936, 3584), (10240, 8192))
M_GRID = (1, 3, 7, 16, 33, 64, 100, 256, 1024, 4096, 16384)
RATES = {"bf16": 600e12, "fp8": 1000e12}  # FLOP/s a typical candidate reaches (estimate only)
HBM = 3.0e12


def estimated_seconds(m: int, n: int, k: int, dtype: str) -> float:
    """Rough sweep time of one shape in full: candidates x (host overhead + ~8 launches of
    twice the roofline time); enough to keep the list inside one device call."""
    from gemm_costmodel.kernels.gemm.space import Problem, feasible_configs

    e = 1 if dtype == "fp8" else 2
    t = max(2 * m * n * k / RATES[dtype], (m * k + n * k) * e / HBM) + 5e-6
    return len(feasible_configs(Problem(m, n, k, dtype))) * (0.009 + 8 * 2 * t)


def make_shapes(budget_s: float = 560.0, seed: int = 0) -> list[tuple[int, int, int, str]]:
    """Every (M, N, K) of the grid for bf16 and fp8, cheapest first per size class, until the
    estimated time is spent; the largest shapes are kept first so that the list always
    holds them (memory is the point)."""
    all_shapes = [(m, n, k, d) for d in ("bf16", "fp8") for n, k in NK for m in M_GRID]
    cost = {s: estimated_seconds(*s) for s in all_shapes}
    rng = random.Random(seed)
    big = [s for s in all_shapes if s[0] >= 1024]
    small = [s for s in all_shapes if s[0] < 1024]
    rng.shuffle(big)
    rng.shuffle(small)
    chosen, spent = [], 0.0
    # A third of the budget for prefill shapes (M >= 1024), the rest for decode and mid M.
    for group, share in ((big, budget_s / 3), (small, budget_s)):
        for s in sorted(group, key=cost.__getitem__):
            if spent + cost[s] <= share:
                chosen.append(s)
                spent += cost[s]
    rng.shuffle(chosen)
    return chosen


def check(path: str) -> dict:
    """Rows lost to memory, status counts and the memory/throughput log of a finished sweep."""
    from .store import read_rows, row_is_out_of_memory

    rows = read_rows([path])
    shapes = {(r["dtype"], r["m"], r["n"], r["k"]) for r in rows}
    statuses = Counter(r["status"] for r in rows)
    lost = [r for r in rows if row_is_out_of_memory(r)]
    log_path = path.replace(".gz", "")[: -len(".jsonl")] + ".shapes.log"
    logs = []
    try:
        with open(log_path, encoding="utf-8") as fh:
            logs = [json.loads(line) for line in fh if line.strip()]
    except OSError:
        pass
    mem = [e["memory"] for e in logs if e.get("memory")]
    out = {"rows": len(rows), "shapes": len(shapes), "statuses": dict(statuses),
           "rows_lost_to_memory": len(lost), "shapes_logged": len(logs),
           "reserved_peak_mb_max": max((m["reserved_peak_mb"] for m in mem), default=None),
           "reserved_after_mb_max": max((m["reserved_after_mb"] for m in mem), default=None),
           "reserved_after_mb_first_last": [mem[0]["reserved_after_mb"], mem[-1]["reserved_after_mb"]] if mem else None,
           "m_range": [min(s[1] for s in shapes), max(s[1] for s in shapes)] if shapes else None,
           "n_max": max((s[2] for s in shapes), default=None),
           "dtypes": sorted({s[0] for s in shapes})}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shapes")
    s.add_argument("--out", required=True)
    s.add_argument("--budget", type=float, default=560.0, help="estimated sweep seconds")
    c = sub.add_parser("check")
    c.add_argument("path")
    args = ap.parse_args(argv)
    if args.cmd == "shapes":
        shapes = make_shapes(args.budget)
        with open(args.out, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["M", "N", "K", "dtype"])
            w.writerows(shapes)
        est = sum(estimated_seconds(*s) for s in shapes)
        print(f"{len(shapes)} shapes, estimated {est:.0f} s: {args.out}", file=sys.stderr)
        return 0
    print(json.dumps(check(args.path), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
