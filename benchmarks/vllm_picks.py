"""Training configs for vLLM's kernels sampled per compile key, and what a campaign of them costs.

vLLM's Triton kernels (ops ``vllm_moe``, ``vllm_w8a8_block``) are plain ``@triton.jit`` functions: a
config compiles once for each class of the int arguments (== 1, divisible by 16) of the problem it
runs, and for the fused-MoE kernel that includes M * top_k and vLLM's padded length (the op's space
``specialisation``). The harness's ``sample:K`` draws K configs per problem, so nearly every
measurement of a training sweep would be a compile of its own (~0.5 s of a worker's time, a few
times the measurement). Here the configs are drawn per compile key instead: each key gets a seeded
pool of ``pool`` configs of the space, and each training problem of that key measures ``per_problem``
of its key's pool plus vLLM's default for it (the fallback rule's pick: the baseline on every
problem), so a sweep compiles about keys x (pool + defaults) kernels, however many problems it
measures. A key with few problems gets a smaller pool (each pooled config measured on about REUSE
problems, at least 2 x per_problem configs): a pool larger than its draws buys diversity at the
price of one compile per measurement again. The result is a CSV for ``costmodel bench --mode
pick:CSV`` (columns key, candidate); the problems of the op's evaluation suites are left out (they
are measured in full).

    python -m gemm_costmodel.benchmarks.vllm_picks picks --op vllm_moe --dtype bf16 --shard 0/8 \\
        --out benchmarks/campaigns/vllm-moe-train-bf16-picks.csv
    python -m gemm_costmodel.benchmarks.vllm_picks estimate benchmarks/campaigns/vllm-kernels-h200.txt

``estimate`` counts, per campaign line, the problems, the (problem, candidate) measurements and the
distinct (config, compile key) precompile tasks, as ``costmodel bench`` would select them (no GPU).
"""
from __future__ import annotations

import argparse
import csv
import random
import sys
from collections import OrderedDict

from gemm_costmodel import registry

from . import harness, precompile

# A campaign's planning rates on an H200: the harness's measurements (the MoE campaigns' average) and
# the parallel precompile's (config, key) tasks on 14 workers, as measured on the H200 (gate suites,
# benchmarks/results/vllm_kernels/h200-gate/driver.log): a fused-MoE task (vLLM's kernel for both
# GEMMs) 288 in 209 s, a block-fp8 linear task 64 in 26 s (2 tasks a worker: its rate on a full
# sweep is nearer the fused MoE's per kernel, ~2.5 a second).
MEASUREMENTS_PER_S = 70.0
TASKS_PER_S = {"vllm_moe": 1.4, "vllm_w8a8_block": 2.5}
EVAL_SUITES = ("eval", "eval_core")
# How many problems of a key measure each of its pooled configs, on average, where the key has few.
REUSE = 4


def _held_out_keys(spec, dtype: str) -> set:
    out = set()
    for name in EVAL_SUITES:
        if name in spec.suites:
            out |= {s.key for s in spec.suite(name, dtype)}
    return out


