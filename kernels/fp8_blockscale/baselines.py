"""Baselines of the fp8_blockscale op for the held-out evaluation (pandas; imported lazily
by the registry's ``baselines`` entry, never on the serving path).

- ``vllm_tuned``: what vLLM 0.33.0 runs. For an (N, K) with a tuned file for the GPU, the
  entry of the nearest M key (``min(keys, key=lambda x: abs(x - M))``, vLLM's lookup), run in
  our kernel (every entry is in our space); for any other (N, K), vLLM's default config.
  The files are read from COSTMODEL_VLLM_BLOCK_FP8_CONFIGS (default: the repository's copy of
  vLLM's tables, ``datasets/vllm/0.33.0/w8a8_block_fp8_configs/``); without them the baseline is
  left out, with a message.
- ``hand_heuristic``: a seed-002-style rule (AITER's a8w8 block-scale fallback): 7 arms on
  (M*N, K), each choosing one config from a small fixed set, fitted on the fold's training
  shapes only (``fit_arms``).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from . import space

ENV_VLLM_DIR = "COSTMODEL_VLLM_BLOCK_FP8_CONFIGS"


def default_vllm_dir() -> str:
    """vLLM 0.33.0's block-fp8 tables kept in the repository (datasets/vllm/0.33.0/w8a8_block_fp8_configs/)."""
    from ..vllm import tables

    return tables.tables_dir(tables.KIND_BLOCK_FP8)


def load_vllm_tables(folder: str | None = None, gpu_name: str = "NVIDIA H100 80GB HBM3") -> dict:
    """{(N, K): {M: config id}} of vLLM's tuned block-fp8 files for one GPU; {} when the folder
    is missing. A file whose entry is not in our space raises ValueError naming it."""
    # vLLM's block-fp8 device name (no H200 rule), as the exporter writes it (one definition of it).
    from ..vllm.names import file_device_name as device_name

    FILE_NAME_RE = re.compile(space.VLLM_FILE_NAME_RE)

    folder = folder or os.environ.get(ENV_VLLM_DIR) or default_vllm_dir()
    if not os.path.isdir(folder):
        return {}
    want = device_name(gpu_name)
    out = {}
    for name in sorted(os.listdir(folder)):
        mt = FILE_NAME_RE.match(name)
        if not mt or mt.group(3) != want:
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            body = json.load(fh)
        table = {}
        for m, entry in body.items():
            try:
                table[int(m)] = space.from_vllm(entry).id
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: M={m}: {exc}") from None
        out[(int(mt.group(1)), int(mt.group(2)))] = table
    return out


def vllm_pick(tables: dict, m: int, n: int, k: int) -> tuple[str, str]:
    """(config id, 'tuned' or 'default') that vLLM runs for (M, N, K)."""
    table = tables.get((n, k))
    if not table:
        return space.vllm_default().id, "default"
    key = min(table, key=lambda x: abs(x - m))
    return table[key], "tuned"


# -- the hand heuristic ---------------------------------------------------------------

# Seed 002's structure: small K apart (there K = 128; here the K groups of the layers that
# are not hidden-size projections), the rest split by M*N, 7 arms in all.
SMALL_K = 1024
ARMS_SMALL_K = 3
ARMS_LARGE_K = 4


@dataclass
class Arms:
    """Thresholds on log2(M*N) per K group and one config id per arm."""

    small_k_edges: list
    large_k_edges: list
    picks: dict  # (group, arm index) -> config id

    def arm(self, m: int, n: int, k: int) -> tuple[int, int]:
        group = 0 if k <= SMALL_K else 1
        edges = self.small_k_edges if group == 0 else self.large_k_edges
        return group, int(np.searchsorted(edges, math.log2(m * n), side="right"))

    def pick(self, m: int, n: int, k: int) -> str:
        return self.picks.get(self.arm(m, n, k), space.vllm_default().id)

    @property
    def kernels(self) -> list[str]:
        return sorted(set(self.picks.values()))


def fit_arms(train_ev) -> Arms:
    """Fit the arms on fully measured training shapes (a frame of eval rows with 'sid',
    m, n, k, candidate, p50_us): edges at quantiles of log2(M*N) in each K group, and per arm
    the Triton config with the least total log-slowdown over its shapes (a config missing on
    a shape counts as 10x there, as for best-static: the rule must run everywhere)."""
    t = train_ev[train_ev["variant"].astype(str) != "vendor"]
    shapes = t.drop_duplicates("sid")[["sid", "m", "n", "k"]]
    mn = np.log2(shapes["m"].to_numpy(dtype=np.float64) * shapes["n"].to_numpy(dtype=np.float64))
    small = shapes["k"].to_numpy() <= SMALL_K

    def edges(x, arms):
        if len(x) == 0:
            return []
        return list(np.unique(np.quantile(x, [i / arms for i in range(1, arms)])))

    arms = Arms(edges(mn[small], ARMS_SMALL_K), edges(mn[~small], ARMS_LARGE_K), {})
    arm_of = {sid: arms.arm(int(m), int(n), int(k)) for sid, m, n, k in shapes.itertuples(index=False)}
    best = t.groupby("sid")["p50_us"].transform("min")
    slow = np.log(t["p50_us"] / best)
    frame = t.assign(slow=slow, arm=t["sid"].map(arm_of))
    for arm, g in frame.groupby("arm"):
        piv = g.pivot_table(index="sid", columns="candidate", values="slow")
        arms.picks[arm] = str(piv.fillna(math.log(10.0)).sum().idxmin())
    return arms


