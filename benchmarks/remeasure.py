"""Noise floor: re-measure a random sample of committed (shape, candidate) pairs in a
fresh process (and a fresh machine start), with fresh random inputs. Writes one row per
pair with the original and the new p50 to --out/remeasure.jsonl.

    python -m gemm_costmodel.benchmarks.remeasure --data 'datasets/raw/*.jsonl.gz' --n 240 --out DIR
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import sys

import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import precompile, provenance
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.store import ResultStore
from gemm_costmodel.kernels.gemm.space import Problem, config_from_id


def read_any(path):
    """Rows of a JSONL file, gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="glob of shard files")
    ap.add_argument("--n", type=int, default=240)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [r for p in sorted(glob.glob(args.data)) for r in read_any(p) if r["status"] == "ok"]
    pick = random.Random(args.seed).sample(rows, min(args.n, len(rows)))
    by_shape = {}
    for r in pick:
        by_shape.setdefault((r["dtype"], r["m"], r["n"], r["k"]), []).append(r)
    plan = [(Problem(m, n, k, d), [config_from_id(r["candidate"]) for r in rs]) for (d, m, n, k), rs in by_shape.items()]
    precompile.precompile(plan, workers=14, log=lambda m: print(m, file=sys.stderr), op="gemm")
    prov = provenance.collect(torch.cuda.current_device())
    timer = timing.GraphTimer()
    os.makedirs(args.out, exist_ok=True)
    with ResultStore(os.path.join(args.out, "remeasure.jsonl")) as store:
        for (prob, cfgs), rs in zip(plan, by_shape.values()):
            gen = torch.Generator(device="cuda")
            gen.manual_seed(C.seed_for(prob, args.seed + 1000))  # fresh inputs, not the original ones
            first = C.make_operands(prob, "cuda", gen)
            n_copies = timing.copies_for(first.nbytes, prov["l2_bytes"])
            ops = [first] + [C.make_operands(prob, "cuda", gen) for _ in range(n_copies - 1)]
            ref = C.reference(first)
            for cfg, r in zip(cfgs, rs):
                st, err, detail = C.gate(cfg, first, ref, prob.dtype)
                out = {k: r[k] for k in ("dtype", "m", "n", "k", "candidate", "variant", "p50_us", "gpu_uuid",
                                         "timestamp", "stable")}
                out = {("orig_" + k if k in ("p50_us", "gpu_uuid", "timestamp", "stable") else k): v
                       for k, v in out.items()}
                out.update(status=st, error=detail, **{k: prov[k] for k in ("gpu_name", "gpu_uuid", "driver", "git_sha")})
                if st == "ok":
                    t = timer.measure(lambda i, c=cfg: ops[i].run(c), n_copies)
                    out.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable)
                out["timestamp"] = provenance.now()
                store.append(out)
            del ops, first, ref
    print(f"remeasured {len(pick)} pairs over {len(plan)} shapes", file=sys.stderr)


if __name__ == "__main__":
    main()
