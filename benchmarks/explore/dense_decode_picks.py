"""Issue 63: H200 training rows for the dense op at M <= 4 on the training weights, picked where a
measurement is worth most (no GPU here; the device measures the CSV with ``--mode pick:CSV``).

The M = 1 default-suite shapes lost to Inductor because the H200 never measured their (training)
weights at M <= 4: the model ranked them from the H100's rows. Per training problem with M <= 4 not
measured on the H200 yet, the picks are
- the current model's top ``--top`` configs for the H200 (what the dispatcher would run),
- the H100's ``--h100`` best measured configs of the same problem (where the cards may disagree),
- ``--random`` GEMV configs drawn once per weight shape (the GEMV compiles per (N, K), so drawing
  per weight keeps the precompile at weights x configs, not problems x configs).
cuBLAS is measured by every sweep anyway.

    python -m benchmarks.explore.dense_decode_picks --out benchmarks/campaigns/dense-decode-train2-picks.csv
"""
from __future__ import annotations

import argparse
import csv
import glob
import random

import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.serving.runtime import Dispatcher


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="benchmarks/campaigns/dense-decode-m4-shapes.csv")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--h100", type=int, default=4)
    ap.add_argument("--random", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    spec = registry.get("gemm")
    only = {tuple(int(r[c]) for c in ("m", "n", "k")) for r in csv.DictReader(open(a.only))}
    rows = pd.concat([pd.read_parquet(p, columns=["m", "n", "k", "candidate", "variant", "status", "p50_us",
                                                   "gpu_name"])
                      for p in glob.glob(f"datasets/gemm/{a.dtype}/*.parquet")])
    rows = rows[(rows.m <= 4) & (rows.status == "ok")]
    h200_done = set(map(tuple, rows[rows.gpu_name == "NVIDIA H200"][["m", "n", "k"]].drop_duplicates().values))
    h100 = rows[rows.gpu_name.str.startswith("NVIDIA H100") & (rows.variant != "cublas")]
    best_h100 = {key: g.sort_values("p50_us").candidate.tolist()[: a.h100]
                 for key, g in h100.groupby(["m", "n", "k"])}
    eval_keys = set()
    for name in ("eval", "eval_core"):
        if name in spec.suites:
            eval_keys |= {(s.m, s.n, s.k) for s in spec.suite(name, a.dtype)}

    disp = Dispatcher(gpu_name="NVIDIA H200", op="gemm")
    vendor = set(spec.vendor_ids)
    gemv = [c for c in spec.configs("sm90", a.dtype, include_vendor=False) if c.variant == "gemv"]
    rng = random.Random(a.seed)
    per_weight: dict = {}
    out, problems = [], 0
    for s in spec.suite("train", a.dtype):
        key3 = (s.m, s.n, s.k)
        if key3 not in only or key3 in h200_done or key3 in eval_keys:
            continue
        ranked = disp.rank(s.m, s.n, s.k, a.dtype, count=a.top + len(vendor))
        cands = [c.candidate for c in ranked if c.candidate not in vendor][: a.top]
        cands += [c for c in best_h100.get(key3, []) if c not in cands]
        if gemv:
            w = per_weight.setdefault((s.n, s.k), [c.id for c in rng.sample(gemv, min(a.random, len(gemv)))])
            cands += [c for c in w if c not in cands]
        key = spec.problem_of({"m": s.m, "n": s.n, "k": s.k, "dtype": a.dtype}).key
        out += [(key, c) for c in cands]
        problems += 1
    with open(a.out, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["key", "candidate"])
        wr.writerows(out)
    print(f"{problems} problems, {len(out)} picks, {len(per_weight)} weights, "
          f"{len({(k.split(':')[1].split('x', 1)[1], c) for k, c in out})} (weight, config) compile pairs")


if __name__ == "__main__":
    main()