def picks(ev, train_ev) -> dict:
    """{method: pandas Series, shape id -> candidate id} for the evaluation rows ``ev``: vLLM's
    tuned picks where its files were found, and the hand rule's arms fitted on ``train_ev`` (the
    fold's training evaluation rows)."""
    import pandas as pd

    out = {}
    first = ev.drop_duplicates("sid").set_index("sid")
    gpus = sorted(first["gpu_name"].astype(str).unique())
    tables = {g: load_vllm_tables(gpu_name=g) for g in gpus}
    if any(tables.values()):
        wanted = {sid: vllm_pick(tables[str(r["gpu_name"])], int(r["m"]), int(r["n"]), int(r["k"]))[0]
                  for sid, r in first.iterrows()}
        out["vllm_tuned"] = pd.Series(wanted)
    if len(train_ev):
        arms = fit_arms(train_ev)
        wanted = {sid: arms.pick(int(r["m"]), int(r["n"]), int(r["k"])) for sid, r in first.iterrows()}
        out["hand_heuristic"] = pd.Series(wanted)
    return out


# -- the report's op section ------------------------------------------------------------

def _gm(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def report_section(results) -> str:
    """Markdown: the model against vLLM's default and tuned configs on vLLM's own tuned (N, K)
    (held out: their family's fold), against the vendor where it runs, and the hand rule's arms."""
    import pandas as pd

    from gemm_costmodel.util import markdown_table

    L = ["## fp8 block-scale: against vLLM and the vendor\n"]
    piv = results.pivot_table(index="shape", columns="method", values="pick_us")
    # The model's best-ranked Triton config: vLLM runs only Triton kernels, so this compares the
    # two rankings of the same kernel, without the vendor's share of the win.
    tri = results[results["method"] == "model"].set_index("shape")["triton_pick_us"]
    meta = results.drop_duplicates("shape").set_index("shape")[["gpu_name", "m", "n", "k", "oracle_us", "cublas_us"]]
    rows = []
    for gpu, g in meta.groupby("gpu_name", observed=True):
        tables = load_vllm_tables(gpu_name=str(gpu))
        if not tables:
            L.append(f"vLLM's tuned files for {gpu} were not found ({ENV_VLLM_DIR}): no vLLM comparison.\n")
            continue
        sub = g[[(int(n), int(k)) in tables for n, k in zip(g["n"], g["k"])]]
        p = piv.loc[sub.index]
        for label, keep in (("all", np.ones(len(sub), bool)), ("M on vLLM's grid", None), ("M off the grid", None)):
            if keep is None:
                on = np.array([int(m) in tables[(int(n), int(k))] for m, n, k in zip(sub["m"], sub["n"], sub["k"])])
                keep = on if label.startswith("M on") else ~on
            q, s = p[keep], sub[keep]
            if not len(q):
                continue
            rows.append({"gpu": gpu, "shapes": label, "n": int(len(q)),
                         "model vs oracle": _gm(q["model"] / s["oracle_us"]),
                         "vLLM default vs oracle": _gm(q["default"] / s["oracle_us"]),
                         "vLLM tuned vs oracle": _gm(q["vllm_tuned"] / s["oracle_us"]),
                         "model speedup vs vLLM default": _gm(q["default"] / q["model"]),
                         "model speedup vs vLLM tuned": _gm(q["vllm_tuned"] / q["model"]),
                         "model's Triton pick vs vLLM tuned": _gm(q["vllm_tuned"] / tri.loc[q.index]),
                         "model slower than vLLM tuned by >2%": int((q["model"] > 1.02 * q["vllm_tuned"]).sum())})
    if rows:
        L.append("On the (N, K) of vLLM's tuned files for the GPU (each shape held out with its family; "
                 "vLLM's picks are its file's nearest-M entry, run in our kernel). Ratios are geomeans; "
                 "\"model's Triton pick\" is the model's best-ranked Triton config (speedup of it over "
                 "vLLM's tuned pick), i.e. without the vendor's share of the win. In the tables above, "
                 "`vllm_tuned` is vLLM's behaviour on every shape: its tuned file where one exists for "
                 "the (N, K), else its default config.\n")
        L.append(markdown_table(pd.DataFrame(rows).round(3)) + "\n")
    v = meta[meta["cublas_us"].notna()]
    if len(v):
        r = piv.loc[v.index, "model"] / v["cublas_us"]
        L.append(f"Against the vendor candidate (blockwise `torch._scaled_mm`), on the {len(v)} evaluation shapes "
                 f"where it runs (M % 4 == 0, K % 512 == 0): the model's pick is at geomean {_gm(r):.3f}x the "
                 f"vendor's time, worst {r.max():.3f}x, slower by more than 2% on {int((r > 1.02).sum())} shapes.\n")
        worst = r.sort_values().tail(5)
        L.append("Worst five (model pick / vendor): " + ", ".join(f"{s.split(':', 1)[1]} {x:.3f}" for s, x in
                                                                 worst.items()) + "\n")
    return "\n".join(L)
