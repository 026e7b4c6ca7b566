"""Per card x dtype x stage x routing figures of a MoE held-out results CSV (issue 58's MoE bar).

Reads a ``results_family.csv`` (``costmodel evaluate --op moe --report DIR``: one row per held-out
shape and method) and prints, for one method (default ``model``), per (card, dtype, stage, routing):
shapes, geomean slowdown, share within 2% of the oracle, max; routing is ``balanced`` or ``skewed``
(every other routing id). Rows with stage ``all`` / routing ``all`` pool the others. ``--vs CSV``
adds the geomean difference against a second results file (e.g. the shipped report's).

    python benchmarks/explore/moe_stage_table.py models/report/moe/results_family.csv
    python benchmarks/explore/moe_stage_table.py DIR/results_family.csv --vs models/report/moe/results_family.csv
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd


def table(path: str, method: str = "model") -> pd.DataFrame:
    df = pd.read_csv(path)
    df = df[df["method"] == method].copy()
    df["routing"] = np.where(df["routing"].astype(str) == "balanced", "balanced", "skewed")
    df["card"] = df["gpu_name"].astype(str).str.replace("NVIDIA ", "", regex=False).str.replace(" 80GB HBM3", "",
                                                                                                regex=False)
    out = []
    for stage_all in (False, True):
        for routing_all in (False, True):
            keys = ["card", "dtype"] + ([] if stage_all else ["stage"]) + ([] if routing_all else ["routing"])
            for key, g in df.groupby(keys):
                rec = dict(zip(keys, key))
                rec.setdefault("stage", "all")
                rec.setdefault("routing", "all")
                s = g["slowdown"].to_numpy(float)
                rec.update(shapes=len(s), geomean=float(np.exp(np.log(s).mean())),
                           within_2pct=float((s <= 1.02).mean()), max=float(s.max()))
                out.append(rec)
    order = {"gate_up": 0, "down": 1, "all": 2, "balanced": 0, "skewed": 1}
    t = pd.DataFrame(out)
    return t.sort_values(["card", "dtype", "stage", "routing"],
                         key=lambda c: c.map(order) if c.name in ("stage", "routing") else c).reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--method", default="model")
    ap.add_argument("--vs", default=None, help="a second results CSV: adds the geomean difference (this - that)")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--out", default=None, help="also write the table (unrounded) to this CSV")
    args = ap.parse_args()
    t = table(args.csv, args.method)
    keys = ["card", "dtype", "stage", "routing"]
    if args.vs:
        v = table(args.vs, args.method)[keys + ["geomean"]].rename(columns={"geomean": "vs"})
        t = t.merge(v, on=keys, how="left")
        t["d_geomean"] = t["geomean"] - t["vs"]
        t = t.drop(columns="vs")
    if args.out:
        t.to_csv(args.out, index=False)
    fmt = {"geomean": "{:.4f}", "within_2pct": "{:.1%}", "max": "{:.3f}", "d_geomean": "{:+.4f}"}
    shown = t.copy()
    for c, f in fmt.items():
        if c in shown:
            shown[c] = shown[c].map(f.format)
    if args.markdown:
        print("| " + " | ".join(shown.columns) + " |")
        print("|" + "---|" * len(shown.columns))
        for _, r in shown.iterrows():
            print("| " + " | ".join(str(x) for x in r) + " |")
    else:
        print(shown.to_string(index=False))


if __name__ == "__main__":
    main()
