"""The MoE GEMV's grid (issue 17), chosen on the training shapes only: a greedy cover of the 28
measured GEMV configs (the `moe-traingemv-*` shards: every config on the 1,160 training problems
with M <= 4). Each step adds the config that most lowers the geomean, over problems, of the best
kept config's time over the best GEMV's; a config a rule rules out for a problem counts as 10x.

    python benchmarks/explore/moe_gemv_grid.py [STEPS]
"""
import sys

import numpy as np
import pandas as pd

SHARDS = ("datasets/raw/moe-traingemv-h100-shard00of01.jsonl.gz", "datasets/raw/moe-traingemv-fp8-h100-shard00of01.jsonl.gz")
KEY = ["dtype", "m", "n", "k", "e", "top_k", "stage", "routing"]


def main(steps: int) -> None:
    df = pd.concat([pd.read_json(f, lines=True) for f in SHARDS])
    df = df[(df["status"] == "ok") & (df["variant"] == "gemv")]
    times = df.pivot_table(index=KEY, columns="candidate", values="p50_us")
    ratio = times.div(times.min(axis=1), axis=0).fillna(10.0)
    m1 = ratio.index.get_level_values("m") == 1
    kept: list[str] = []
    print(f"{len(ratio)} problems, {ratio.shape[1]} configs")
    print("step  config                 geomean  worst   M=1 geomean")
    for step in range(1, steps + 1):
        def score(c):
            return np.exp(np.log(ratio[kept + [c]].min(axis=1)).mean())
        kept.append(min((c for c in ratio.columns if c not in kept), key=score))
        best = ratio[kept].min(axis=1)
        print(f"{step:4d}  {kept[-1]:22s} {np.exp(np.log(best).mean()):.4f}  {best.max():.3f}  "
              f"{np.exp(np.log(best[m1]).mean()):.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 14)
