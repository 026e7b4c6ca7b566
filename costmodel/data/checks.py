"""What `costmodel dataset validate` checks beyond the schema (``dataset.validate``): that every
row is a problem of its op, measured from its op's space, with sane values, and that no problem
and candidate was timed twice with answers far apart.

The schema says a column holds an int or a string; only the op knows which values make a
problem (registry ``OpSpec``: its ``problem_fields``, the fields it pins, its ``dtypes``; its
``Problem`` type checks ranges, e.g. MoE's E, top_k, stage and routing) and which candidate ids
it has (``config_from_id``). Every check here works on raw rows, before ``merge_duplicates``
takes the median of duplicates, which would hide a conflict.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gemm_costmodel import registry

# Ops of imported tables (costmodel import): other projects' kernels, never trained on, so only
# their op name is checked.
IMPORTED_OPS = ("gemm", "fused_moe", "fused_moe_blockscale")
# Two stable ok rows of one problem and candidate, timed on one card (gpu_uuid), whose medians differ
# by more than this factor disagree about what was measured. On the committed data such pairs agree
# within 1.33x; across two cards of one name they do not always (a first H100 run timed some M = 1
# shapes 2x slower than a later card), so rows of different cards are not compared: their median is
# what the dataset keeps (merge_duplicates). Unstable rows are noisy by definition, and dropped
# where a stable one exists.
CONFLICT_RATIO = 2.0
# Problems whose errors are listed one by one; the rest are counted.
SHOW = 5


def _fmt(values) -> str:
    vals = list(values)
    more = f" (and {len(vals) - SHOW} more)" if len(vals) > SHOW else ""
    return ", ".join(map(repr, vals[:SHOW])) + more


def check_rows(df: pd.DataFrame) -> list[str]:
    """Every problem found in raw, schema-validated rows (``dataset.read_file``'s frames,
    concatenated), one message each; [] when the rows are fine."""
    errors: list[str] = []
    op = df["op"].astype(str)
    harness = (df["source"].astype(str) == "harness").to_numpy()
    known = set(registry.names())
    bad = harness & ~op.isin(known).to_numpy()
    bad |= ~harness & ~op.isin(known | set(IMPORTED_OPS)).to_numpy()
    if bad.any():
        errors.append(f"column 'op': {int(bad.sum())} rows of unknown op(s) {_fmt(sorted(set(op[bad])))} "
                      f"(known: {', '.join(sorted(known))})")
    for name in sorted(set(op[harness]) & known):
        sel = harness & (op == name).to_numpy()
        errors += [f"op {name}: {e}" for e in _check_op(df[sel], registry.get(name))]
    errors += _check_conflicts(df)
    return errors


def _check_op(d: pd.DataFrame, spec) -> list[str]:
    """The harness rows of one op."""
    from .dataset import OPTIONAL_DEFAULTS

    errors = []
    S = spec.space_module()
    archs = getattr(S, "ARCHS", None)
    if archs is not None:
        bad = ~d["arch"].astype(str).isin(list(archs))
        if bad.any():
            errors.append(f"column 'arch': {int(bad.sum())} rows of unknown arch(s) "
                          f"{_fmt(sorted(set(d.loc[bad, 'arch'].astype(str))))} (known: {', '.join(sorted(archs))})")
    bad = ~d["dtype"].astype(str).isin(list(spec.dtypes))
    if bad.any():
        errors.append(f"column 'dtype': {int(bad.sum())} rows of dtype(s) {_fmt(sorted(set(d.loc[bad, 'dtype'].astype(str))))} "
                      f"the op does not take (it takes: {', '.join(spec.dtypes)})")
    # Fields the op pins (a dense GEMM's E = 1, top_k = 1), and problem fields of other ops left at
    # their defaults (registry.columns()).
    for col, want in spec.fixed.items():
        bad = d[col] != want
        if bad.any():
            errors.append(f"column {col!r}: {int(bad.sum())} rows with {col} != {want}, e.g. "
                          f"{_fmt(sorted(set(d.loc[bad, col].tolist())))} (op {spec.name} has {col} = {want})")
    for col in registry.extra_columns():
        if col in spec.problem_fields or col in spec.fixed:
            continue
        bad = d[col] != OPTIONAL_DEFAULTS[col]
        if bad.any():
            errors.append(f"column {col!r}: {int(bad.sum())} rows with values {_fmt(sorted(set(d.loc[bad, col].tolist())))}; "
                          f"op {spec.name} has no {col} (must be {OPTIONAL_DEFAULTS[col]!r})")
    # Each distinct problem through the op's own Problem: its ranges and values.
    fields = list(spec.problem_fields)
    problems = d[fields].drop_duplicates()
    bad_problems = []
    for rec in problems.to_dict("records"):
        try:
            spec.problem_of(rec)
        except (TypeError, ValueError) as exc:
            bad_problems.append(f"{_key(rec)}: {exc}")
    if bad_problems:
        errors.append(f"{len(bad_problems)} invalid problem(s): " + "; ".join(bad_problems[:SHOW])
                      + (f" (and {len(bad_problems) - SHOW} more)" if len(bad_problems) > SHOW else ""))
    # Candidate ids of the op's space (a Triton config id it parses, or its vendor's).
    unknown = []
    for cid in d["candidate"].astype(str).unique():
        try:
            spec.config_from_id(cid)
        except (TypeError, ValueError):
            unknown.append(cid)
    if unknown:
        n = int(d["candidate"].astype(str).isin(unknown).sum())
        errors.append(f"column 'candidate': {n} rows of {len(unknown)} id(s) not in the {spec.name} space: {_fmt(unknown)}")
    # An ok row passed the correctness gate, so its error is finite; NaN is the schema's "not run"
    # (rows written before the gate recorded it), infinity a gate that let a broken result through.
    ok = (d["status"].astype(str) == "ok").to_numpy()
    err = d["rel_err"].to_numpy(dtype=float)
    bad = ok & np.isinf(err)
    if bad.any():
        errors.append(f"column 'rel_err': {int(bad.sum())} ok rows with an infinite error")
    return errors


def _key(rec: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in rec.items())


def _check_conflicts(df: pd.DataFrame) -> list[str]:
    """Stable ok rows of one key (GPU, problem, candidate) and one card whose p50 differ by more than
    CONFLICT_RATIO."""
    from .dataset import KEY

    ok = df[(df["status"].astype(str) == "ok") & df["p50_us"].notna() & df["stable"].astype(bool)]
    if ok.empty:
        return []
    cols = KEY + ["gpu_uuid"]
    g = ok.groupby([ok[c].astype(str) if c in registry.str_columns() else ok[c] for c in cols],
                   observed=True, sort=False)["p50_us"]
    lo, hi = g.min(), g.max()
    ratio = hi / lo
    bad = ratio[ratio > CONFLICT_RATIO]
    if bad.empty:
        return []
    worst = bad.sort_values(ascending=False)
    examples = [f"{_key(dict(zip(cols, k)))}: {lo[k]:.3g} vs {hi[k]:.3g} us" for k in worst.index[:SHOW]]
    return [f"{len(bad)} (problem, candidate) key(s) timed more than {CONFLICT_RATIO:g}x apart on one card: "
            + "; ".join(examples)]


def problem_counts(df: pd.DataFrame) -> dict[str, int]:
    """Distinct problems per op, by the op's full key (its ``problem_fields``; MoE: E, top_k, stage
    and routing too), over every GPU."""
    out = {}
    for name, d in df.groupby(df["op"].astype(str), sort=True):
        fields = list(registry.get(name).problem_fields) if name in registry.names() else \
            registry.shape_columns()
        out[name] = int(d[fields].astype(str).drop_duplicates().shape[0])
    return out
