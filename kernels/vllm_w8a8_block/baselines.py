"""Baselines of the op ``vllm_w8a8_block`` for the held-out evaluation (pandas; imported lazily by the
registry's ``baselines`` entry, never on the serving path): what vLLM 0.33.0 runs as shipped, in vLLM's
own kernel (the issue's "(i)").

- ``vllm_tuned``: for an (N, K) with a tuned file for the GPU, the entry of the nearest M key (vLLM's
  lookup), else vLLM's default (the evaluation's ``default`` method: vLLM's default at every M). The
  files are the fp8_blockscale op's (COSTMODEL_VLLM_BLOCK_FP8_CONFIGS, default the repository's copy of
  vLLM's tables); every entry of vLLM's H100 and H200 files is in this space.
"""
from __future__ import annotations

from ..fp8_blockscale import baselines as FB
from . import space


def picks(ev, train_ev) -> dict:
    """{method: pandas Series, shape id -> candidate id} for the evaluation rows ``ev``."""
    import pandas as pd

    first = ev.drop_duplicates("sid").set_index("sid")
    tables = {g: FB.load_vllm_tables(gpu_name=g) for g in sorted(first["gpu_name"].astype(str).unique())}
    if not any(tables.values()):
        return {}
    wanted = {}
    for sid, r in first.iterrows():
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        cid = FB.vllm_pick(tables[str(r["gpu_name"])], m, n, k)[0]
        wanted[sid] = space.from_vllm(FB.space.to_vllm(FB.space.config_from_id(cid))).id
    return {"vllm_tuned": pd.Series(wanted)}
