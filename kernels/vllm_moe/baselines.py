"""Baselines of the op ``vllm_moe`` for the held-out evaluation (pandas; imported lazily by the
registry's ``baselines`` entry, never on the serving path). Both are what vLLM 0.33.0 runs as
shipped, now in vLLM's own kernel (the issue's "(i)"):

- ``vllm_default``: vLLM's ``get_default_config`` for (M, E, dtype) (``space.vllm_default``; in the space);
- ``vllm_tuned``: where vLLM ships a tuned file for the GPU, (E, N) and dtype, the entry of the nearest M
  key (vLLM's lookup), else vLLM's default. The files are read from COSTMODEL_VLLM_FUSED_MOE_CONFIGS
  (default: the repository's copy, ``datasets/vllm/0.33.0/fused_moe_configs/``); bf16 and fp16 read
  files without a dtype part, fp8 ``dtype=fp8_w8a8``, fp8bs ``dtype=fp8_w8a8,block_shape=[128,128]``.
  A tuned entry outside the space (five of vLLM's H200 block-fp8 entries have BLOCK_SIZE_M 8) keeps its
  id; the evaluation then ranks the fallback's pick (vLLM's default) for it.
"""
from __future__ import annotations

import json
import os
import re

from . import space

ENV_VLLM_DIR = "COSTMODEL_VLLM_FUSED_MOE_CONFIGS"
_DTYPE_PARTS = {"bf16": (None, None), "fp16": (None, None), "fp8": ("fp8_w8a8", None),
                space.BLOCK_DTYPE: ("fp8_w8a8", f"{space.BLOCK_SHAPE[0]},{space.BLOCK_SHAPE[1]}")}


def default_vllm_dir() -> str:
    from ..vllm import tables

    return tables.tables_dir(tables.KIND_MOE)


def load_vllm_tables(folder: str | None = None, gpu_name: str = "NVIDIA H200", dtype: str = "bf16") -> dict:
    """{(E, N): {M: VllmMoeConfig}} of vLLM's fused-MoE files for one GPU and dtype ({} when the folder is
    missing or vLLM has no files for the dtype)."""
    from ..vllm.names import moe_device_name

    if dtype not in _DTYPE_PARTS:
        return {}
    folder = folder or os.environ.get(ENV_VLLM_DIR) or default_vllm_dir()
    if not os.path.isdir(folder):
        return {}
    rx = re.compile(space.VLLM_FILE_NAME_RE)
    want_tag, want_block = _DTYPE_PARTS[dtype]
    out = {}
    for name in sorted(os.listdir(folder)):
        mt = rx.match(name)
        block = mt and (mt.group("block") or "").replace(" ", "") or None
        if not mt or mt.group("device") != moe_device_name(gpu_name) or mt.group("dtype") != want_tag \
                or block != want_block:
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            body = json.load(fh)
        table = {int(m): space.from_vllm(entry, dtype) for m, entry in body.items() if str(m).isdigit()}
        if table:
            out[(int(mt.group("e")), int(mt.group("n")))] = table
    return out


def vllm_pick(tables: dict, m: int, e: int, n: int, dtype: str) -> tuple[space.VllmMoeConfig, str]:
    """(config, 'tuned' or 'default') that vLLM runs for M tokens on the layer (E, N)."""
    table = tables.get((int(e), int(n)))
    if not table:
        return space.vllm_default(m, e, dtype), "default"
    return table[min(table, key=lambda x: abs(x - m))], "tuned"


def picks(ev, train_ev) -> dict:
    """{method: pandas Series, shape id -> candidate id} for the evaluation rows ``ev`` (``train_ev``
    unused: vLLM's picks are fitted on nothing of ours)."""
    import pandas as pd

    first = ev.drop_duplicates("sid").set_index("sid")
    tables = {}
    default, tuned = {}, {}
    for sid, r in first.iterrows():
        gpu, dtype, m, e, n = str(r["gpu_name"]), str(r["dtype"]), int(r["m"]), int(r["e"]), int(r["n"])
        if (gpu, dtype) not in tables:
            tables[(gpu, dtype)] = load_vllm_tables(gpu_name=gpu, dtype=dtype)
        default[sid] = space.vllm_default(m, e, dtype).id
        tuned[sid] = vllm_pick(tables[(gpu, dtype)], m, e, n, dtype)[0].id
    out = {"vllm_default": pd.Series(default)}
    if any(tables.values()):
        out["vllm_tuned"] = pd.Series(tuned)
    return out
