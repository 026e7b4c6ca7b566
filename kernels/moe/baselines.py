"""Baselines of the fused-MoE op ``moe`` for the held-out evaluation (pandas; imported lazily by the
registry's ``baselines`` entry, never on the serving path).

Both are what vLLM 0.33.0 runs, in our kernel; vLLM runs ONE config per M for both GEMMs of the
layer, so its picks for the gate_up and the down stage of a layer are the same config:

- ``vllm_default``: vLLM's ``get_default_config`` for (M, E) (``space.vllm_default``; always in
  our space).
- ``vllm_tuned``: for a shape whose (E, N = I, dtype) has a tuned file for the GPU (I = n / 2 for
  gate_up, I = k for down), the entry of the nearest M key (vLLM's lookup,
  ``min(keys, key=lambda x: abs(x - M))``); else vLLM's default. The files are read from
  COSTMODEL_VLLM_FUSED_MOE_CONFIGS (default: the repository's copy of vLLM's tables,
  ``datasets/vllm/0.33.0/fused_moe_configs/``), bf16 = no dtype part (vLLM's name for bf16 and fp16), fp8 =
  ``dtype=fp8_w8a8`` without a block shape; without them the baseline is left out.

Not comparable: a tuned pick outside our space (five configs of vLLM's H100 bf16 files exceed our
shared-memory rule; in the files vLLM reads for bf16 only E=128,N=2880 at M key 512 uses one), or
one without an ok row on the shape. ``_pick_score`` then ranks the heuristic's pick (the config
nearest vLLM's default) first, so in the generic metric tables ``vllm_tuned`` is vLLM's default on
those shapes; ``report_section`` leaves them out of every vLLM-tuned comparison and counts them
(``vllm_picks`` says which and why).
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from . import space

ENV_VLLM_DIR = "COSTMODEL_VLLM_FUSED_MOE_CONFIGS"
DEFAULT_GPU = "NVIDIA H100 80GB HBM3"
SHAPE_KEY = ("gpu_name", "dtype", "m", "n", "k", "e", "top_k", "stage", "routing")
LAYER_KEY = ("gpu_name", "dtype", "m", "e", "top_k", "routing", "inter", "hidden")
# The per-shape methods of the report (those present in the results).
REPORT_METHODS = ("model", "oracle", "vllm_default", "vllm_tuned")


def default_vllm_dir() -> str:
    """vLLM 0.33.0's fused-MoE tables kept in the repository (datasets/vllm/0.33.0/fused_moe_configs/)."""
    from ..vllm import tables

    return tables.tables_dir(tables.KIND_MOE)


def vllm_dtype_tag(dtype: str) -> str | None:
    """vLLM's dtype part of the file name (None: no dtype part) for our dtype."""
    tags = {"bf16": None, "fp16": None, "fp8": "fp8_w8a8"}
    if dtype not in tags:
        raise ValueError(f"vLLM has no fused-MoE config files for dtype {dtype!r} (known: {', '.join(tags)})")
    return tags[dtype]


def _default_dtype(dtype: str) -> str:
    return "fp8" if dtype == "fp8" else "bf16"


def intermediate(stage: str, n: int, k: int) -> int:
    """vLLM's N (the per-shard intermediate size I) of a stage's (n, k)."""
    if stage == "gate_up":
        return int(n) // 2
    if stage == "down":
        return int(k)
    raise ValueError(f"stage must be gate_up or down, got {stage!r}")


