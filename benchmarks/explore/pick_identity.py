"""The picks of every ranker op and dtype over a fixed problem list, to show that a change to the
cold path moved no decision: run it before the change (``--out before.json``), then after it
(``--out after.json --compare before.json``); the comparison names every problem whose pick moved.

Problems per op and dtype: every distinct problem of the op's evaluation suite (``dispatch_ops``'s
suite) up to ``--suite-max``, plus ``--random`` of them with a random M (log-uniform in 1..16384),
seeded, so both runs decide the same list. Each is a cold decision (``clear_cache()`` then
``select``), so it exercises what ``dispatch_ops`` times: the model where one serves the dtype, the
fallback rule where none does.

    python benchmarks/explore/pick_identity.py --out picks.json [--compare old.json]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import warnings

from gemm_costmodel import registry
from gemm_costmodel.benchmarks.dispatch_ops import _select, problem_kwargs, suite_name


def problems(op: str, dtype: str, suite_max: int, n_random: int, seed: int = 0) -> list[dict]:
    spec = registry.get(op)
    pool, seen = [], set()
    for item in spec.suite(suite_name(spec), dtype):
        p = problem_kwargs(spec, item)
        key = tuple(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            pool.append(p)
    if not pool:
        return []
    rng = random.Random(f"{seed}:{op}:{dtype}")
    out = pool[:suite_max]
    for _ in range(n_random):
        p = dict(rng.choice(pool))
        p["m"] = int(round(math.exp(rng.uniform(0.0, math.log(16384)))))
        out.append(p)
    return out


def picks(gpu: str, suite_max: int, n_random: int, ops=None) -> dict:
    from gemm_costmodel.serving.runtime import Dispatcher

    out = {}
    for op in ops or registry.names("ranker"):
        for dtype in registry.get(op).dtypes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = Dispatcher(gpu_name=gpu, op=op)
                rows = []
                for p in problems(op, dtype, suite_max, n_random):
                    d.clear_cache()
                    c = _select(d, p)
                    rows.append([p, c.candidate, c.source])
            out[f"{op}:{dtype}"] = rows
            print(f"{op} {dtype}: {len(rows)} problems", file=sys.stderr, flush=True)
    return out


def compare(new: dict, old: dict) -> int:
    """Print the moved picks per op and dtype; returns how many moved (or are missing)."""
    moved = 0
    for key in sorted(set(new) | set(old)):
        a, b = old.get(key, []), new.get(key, [])
        diff = [(p, x, y) for (p, x, _), (q, y, _) in zip(a, b) if p == q and x != y]
        missing = abs(len(a) - len(b)) + sum(1 for (p, _, _), (q, _, _) in zip(a, b) if p != q)
        moved += len(diff) + missing
        print(f"{key}: {len(b)} problems, {len(b) - len(diff) - missing} identical picks"
              + (f", {len(diff)} moved" if diff else "") + (f", {missing} not comparable" if missing else ""))
        for p, x, y in diff[:5]:
            print(f"    {p}: {x} -> {y}")
    return moved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="NVIDIA H200")
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="an earlier run's JSON: report the picks that moved")
    ap.add_argument("--suite-max", type=int, default=200)
    ap.add_argument("--random", type=int, default=200)
    ap.add_argument("--ops", nargs="+", default=None)
    args = ap.parse_args(argv)
    res = picks(args.gpu, args.suite_max, args.random, args.ops)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(res, fh)
    if args.compare:
        with open(args.compare, encoding="utf-8") as fh:
            return 1 if compare(res, json.load(fh)) else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
