"""Exploration (kept as a record): leave-one-family-out CV of an op's model with TrainConfig
overrides, model only (no baselines); MoE is summarised per dtype on issue 17's acceptance
groups, other ops per M bucket (issue 16's match rate).

    python benchmarks/explore/cv_variants.py --set decode_weight=4 --out /tmp/dw4.csv
    python benchmarks/explore/cv_variants.py --op fp8_blockscale --set decode_weight=4 --out /tmp/f.csv
    python benchmarks/explore/cv_variants.py --op moe --gpus "NVIDIA H100 80GB HBM3" --out /tmp/h100.csv
    python benchmarks/explore/cv_variants.py --op gemm --exclude-variant gemv --set seed=1 --out /tmp/g.csv
    python benchmarks/explore/cv_variants.py --op fp8_blockscale --exclude-file fp8bs-redo3 --out /tmp/f.csv

Each --set is key=value on top of the op's registry train_defaults (the shipped model's
hyperparameters); values are parsed as int, then float, then kept as strings.
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.kernels.moe.baselines import _routing_class
from gemm_costmodel.kernels.moe.suites import HELDOUT_FAMILIES
from gemm_costmodel.learning import evaluate, pipeline
from gemm_costmodel.learning.model import TrainConfig


def _value(s: str):
    for t in (int, float):
        try:
            return t(s)
        except ValueError:
            pass
    return s


def summary(res: pd.DataFrame) -> pd.DataFrame:
    """Per dtype: geomean / worst slowdown of the model per acceptance group, and at M = 1."""
    m = res[res["method"] == "model"].copy()
    m["held"] = m["family"].astype(str).isin(HELDOUT_FAMILIES)
    m["rc"] = _routing_class(m["routing"])
    rows = []
    for dt, g in m.groupby("dtype"):
        for name, sel in (("held balanced", g["held"] & (g["rc"] == "balanced")),
                          ("held skewed", g["held"] & (g["rc"] == "skewed")),
                          ("vllm-tuned train fam", ~g["held"]), ("M=1 all", g["m"] == 1),
                          ("M>1 all", g["m"] > 1)):
            s = g.loc[sel, "slowdown"]
            rows.append({"dtype": dt, "group": name, "n": len(s), "geomean": float(np.exp(np.log(s).mean())),
                         "worst": float(s.max()), "within2%": float((s <= 1.02).mean())})
    return pd.DataFrame(rows)


def summary_m(res: pd.DataFrame) -> pd.DataFrame:
    """Geomean / worst / match within 2% of the model, all shapes and per M."""
    m = res[res["method"] == "model"]
    rows = []
    for name, g in [("all", m), *((f"M={v}", g) for v, g in m.groupby("m"))]:
        s = g["slowdown"]
        rows.append({"group": name, "n": len(s), "geomean": float(np.exp(np.log(s).mean())),
                     "worst": float(s.max()), "within2%": float((s <= 1.02).mean())})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="moe")
    ap.add_argument("--set", action="append", default=[], help="TrainConfig field=value")
    ap.add_argument("--out", required=True, help="per-shape results CSV")
    ap.add_argument("--gpus", nargs="+", default=None, help="only rows of these GPU names (default: all)")
    ap.add_argument("--exclude-variant", nargs="+", default=[],
                    help="drop these variants' rows, i.e. the space before they joined it (e.g. gemv)")
    ap.add_argument("--exclude-file", nargs="+", default=[],
                    help="leave out the dataset files whose path contains any of these strings (the data "
                         "before a sweep joined it)")
    args = ap.parse_args()
    over = dict(kv.split("=", 1) for kv in args.set)
    cfg = TrainConfig(**{**registry.get(args.op).train_defaults, **{k: _value(v) for k, v in over.items()}})
    print(cfg, flush=True)
    paths = None
    if args.exclude_file:
        import glob

        paths = [p for p in sorted(glob.glob(f"datasets/{args.op}/**/*.parquet", recursive=True))
                 if not any(x in p for x in args.exclude_file)]
    df = pipeline.load_training_frame(paths, op=args.op, gpus=args.gpus)
    if args.exclude_variant:
        df = df[~df["variant"].astype(str).isin(args.exclude_variant)]
    res, _ = evaluate.cross_validate(df, cfg, scheme="family", baselines=False, log=print)
    res.to_csv(args.out, index=False)
    print((summary(res) if args.op == "moe" else summary_m(res)).to_string(index=False, float_format=lambda x: f"{x:.4f}"))


def main_with_features(op: str, features: str, extra_features) -> None:
    """main() for ``op`` with its own feature module replaced by ``features`` (an importable module
    name, e.g. an exploration script beside this one) whose NAMES are ``extra_features``: the entry
    point of the feature-module explorations. The arguments are main()'s, with --op fixed."""
    import dataclasses
    import sys

    registry.REGISTRY[op] = dataclasses.replace(registry.REGISTRY[op], features=features,
                                                extra_features=tuple(extra_features))
    sys.argv = [sys.argv[0], "--op", op, *sys.argv[1:]]
    main()


if __name__ == "__main__":
    main()
