"""Exploration (kept as a record): held-out figures of an op measured only on sampled candidates
(`costmodel run --sampled-heldout`'s results CSV), with each baseline scored only where its own
config was measured, and per M bucket (issue 59: the first vllm_moe / vllm_w8a8_block rows).

    costmodel run --op vllm_moe --sampled-heldout --jobs 1 --out OUT
    python benchmarks/explore/cv_sampled.py --op vllm_moe --results OUT/report/vllm_moe/results_family.csv

The "oracle" is the best measured candidate of each problem (~10 per problem: the picks and vLLM's
default), not the best of the full space. `costmodel run`'s own tables score a baseline whose config
was not measured on a problem by the fallback rule's nearest measured candidate; here such a problem
has no figure for that baseline (coverage), and the model is scored on the same problems beside it.
Two views: every candidate (the runtime dispatcher's choice, the vendor included) and Triton only
(the best-ranked Triton config vs the best measured Triton config: what `export-vllm` writes).
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.kernels import hardware
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning import pipeline
from gemm_costmodel.serving import features as F
from gemm_costmodel.util import m_bucket


def rule_pick(spec, row) -> str:
    """The fallback rule's candidate over the op's whole feasible space (as the runtime ranks it)."""
    problem = spec.problem_of(row)
    cfgs = spec.feasible_configs(problem, str(row["arch"]))
    cands = [{"variant": getattr(c, "variant", "tiled"), **{p: getattr(c, p, 0) for p in F.PARAMS}} for c in cfgs]
    kw = {f: str(row[f]) if registry.column_kind(f) == "str" else int(row[f]) for f in spec.fallback_fields()}
    sm = hardware.spec_for(str(row["gpu_name"])).sm_count
    return cfgs[spec.fallback_rule()(int(row["m"]), int(row["n"]), int(row["k"]), sm, cands, **kw)].id


def wanted_configs(op: str, root: str) -> pd.DataFrame:
    """Per held-out shape (its ``shape`` id): the candidates measured ok, and the config each baseline
    runs (the rule over the full space, the op's own baselines, the registry default)."""
    spec = registry.get(op)
    df = pipeline.load_training_frame(root=root, op=op)
    ev = E.eval_rows(df.assign(eval_shape=E.sampled_mask(df)))
    shapes = E.per_shape(ev, np.zeros(len(ev)))[["shape"]]
    first = ev.drop_duplicates("sid").set_index("sid")
    out = pd.DataFrame(index=shapes.index)
    out["shape"] = shapes["shape"]
    out["measured"] = ev.groupby("sid")["candidate"].agg(lambda s: set(map(str, s)))
    out["heuristic"] = [rule_pick(spec, first.loc[sid]) for sid in out.index]
    out["default"] = spec.default_config
    for method, picks in spec.baseline_picks(ev, E.eval_rows(df.iloc[:0])).items():
        out[method] = picks.reindex(out.index).astype(str)
    return out.set_index("shape")


def stats(s: pd.Series) -> dict:
    s = s.dropna()
    return {"n": len(s), "geomean": float(np.exp(np.log(s).mean())) if len(s) else np.nan,
            "within2%": float((s <= E.MATCH_TOL).mean()) if len(s) else np.nan,
            "worst": float(s.max()) if len(s) else np.nan}


def table(res: pd.DataFrame, want: pd.DataFrame) -> pd.DataFrame:
    model = res[res["method"] == "model"].set_index("shape")
    rows = []
    for method in [c for c in want.columns if c != "measured"]:
        base = res[res["method"] == method].set_index("shape")
        if base.empty:
            continue
        covered = pd.Series([w in meas for w, meas in zip(want[method], want["measured"])], index=want.index)
        on = covered.reindex(base.index).fillna(False).astype(bool)
        # Coverage: the baseline's own config was measured; its pick must then be that config.
        assert (base.loc[on, "pick"] == want.loc[base.index[on], method]).all(), method
        for view, col in (("all", "pick_us"), ("triton", None)):
            for bucket in ["all", *m_bucket(base["m"]).cat.categories]:
                sel = on if bucket == "all" else on & (m_bucket(base["m"]) == bucket)
                shapes = base.index[sel]
                if view == "all":
                    b, m = base.loc[shapes, "slowdown"], model.loc[shapes, "slowdown"]
                else:  # Triton only: the baseline picks a Triton config; the model's best-ranked Triton one
                    b = base.loc[shapes, "pick_us"] / base.loc[shapes, "triton_oracle_us"]
                    m = model.loc[shapes, "triton_pick_us"] / model.loc[shapes, "triton_oracle_us"]
                bs, ms = stats(b), stats(m)
                rows.append({"baseline": method, "view": view, "M": bucket, "covered": f"{len(shapes)}/{int((base['m'] > 0).sum() if bucket == 'all' else (m_bucket(base['m']) == bucket).sum())}",
                             "model_geomean": ms["geomean"], "model_within2%": ms["within2%"], "model_worst": ms["worst"],
                             "base_geomean": bs["geomean"], "base_within2%": bs["within2%"], "base_worst": bs["worst"]})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True)
    ap.add_argument("--results", required=True, help="results_<scheme>.csv of `costmodel run --sampled-heldout`")
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--out", default=None, help="also write the table as CSV")
    args = ap.parse_args()
    res = pd.read_csv(args.results)
    want = wanted_configs(args.op, args.root)
    t = table(res, want)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print(t.round(4).to_string(index=False))
    if args.out:
        t.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