def keyed_picks(op: str, dtype: str, shard=(0, 1), per_problem: int = 8, pool: int = 32, seed: int = 0,
                arch: str = "sm90", suite: str = "train") -> list[tuple[str, str]]:
    """[(problem key, config id)]: per problem of the suite's shard (evaluation problems left out),
    vLLM's default and ``per_problem`` configs of its compile key's pool of at most ``pool`` (module
    doc)."""
    spec = registry.get(op)
    space = spec.space_module()
    held = _held_out_keys(spec, dtype)
    groups: OrderedDict = OrderedDict()
    for s in harness.shard_shapes(spec.suite(suite, dtype), shard):
        if s.key in held:
            continue
        p = harness.shape_problem(spec, s)
        groups.setdefault(space.specialisation(p), []).append(p)
    rule = spec.fallback_rule()
    out = []
    for sig, probs in groups.items():
        # vLLM's configs run every problem (the ops' rules concern the vendor only): one list per key.
        feas = spec.feasible_configs(probs[0], arch, include_vendor=False)
        dicts = [{"variant": c.variant, **space.config_params(c)} for c in feas]
        rng = random.Random(harness.stable_hash(f"{op}/{dtype}/{sig!r}/{seed}"))
        size = min(pool, max(2 * per_problem, -(-len(probs) * per_problem // REUSE)), len(feas))
        pool_cfgs = rng.sample(feas, size)
        for p in probs:
            kw = {} if spec.fixed else {"e": p.e, "top_k": p.top_k}
            if "dtype" in spec.fallback_fields():
                kw["dtype"] = p.dtype
            default = feas[rule(p.m, p.n, p.k, 132, dicts, **kw)]
            rest = [c for c in pool_cfgs if c != default]
            r2 = random.Random(harness.stable_hash(f"{p.key}/{seed}"))
            out += [(p.key, c.id) for c in [default] + r2.sample(rest, min(per_problem, len(rest)))]
    return out


def write_csv(rows, path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["key", "candidate"])
        w.writerows(rows)


# -- what a campaign line costs ----------------------------------------------------------------

def _bench_args(args: list[str]):
    """The `costmodel bench` options that select what a sweep measures (the rest ignored)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--op", default=registry.DEFAULT_OP)
    ap.add_argument("--suite", default="foundation")
    ap.add_argument("--dtype", nargs="+", default=None)
    ap.add_argument("--mode", default="all")
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", default="sm90")
    return ap.parse_known_args(args)[0]


def estimate_line(args: list[str]) -> dict:
    """{op, problems, measurements, tasks, seconds} of one campaign line's bench arguments: the shapes
    ``costmodel bench`` takes (suite per dtype, --limit, then --shard), the candidates the harness
    selects for each, and the precompile's distinct (config, compile key) tasks."""
    a = _bench_args(args)
    spec = registry.get(a.op)
    shapes = []
    for dtype in a.dtype or [spec.dtypes[0]]:
        shapes += spec.suite(a.suite, dtype)
    shapes = list(dict.fromkeys(shapes))
    if a.limit:
        shapes = shapes[: a.limit]
    shapes = harness.shard_shapes(shapes, harness.parse_shard(a.shard))
    todo, n = [], 0
    for s in shapes:
        p = harness.shape_problem(spec, s)
        cands = harness.select_candidates(p, a.mode, a.seed, a.arch, op=a.op)
        if cands:
            todo.append((p, cands))
            n += len(cands)
    tasks = len(precompile.plan(todo))
    secs = n / MEASUREMENTS_PER_S + tasks / TASKS_PER_S.get(a.op, 30.0)
    return {"op": a.op, "problems": len(todo), "measurements": n, "tasks": tasks, "seconds": secs}


def campaign_lines(path: str) -> list[tuple[str, list[str]]]:
    """(name, bench args) of a campaign file's sweep lines (benchmarks/device_campaign.sh's format);
    its `!NAME COMMAND` lines run a shell command, not a sweep, and are left out."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()  # the driver's `read -r name args` and unquoted $args: plain words
            if not parts or parts[0].startswith(("#", "!")):
                continue
            out.append((parts[0], parts[1:]))
    return out


def estimate(path: str) -> list[dict]:
    return [{"name": name, **estimate_line(args)} for name, args in campaign_lines(path)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("picks", help="write a pick CSV of training configs sampled per compile key")
    p.add_argument("--op", required=True, choices=[o for o in registry.names("ranker")])
    p.add_argument("--dtype", required=True)
    p.add_argument("--suite", default="train")
    p.add_argument("--shard", default="0/1")
    p.add_argument("--per-problem", type=int, default=8)
    p.add_argument("--pool", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    e = sub.add_parser("estimate", help="problems, measurements and precompile tasks per line of a campaign file")
    e.add_argument("campaign")
    args = ap.parse_args(argv)
    if args.cmd == "picks":
        rows = keyed_picks(args.op, args.dtype, harness.parse_shard(args.shard), args.per_problem, args.pool,
                           args.seed, suite=args.suite)
        write_csv(rows, args.out)
        print(f"{args.out}: {len(rows)} rows, {len({k for k, _ in rows})} problems")
        return 0
    total = {"measurements": 0, "tasks": 0, "seconds": 0.0}
    for r in estimate(args.campaign):
        print(f"{r['name']}: {r['problems']} problems, {r['measurements']} measurements, {r['tasks']} precompile "
              f"tasks, ~{r['seconds'] / 60:.1f} min")
        for k in total:
            total[k] += r[k]
    print(f"total: {total['measurements']} measurements (~{total['measurements'] / MEASUREMENTS_PER_S / 60:.1f} min "
          f"at {MEASUREMENTS_PER_S:.0f}/s), {total['tasks']} precompile tasks, ~{total['seconds'] / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
