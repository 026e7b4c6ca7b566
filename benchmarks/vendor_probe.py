"""What cuBLAS runs, per shape: cuBLASLt's heuristic pick and the kernels torch launches.

For every (dtype, M, N, K) of a CSV (columns dtype, m, n, k), writes one JSON line:
cuBLASLt's top algorithms (``gemm_costmodel.cublaslt.heuristic``) at torch's
32 MiB workspace and at 1 MiB, how long the host query took, and, while the
``--profile-seconds`` budget lasts, the names of the CUDA kernels that the vendor
candidate (``torch.mm`` / ``torch._scaled_mm``) launches, from torch.profiler.
The kernel names say which tile and split-K cuBLAS really ran, so they check how
well the heuristic (a host call a runtime could make) predicts it. Also writes
``cublaslt.csv``, cuBLAS's kernel per shape as numbers (tile along M and N,
split-K, CTAs per cluster, waves). Tried as cost-model features and rejected:
see docs/decisions/.

    python -m gemm_costmodel.benchmarks.vendor_probe --shapes SHAPES.csv --out OUT
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import time

import torch

from gemm_costmodel.benchmarks import cublaslt
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import provenance
from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig


def read_shapes(path: str) -> list[tuple[str, int, int, int]]:
    """(dtype, m, n, k) rows of a CSV, in file order, without duplicates."""
    with open(path, newline="") as f:
        rows = [(r["dtype"], int(r["m"]), int(r["n"]), int(r["k"])) for r in csv.DictReader(f)]
    return list(dict.fromkeys(rows))


def kernel_names(problem: Problem) -> list[str]:
    """CUDA kernels one vendor call launches for the problem (after one warm-up call)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(C.seed_for(problem, 0))
    ops = C.make_operands(problem, "cuda", gen)
    ops.run(VendorConfig())
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ops.run(VendorConfig())
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    del ops
    return names


TABLE_COLUMNS = ("arch", "probe_gpu", "dtype", "m", "n", "k", "vendor_tile_m", "vendor_tile_n", "vendor_split_k",
                 "vendor_cluster", "vendor_waves", "cublaslt_version", "torch_version")


def table_rows(probe_rows) -> list[dict]:
    """Rows of the vendor-choice table from probe lines; shapes without a pick are left out."""
    out = []
    for r in probe_rows:
        if not r.get("heuristic"):
            continue
        c = cublaslt.decode(r["heuristic"][0])
        cols = {"vendor_tile_m": c["tile_m"], "vendor_tile_n": c["tile_n"], "vendor_split_k": c["splitk"],
                "vendor_cluster": c["cluster_m"] * c["cluster_n"], "vendor_waves": c["waves"]}
        out.append({"arch": r["arch"], "probe_gpu": r["gpu_name"], "dtype": r["dtype"], "m": r["m"], "n": r["n"],
                    "k": r["k"], **cols, "cublaslt_version": r["cublaslt_version"],
                    "torch_version": r["torch_version"]})
    return out


def write_table(rows, path: str) -> None:
    """The vendor-choice table as CSV."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r[c] for c in TABLE_COLUMNS})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="CSV with columns dtype, m, n, k")
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=4, help="heuristic results kept per shape")
    ap.add_argument("--profile-seconds", type=float, default=240.0,
                    help="time budget for profiling kernel names (shapes in a seeded random order)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shapes = read_shapes(args.shapes)
    prov = provenance.collect(torch.cuda.current_device())
    prov["cublaslt_version"] = cublaslt.version()
    rows = {}
    t0 = time.perf_counter()
    for dtype, m, n, k in shapes:
        t = time.perf_counter()
        top = cublaslt.heuristic(m, n, k, dtype, args.count)
        us = (time.perf_counter() - t) * 1e6
        small = cublaslt.heuristic(m, n, k, dtype, 1, workspace=1 << 20)
        rows[(dtype, m, n, k)] = {"dtype": dtype, "m": m, "n": n, "k": k, "heuristic": top,
                                  "heuristic_ws1m": small[0] if small else None, "query_us": us}
    print(f"heuristic: {len(shapes)} shapes in {time.perf_counter() - t0:.1f}s", flush=True)
    order = list(rows)
    random.Random(0).shuffle(order)
    t0 = time.perf_counter()
    done = 0
    for key in order:
        if time.perf_counter() - t0 > args.profile_seconds:
            break
        dtype, m, n, k = key
        try:
            rows[key]["kernels"] = kernel_names(Problem(m, n, k, dtype))
        except (RuntimeError, ValueError) as e:  # e.g. fp8 shapes _scaled_mm refuses
            rows[key]["kernels_error"] = str(e).splitlines()[0][:200]
        done += 1
        if done % 200 == 0:
            print(f"profiled {done}/{len(order)} ({time.perf_counter() - t0:.0f}s)", flush=True)
    print(f"profiled {done}/{len(order)} shapes in {time.perf_counter() - t0:.0f}s", flush=True)
    lines = [{**r, **prov} for r in rows.values()]
    with open(os.path.join(args.out, "vendor_probe.jsonl"), "w") as f:
        for r in lines:
            f.write(json.dumps(r) + "\n")
    write_table(table_rows(lines), os.path.join(args.out, "cublaslt.csv"))


if __name__ == "__main__":
    main()
