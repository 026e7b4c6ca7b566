"""Issue 16's vendor rule (never more than 2% slower than torch._scaled_mm): what a vendor
margin would cost. Leave-one-family-out with the shipped hyperparameters; per shape, the vendor
wins unless the model's best Triton score beats the vendor's by more than DELTA (rank-score units).
Prints geomean / match / worst / shapes over the vendor by >2% for each DELTA.

    python benchmarks/explore/fp8bs_vendor_margin.py [--cache scores.parquet]
"""
import argparse
import os

import numpy as np
import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.learning.evaluate import cross_validate
from gemm_costmodel.learning.model import TrainConfig
from gemm_costmodel.learning.pipeline import load_training_frame

ap = argparse.ArgumentParser()
ap.add_argument("--cache", default="/tmp/fp8bs_scores.parquet")
ap.add_argument("--scheme", default="family")
args = ap.parse_args()
if os.path.exists(args.cache):
    rows = pd.read_parquet(args.cache)
else:
    df = load_training_frame(op="fp8_blockscale")
    # The op's defaults without their own margin: the sweep below adds each DELTA to raw scores.
    cfg = TrainConfig(**registry.get("fp8_blockscale").train_defaults, n_jobs=2).with_(vendor_margin=0.0)
    _, rows = cross_validate(df, cfg, scheme=args.scheme, baselines=False, log=print)
    rows.to_parquet(args.cache)
vendor = registry.get("fp8_blockscale").vendor_ids[0]
key = ["gpu_name", "dtype", "m", "n", "k"]
rows = rows.assign(is_vendor=rows["candidate"] == vendor)
have_vendor = rows.groupby(key)["is_vendor"].transform("any")
print(f"{rows.groupby(key).ngroups} shapes, {rows[have_vendor].groupby(key).ngroups} with a vendor row")
for delta in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0):
    s = rows["score"] - np.where(rows["is_vendor"], delta, 0.0)
    t = rows.assign(s=s).sort_values(key + ["s", "candidate"])
    g = t.groupby(key)
    pick = g.first()
    oracle = g["p50_us"].min()
    vend = t[t["is_vendor"]].groupby(key)["p50_us"].first()
    slow = pick["p50_us"] / oracle
    over = (pick["p50_us"] / vend.reindex(pick.index)) > 1.02
    worst_v = (pick["p50_us"] / vend.reindex(pick.index)).max()
    print(f"delta {delta:4.2f}: geomean {np.exp(np.log(slow).mean()):.4f}  match2% {(slow <= 1.02).mean():.3f}  "
          f"worst {slow.max():.3f}  vendor picks {int(pick['candidate'].eq(vendor).sum())}  "
          f">2% over vendor {int(over.sum())} (worst {worst_v:.3f})")
