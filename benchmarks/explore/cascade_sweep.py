"""Regret of cheaper cascades of the shipped dense model (issue 18: the cold decision's onnxruntime
time on the GPU host): for each (prefix trees, keep), the dispatcher's pick on every H100
evaluation shape with every candidate measured, against the whole model's pick and the oracle.

    python benchmarks/explore/cascade_sweep.py [--splits 20:16 10:8 ...]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile

import numpy as np
import pandas as pd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", nargs="+", default=["0:0", "20:16", "20:8", "15:12", "15:8", "10:16", "10:8"])
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
    args = ap.parse_args()
    from gemm_costmodel.learning.export import write_cascade
    from gemm_costmodel.serving.runtime import Dispatcher

    df = pd.concat(pd.read_parquet(f) for f in sorted(glob.glob("datasets/gemm/*/eval-*.parquet")))
    df = df[(df.gpu_name == args.gpu) & (df.status == "ok")]
    best = df.groupby(["m", "n", "k", "dtype"]).p50_us.min()
    t = df.set_index(["m", "n", "k", "dtype", "candidate"]).p50_us
    t = t[~t.index.duplicated()]
    shapes = list(best.index)
    print(f"{len(shapes)} evaluation shapes")
    picks = {}
    for spec in args.splits:
        p, keep = (int(v) for v in spec.split(":"))
        with tempfile.TemporaryDirectory() as tmp:
            for f in glob.glob("models/gemm-sm90*"):
                shutil.copy(f, tmp)
            onnx, man = os.path.join(tmp, "gemm-sm90.onnx"), os.path.join(tmp, "gemm-sm90.json")
            if p:
                write_cascade(onnx, man, prefix_trees=p, keep=keep)
            d = Dispatcher(gpu_name=args.gpu, models_dir=tmp)
            for dt in ("bf16", "fp16", "fp8"):
                mdl = d.model_for(dt)
                if not p and mdl is not None:
                    mdl.cascade = None
            picks[spec] = [d.select(m, n, k, dt).candidate for m, n, k, dt in shapes]
    whole = picks[args.splits[0]]
    for spec, pk in picks.items():
        r = np.array([t.get((*s, c), np.nan) / best[s] for s, c in zip(shapes, pk)])
        agree = sum(a == b for a, b in zip(pk, whole))
        print(f"{spec:>6}: agree {agree}/{len(shapes)}  geomean {np.exp(np.nanmean(np.log(r))):.4f}  "
              f"p99 {np.nanpercentile(r, 99):.3f}  worst {np.nanmax(r):.3f}  unmeasured {int(np.isnan(r).sum())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
