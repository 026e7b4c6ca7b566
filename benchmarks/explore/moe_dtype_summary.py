"""Per-dtype acceptance numbers of the MoE report (issue 17), from a report's results_family.csv:
the report's vLLM section pools bf16 and fp8; this runs the same comparison on each dtype alone.

    python benchmarks/explore/moe_dtype_summary.py models/report/moe/results_family.csv
"""
import sys

import pandas as pd

from gemm_costmodel.kernels.moe import baselines

COLS = ["model vs oracle", "model worst vs oracle", "model speedup vs vLLM default", "model speedup vs vLLM tuned",
        "tuned n"]
res = pd.read_csv(sys.argv[1])
for dt in sorted(res["dtype"].unique()):
    c = baselines.comparison(res[res["dtype"] == dt])
    for level in ("stage", "layer"):
        t = pd.DataFrame(c[level])
        t = t[t["shapes"].isin(["held-out families", "held-out, balanced", "held-out, skewed",
                                "training families (vLLM-tuned E, N)"])]
        print(f"## {dt} per {level}")
        print(t[["shapes", "n"] + [x for x in COLS if x in t]].to_string(index=False))
