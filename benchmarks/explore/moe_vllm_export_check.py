"""Check exported vLLM MoE files (issue 17): vLLM's naming and keys, and that every config in them
ran `ok` in our kernel on both stages of the layer the file was made for, in the committed
evaluation sweep (every candidate measured there).

    python benchmarks/explore/moe_vllm_export_check.py DIR > DIR/check.txt
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

import pandas as pd

VLLM_KEYS = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=([A-Za-z0-9_]+)(,dtype=fp8_w8a8)?\.json$")


def main(folder: str) -> int:
    from gemm_costmodel.kernels.moe import space

    prov = json.load(open(os.path.join(folder, "costmodel-export-vllm.provenance.json"), encoding="utf-8"))
    df = pd.concat(pd.read_parquet(f, columns=["m", "n", "k", "e", "top_k", "stage", "dtype", "candidate", "status"])
                   for f in glob.glob("datasets/moe/*/moe-eval*.parquet"))
    for name, meta in sorted(prov["files"].items()):
        m = NAME.match(name)
        assert m, f"{name}: not vLLM's file name"
        cfgs = json.load(open(os.path.join(folder, name), encoding="utf-8"))
        assert all(set(v) == VLLM_KEYS for v in cfgs.values()), f"{name}: keys other than vLLM's"
        ids = {space.from_vllm(v).id for v in cfgs.values()}
        e, n, hidden, top_k = meta["e"], meta["n"], meta["hidden"], meta["top_k"]
        # The layer's two stages: gate_up (N = 2I, K = hidden), down (N = hidden, K = I).
        layer = df[(df.dtype == meta["dtype"]) & (df.e == e) & (df.top_k == top_k) & (((df.stage == "gate_up") & (df.n == 2 * n) & (df.k == hidden))
                                                        | ((df.stage == "down") & (df.n == hidden) & (df.k == n)))]
        ok = layer[layer.status == "ok"]
        both = {c for c in ids if set(ok[ok.candidate == c].stage) == {"gate_up", "down"}}
        print(f"{name} keys {sorted(cfgs, key=int)[:3]} ... {len(cfgs)} | distinct configs {len(ids)} | "
              f"measured ok in our kernel on this layer (both stages): {len(both)} | ok rows on this layer: {len(ok)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
