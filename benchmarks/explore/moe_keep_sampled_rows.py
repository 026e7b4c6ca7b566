"""Exploration (kept as a record): should the model-guided MoE rows (M >= 16) replace their problems'
earlier random rows, as the loader's L2-policy rule makes them do, or sit beside them? (issue 17)

The loader drops every row of a problem that has rows under a superseding L2 policy
(``dataset.supersede_l2_policies``), a rule made for the decode rows whose first copies had read
their few experts hot from L2. The model-guided rows were timed with the current (expert-rotating)
copies, so the 2,100 problems per dtype with picks lost their 24-25 random rows. This runs the
shipped model's leave-one-family-out CV (``cv_variants.py``'s groups, model only, seed 0) with the
rule applied only to problems with M <= --max-m, so the random rows of larger problems stay.

    python benchmarks/explore/moe_keep_sampled_rows.py --out /tmp/keep.csv [--max-m 4]
"""
from __future__ import annotations

import argparse
import importlib.util
import os

from gemm_costmodel import registry
from gemm_costmodel.data import dataset as D
from gemm_costmodel.learning import evaluate, pipeline
from gemm_costmodel.learning.model import TrainConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-m", type=int, default=4)
    args = ap.parse_args()
    original = D.supersede_l2_policies

    def by_m(df):
        small = df["m"] <= args.max_m
        return D.pd.concat([original(df[small]), df[~small]])

    D.supersede_l2_policies = by_m
    cfg = TrainConfig(**registry.get("moe").train_defaults)
    df = pipeline.load_training_frame(op="moe")
    print(f"{len(df)} rows", flush=True)
    res, _ = evaluate.cross_validate(df, cfg, scheme="family", baselines=False, log=print)
    res.to_csv(args.out, index=False)
    spec = importlib.util.spec_from_file_location("cv_variants", os.path.join(os.path.dirname(__file__), "cv_variants.py"))
    cv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cv)
    print(cv.summary(res).to_string(index=False, float_format=lambda x: f"{x:.4f}"))


if __name__ == "__main__":
    main()