def load_vllm_tables(folder: str | None = None, gpu_name: str = DEFAULT_GPU, dtype: str = "bf16") -> dict:
    """{(E, N): {M: MoeTiledConfig}} of vLLM's fused-MoE files for one GPU and dtype (M keys in
    file order; non-numeric keys such as 'triton_version' skipped); {} when the folder is missing.
    A malformed entry raises ValueError naming the file and M."""
    # vLLM's fused-MoE device name (its H200 rule), as the exporter writes it (one definition of it).
    from ..vllm.names import moe_device_name as device_name

    MOE_FILE_NAME_RE = re.compile(space.VLLM_FILE_NAME_RE)

    folder = folder or os.environ.get(ENV_VLLM_DIR) or default_vllm_dir()
    if not os.path.isdir(folder):
        return {}
    want_dev, want_tag = device_name(gpu_name), vllm_dtype_tag(dtype)
    out = {}
    for name in sorted(os.listdir(folder)):
        mt = MOE_FILE_NAME_RE.match(name)
        if not mt or mt.group("device") != want_dev or mt.group("dtype") != want_tag or mt.group("block"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            body = json.load(fh)
        table = {}
        for m, entry in body.items():
            if not str(m).isdigit():
                continue
            try:
                table[int(m)] = space.from_vllm(entry)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: M={m}: {exc}") from None
        if table:
            out[(int(mt.group("e")), int(mt.group("n")))] = table
    return out


def vllm_pick(tables: dict, m: int, e: int, inter: int, dtype: str = "bf16") -> tuple[space.MoeTiledConfig, str]:
    """(config, 'tuned' or 'default') that vLLM runs for M tokens on E experts of intermediate I."""
    table = tables.get((int(e), int(inter)))
    if not table:
        return space.vllm_default(int(m), int(e), _default_dtype(dtype)), "default"
    return table[min(table, key=lambda x: abs(x - m))], "tuned"


def arch_of(gpu_name: str) -> str:
    from .. import hardware

    spec = hardware.lookup(str(gpu_name))
    return spec.arch if spec is not None else "unknown"


def in_space(cfg, dtype: str, arch: str) -> bool:
    """Whether a tiled config is one of our candidates for (arch, dtype)."""
    if arch not in space.ARCHS:
        return False
    return cfg in set(space.generate_configs(arch, dtype, include_vendor=False))


def vllm_picks(frame, folder: str | None = None):
    """Per shape (one row per distinct SHAPE_KEY of frame): vLLM's default and its tuned pick
    (``tuned_source`` 'tuned' or 'default'), and whether the tuned pick is in our space
    (``tuned_in_space``). Columns: SHAPE_KEY, inter, default_id, tuned_id, tuned_source, tuned_in_space."""
    import pandas as pd

    shapes = frame.drop_duplicates(list(SHAPE_KEY))[list(SHAPE_KEY)].reset_index(drop=True)
    tables, spaces, rows = {}, {}, []
    for r in shapes.itertuples(index=False):
        gpu, dtype = str(r.gpu_name), str(r.dtype)
        if (gpu, dtype) not in tables:
            tables[(gpu, dtype)] = _tables(folder, gpu, dtype)
            arch = arch_of(gpu)
            spaces[(gpu, dtype)] = (set(space.generate_configs(arch, dtype, include_vendor=False))
                                    if arch in space.ARCHS else set())
        inter = intermediate(str(r.stage), int(r.n), int(r.k))
        cfg, source = vllm_pick(tables[(gpu, dtype)], int(r.m), int(r.e), inter, dtype)
        rows.append({"inter": inter, "default_id": space.vllm_default(int(r.m), int(r.e), _default_dtype(dtype)).id,
                     "tuned_id": cfg.id, "tuned_source": source, "tuned_in_space": cfg in spaces[(gpu, dtype)]})
    return pd.concat([shapes, pd.DataFrame(rows, index=shapes.index)], axis=1)


def _tables(folder, gpu: str, dtype: str) -> dict:
    """load_vllm_tables, or {} for a dtype vLLM has no fused-MoE files for (fp32)."""
    return load_vllm_tables(folder, gpu, dtype) if dtype in ("bf16", "fp16", "fp8") else {}


def has_tables(frame, folder: str | None = None) -> bool:
    """Whether vLLM's files exist for any (GPU, dtype) of the frame."""
    pairs = frame[["gpu_name", "dtype"]].astype(str).drop_duplicates().itertuples(index=False)
    return any(_tables(folder, gpu, dtype) for gpu, dtype in pairs)


def picks(ev, train_ev) -> dict:
    """{method: pandas Series, shape id -> candidate id} for the evaluation rows ``ev``:
    vllm_default, and vllm_tuned where vLLM's files for the GPU were found (``train_ev`` unused:
    vLLM's picks are fitted on nothing of ours)."""
    import pandas as pd

    first = ev.drop_duplicates("sid").set_index("sid")
    vp = vllm_picks(first)
    key = pd.MultiIndex.from_frame(first[list(SHAPE_KEY)].astype(str))
    pk = vp.set_index(pd.MultiIndex.from_frame(vp[list(SHAPE_KEY)].astype(str)))
    out = {"vllm_default": pd.Series(pk.loc[key, "default_id"].to_numpy(), index=first.index)}
    if has_tables(first):
        out["vllm_tuned"] = pd.Series(pk.loc[key, "tuned_id"].to_numpy(), index=first.index)
    return out


# -- layers ----------------------------------------------------------------------------------

def _shape_frame(results):
    """One row per shape of the per-shape results, with pick_us and pick per method (columns
    '<method>_us', '<method>_pick'), plus inter and hidden."""
    keys = list(SHAPE_KEY)
    base = results.drop_duplicates(keys)[keys + [c for c in ("family", "oracle_us") if c in results.columns]]
    base = base.set_index(keys)
    for method in REPORT_METHODS:
        r = results[results["method"] == method]
        if len(r):
            r = r.drop_duplicates(keys).set_index(keys)
            base[f"{method}_us"] = r["pick_us"].reindex(base.index)
            base[f"{method}_pick"] = r["pick"].reindex(base.index)
    if "oracle_us" in results.columns:  # the shape's oracle, whether or not 'oracle' is a method here
        base["oracle_us"] = results.drop_duplicates(keys).set_index(keys)["oracle_us"].reindex(base.index)
    out = base.reset_index()
    out["inter"] = [intermediate(s, n, k) for s, n, k in zip(out["stage"], out["n"], out["k"])]
    out["hidden"] = np.where(out["stage"] == "gate_up", out["k"], out["n"]).astype(int)
    return out


def layer_table(results, ev=None):
    """Per layer (LAYER_KEY: a gate_up and a down shape at the same M, E, top_k, routing, I and
    hidden) the whole-layer time = gate_up time + down time of each method in the per-shape
    results (model, oracle, vllm_default, vllm_tuned: columns '<method>_us', and the two picks
    '<method>_gate_up', '<method>_down'). vLLM runs one config for both stages, so its two picks
    are one config; the model and the oracle may pick two (``model_one_config`` says whether the
    model did). With ``ev`` (the evaluation rows, every candidate), ``oracle_one_config_us`` is the
    best single config for both stages (the best a vLLM file can hold). Layers with one stage
    only are left out. ``n_pair``: 'gate_up NxK / down NxK'."""
    return _layers(_shape_frame(results), ev)


def _layers(s, ev=None):
    import pandas as pd

    keys = list(LAYER_KEY)
    g = s[s["stage"] == "gate_up"].set_index(keys)
    d = s[s["stage"] == "down"].set_index(keys)
    both = g.index.intersection(d.index)
    g, d = g.loc[both], d.loc[both]
    out = pd.DataFrame(index=both)
    if "family" in g.columns:
        out["family"] = g["family"].to_numpy()
    out["n_pair"] = [f"{2 * i}x{h} / {h}x{i}" for i, h in zip(both.get_level_values("inter"),
                                                              both.get_level_values("hidden"))]
    for method in REPORT_METHODS:
        if f"{method}_us" in g.columns:
            out[f"{method}_us"] = g[f"{method}_us"].to_numpy() + d[f"{method}_us"].to_numpy()
        if f"{method}_pick" in g.columns:
            out[f"{method}_gate_up"] = g[f"{method}_pick"].to_numpy()
            out[f"{method}_down"] = d[f"{method}_pick"].to_numpy()
    if "model_gate_up" in out.columns:
        out["model_one_config"] = out["model_gate_up"] == out["model_down"]
    if "tuned_ok" in g.columns:  # comparable when both stages are
        out["tuned_ok"] = g["tuned_ok"].to_numpy() & d["tuned_ok"].to_numpy()
    if ev is not None and len(out):
        out["oracle_one_config_us"] = _one_config_oracle(ev).reindex(out.index).to_numpy()
    return out.reset_index()


def _one_config_oracle(ev):
    """Per layer (LAYER_KEY index): min over configs measured ok on both stages of gate_up + down p50."""
    import pandas as pd

    t = ev[ev["status"] == "ok"] if "status" in ev.columns else ev
    t = t.assign(inter=[intermediate(s, n, k) for s, n, k in zip(t["stage"], t["n"], t["k"])],
                 hidden=np.where(t["stage"] == "gate_up", t["k"], t["n"]).astype(int))
    keys = list(LAYER_KEY)
    piv = t.pivot_table(index=keys + ["candidate"], columns="stage", values="p50_us", aggfunc="min")
    if not {"gate_up", "down"} <= set(piv.columns):
        return pd.Series(dtype=np.float64, index=pd.MultiIndex.from_tuples([], names=keys))
    tot = (piv["gate_up"] + piv["down"]).dropna()
    return tot.groupby(level=keys).min()


# -- the report's op section --------------------------------------------------------------

def _gm(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.exp(np.log(x).mean())) if len(x) else float("nan")


def _routing_class(r) -> np.ndarray:
    return np.where(np.asarray(r).astype(str) == "balanced", "balanced", "skewed")


def _summary(frame, groups, oracle_col: str) -> list[dict]:
    """Geomeans per group: each method vs the oracle and the model's speedup vs vLLM's picks.
    frame has '<method>_us' columns and 'tuned_ok' (vLLM's tuned pick comparable)."""
    rows = []
    for label, keep in groups:
        f = frame[keep]
        if not len(f):
            continue
        row = {"shapes": label, "n": int(len(f))}
        o = f[oracle_col]
        if "model_us" in f:
            row["model vs oracle"] = _gm(f["model_us"] / o)
            row["model worst vs oracle"] = float((f["model_us"] / o).max())
        if "vllm_default_us" in f:
            row["vLLM default vs oracle"] = _gm(f["vllm_default_us"] / o)
        t = f[f["tuned_ok"]] if "vllm_tuned_us" in f else f.iloc[:0]
        if "vllm_tuned_us" in f:
            row["vLLM tuned vs oracle"] = _gm(t["vllm_tuned_us"] / t[oracle_col])
            row["tuned n"] = int(len(t))
        if "model_us" in f and "vllm_default_us" in f:
            row["model speedup vs vLLM default"] = _gm(f["vllm_default_us"] / f["model_us"])
        if "model_us" in f and "vllm_tuned_us" in f:
            row["model speedup vs vLLM tuned"] = _gm(t["vllm_tuned_us"] / t["model_us"])
            row["model slower than vLLM tuned by >2%"] = int((t["model_us"] > 1.02 * t["vllm_tuned_us"]).sum())
        rows.append(row)
    return rows


def _groups(frame, by_stage: bool) -> list:
    from gemm_costmodel.util import m_bucket

    from .suites import HELDOUT_FAMILIES

    rc = _routing_class(frame["routing"])
    out = [("all", np.ones(len(frame), bool))]
    if "family" in frame.columns:
        # The acceptance groups: the held-out families (under each routing) and the training families'
        # vLLM-tuned (E, N) (each fold holds the shape's whole family out).
        held = frame["family"].astype(str).isin(HELDOUT_FAMILIES).to_numpy()
        out += [("held-out families", held), ("held-out, balanced", held & (rc == "balanced")),
                ("held-out, skewed", held & (rc == "skewed"))]
        # Issue 17's targets hold per dtype too: each dtype is its own model input and its own
        # vLLM file, so a dtype's worst case must not hide behind the other's.
        if "dtype" in frame.columns and frame["dtype"].nunique() > 1:
            dt = frame["dtype"].astype(str).to_numpy()
            out += [(f"held-out, {r}, {d}", held & (rc == r) & (dt == d))
                    for d in sorted(set(dt)) for r in ("balanced", "skewed")]
        out += [("training families (vLLM-tuned E, N)", ~held)]
    if by_stage:
        out += [(f"stage {s}", (frame["stage"] == s).to_numpy()) for s in space.STAGES]
    out += [(f"routing {c}", rc == c) for c in ("balanced", "skewed")]
    bucket = m_bucket(frame["m"]).astype(str).to_numpy()
    out += [(f"M {b}", bucket == b) for b in dict.fromkeys(m_bucket(frame["m"].sort_values()).astype(str))]
    return out


def comparison(results) -> dict:
    """The numbers of ``report_section``: {'shapes': one row per stage shape ('<method>_us',
    vLLM's picks, 'tuned_ok'), 'layers': ``_layers`` of them, 'stage': summary per group of the
    shapes, 'layer': summary per group of the layers, 'outside' / 'unmeasured': the shapes whose
    vLLM tuned pick is outside our space / has no ok row, 'have_tuned': whether vllm_tuned ran}.
    Summaries: one row per (GPU, group); groups are all, each stage (shapes only), routing balanced
    / skewed, and each M bucket (evaluate.m_bucket)."""
    import pandas as pd

    s = _shape_frame(results)
    picks = vllm_picks(s)
    s = s.merge(picks[list(SHAPE_KEY) + ["tuned_id", "tuned_source", "tuned_in_space"]], on=list(SHAPE_KEY))
    have_tuned = "vllm_tuned_us" in s.columns
    if have_tuned:
        measured = (s["vllm_tuned_pick"].astype(str) == s["tuned_id"]).to_numpy()
        s["tuned_ok"] = s["tuned_in_space"].to_numpy() & measured
        outside, unmeasured = s[~s["tuned_in_space"]], s[s["tuned_in_space"] & ~measured]
    else:
        s["tuned_ok"] = False
        outside = unmeasured = s.iloc[:0]
    lay = _layers(s)

    def summary(frame, by_stage):
        rows = []
        for gpu, g in frame.groupby("gpu_name", observed=True, sort=True):
            rows += [{"gpu": gpu, **r} for r in _summary(g, _groups(g, by_stage), "oracle_us")]
        return pd.DataFrame(rows)

    return {"shapes": s, "layers": lay, "stage": summary(s, True), "layer": summary(lay, False) if len(lay) else
            pd.DataFrame(), "outside": outside, "unmeasured": unmeasured, "have_tuned": have_tuned}


_COLS = ["gpu", "shapes", "n", "model vs oracle", "model worst vs oracle", "vLLM default vs oracle", "vLLM tuned vs oracle", "tuned n",
         "model speedup vs vLLM default", "model speedup vs vLLM tuned", "model slower than vLLM tuned by >2%"]


def report_section(results) -> str:
    """Markdown: per stage and per layer (gate_up + down), the model against the oracle and vLLM's
    default and tuned configs, split by routing (balanced vs skewed) and by M bucket."""
    import pandas as pd

    from gemm_costmodel.util import markdown_table

    L = ["## Fused MoE: against vLLM, per stage and per layer\n"]
    need = [c for c in (*SHAPE_KEY, "method", "pick", "pick_us", "oracle_us") if c not in results.columns]
    if need:
        L.append(f"The per-shape results lack the columns {', '.join(need)}: no MoE comparison.\n")
        return "\n".join(L)
    c = comparison(results)
    s, lay = c["shapes"], c["layers"]

    def table(df):
        return markdown_table(df[[k for k in _COLS if k in df.columns]].round(3))

    if not c["have_tuned"]:
        L.append(f"No vLLM-tuned results (its tuned files were not found: {ENV_VLLM_DIR}).\n")
    L.append("Ratios are geomeans of pick time / oracle time (model: its pick; vLLM: its config run in our "
             "kernel); speedups are vLLM's time / the model's. vLLM runs one config per M for both GEMMs of "
             "the layer, the model may pick one per stage. `vllm_tuned` is the nearest-M entry of vLLM's "
             "file for (E, N = I) where one exists, else vLLM's default; \"tuned n\" counts the shapes where "
             "vLLM's tuned pick is comparable (in our space and measured), the vLLM-tuned columns use only "
             "those. Routing: balanced vs every skewed routing.\n")
    L.append("### Per stage\n")
    L.append(table(c["stage"]) + "\n")
    if c["have_tuned"]:
        n_file = int((s["tuned_source"] == "tuned").sum())
        L.append(f"{n_file} of {len(s)} stage shapes have a vLLM tuned file for their (E, N); on the others "
                 "vLLM's tuned pick is its default.\n")
        bad = pd.concat([c["outside"], c["unmeasured"]])
        if len(bad):
            L.append(f"Not comparable (left out of the vLLM-tuned columns): {len(c['outside'])} shapes whose tuned "
                     f"pick is outside our space, {len(c['unmeasured'])} whose tuned pick has no ok row: "
                     + ", ".join(f"{r.stage} {r.m}x{r.n}x{r.k} E{r.e} {r.routing} -> {r.tuned_id}"
                                 for r in bad.head(8).itertuples()) + (" ..." if len(bad) > 8 else "") + "\n")
        else:
            L.append("Every vLLM tuned pick is in our space and measured.\n")
    if len(lay):
        L.append("### Per layer (gate_up + down)\n")
        L.append(f"{len(lay)} layers (both stages measured at the same M, E, top_k, routing). A layer's vLLM-tuned "
                 "time is comparable when both of its stages are.\n")
        L.append(table(c["layer"]) + "\n")
        if "model_one_config" in lay.columns:
            L.append(f"The model picked one config for both stages on {int(lay['model_one_config'].sum())} of "
                     f"{len(lay)} layers (vLLM always does).\n")
    return "\n".join(L)
