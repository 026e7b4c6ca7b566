"""Summary of benchmarks/explore/moe_unsure_check.py's rows: per dtype and stage, the geomean
slowdown (and worst, share within 2%) against the best candidate timed, of the shipped model's top 1
and of unsure mode with k = 2 and 4; and the timing's own round-to-round spread.

    python benchmarks/explore/moe_unsure_summary.py ROWS.jsonl
"""
import json
import sys

import numpy as np
import pandas as pd

rows = [json.loads(line) for line in open(sys.argv[1])]
c = pd.DataFrame([r for r in rows if r["kind"] == "candidate"])
layers = [r for r in rows if r["kind"] == "layer"]
out = []
for lay in layers:
    for st in ("gate_up", "down"):
        sub = c[(c.dtype == lay["dtype"]) & (c.family == lay["family"]) & (c.variant == lay["variant"]) & (c.stage == st)]
        t = sub.set_index("candidate")["p50_us"]
        best = t.min()
        rec = {"dtype": lay["dtype"], "stage": st, "layer": f"{lay['family']} {lay['variant']}",
               "model": t[lay["model_top"][st][0]] / best}
        for k, u in lay["unsure"].items():
            rec[f"unsure k={k}"] = t[u[st]] / best
        out.append(rec)
res = pd.DataFrame(out)
cols = [x for x in res.columns if x == "model" or x.startswith("unsure")]


def fmt(s):
    return f"{np.exp(np.log(s).mean()):.4f} (max {s.max():.3f}, {100 * (s <= 1.02).mean():.0f}% within 2%)"


print(f"{len(layers)} layers, {len(res)} stage shapes, {c.shape[0]} timed candidates; GPU {layers[0]['gpu']}")
print(res.groupby("dtype")[cols].agg(fmt).to_string())
print(res.groupby(["dtype", "stage"])[cols].agg(fmt).to_string())
print("all:", {k: fmt(res[k]) for k in cols})
spread = c["rounds_us"].apply(lambda v: max(v) / min(v))
print("round-to-round max/min of one candidate: p50 %.3f, p90 %.3f, max %.3f" % tuple(spread.quantile([.5, .9, 1.0])))
