"""Sweep health: how many rows of a sweep failed, and why, overall and per shape.

Pure pandas, so that both ``costmodel dataset build`` and a running sweep can
call it. A compile error or a resource limit is a property of the config (it
cannot run that shape, on any card); ``wrong``, ``crash`` and ``out_of_memory``
rows point at the sweep (a bad kernel build, a dying card, memory held by
something else), and on an evaluation shape they may hide the true oracle. Such
failures above ``WARN_FRACTION`` of a shape's rows are warned about.
"""
from __future__ import annotations

import pandas as pd

from gemm_costmodel import registry

# Failures that say nothing against the measurement: the config cannot run the shape.
CONFIG_FAILURES = ("compile_error", "out_of_resources", "unsupported")
STATUS_ORDER = ("ok", "wrong", "compile_error", "out_of_resources", "out_of_memory", "crash", "unsupported")
WARN_FRACTION = 0.01
# Shape columns, in label order; raw harness rows lack some of them (op, the ops' own columns).
_SHAPE_COLS = ("arch", "gpu_name", "op", "dtype", "m", "n", "k", *registry.extra_columns())


def mislabelled_oom(rows: pd.DataFrame) -> pd.Series:
    """compile_error rows whose error text reports running out of memory: before the harness
    had an ``out_of_memory`` status, a CUDA OOM in the gate was recorded as a compile error."""
    if "error" not in rows.columns:
        return pd.Series(False, index=rows.index)
    ce = rows["status"].astype(str) == "compile_error"
    return ce & rows["error"].fillna("").astype(str).str.contains("out of memory", case=False, regex=False)


def is_oom(rows: pd.DataFrame) -> pd.Series:
    """Rows that failed because the device ran out of memory (either label)."""
    return (rows["status"].astype(str) == "out_of_memory") | mislabelled_oom(rows)


def failure_kind(rows: pd.DataFrame) -> pd.Series:
    """Each row's status, with mislabelled out-of-memory compile errors as ``out_of_memory``."""
    kind = rows["status"].fillna("").astype(str)
    return kind.mask(mislabelled_oom(rows), "out_of_memory")


def _counts(kinds: pd.Series) -> str:
    vc = kinds.value_counts()
    order = [s for s in STATUS_ORDER if s in vc.index] + sorted(s for s in vc.index if s not in STATUS_ORDER)
    return ", ".join(f"{s} {int(vc[s])}" for s in order)


def _label(key: dict) -> str:
    text = f"{key.get('dtype', '?')}:{key.get('m', '?')}x{key.get('n', '?')}x{key.get('k', '?')}"
    if str(key.get("op", registry.LEGACY_OP)) != registry.LEGACY_OP:
        # The ops' own problem columns: the integers always, the strings when set.
        ints, strs = registry.key_layout()
        text = " ".join([f"{key['op']} {text}", *(f"{registry.column_label(c)}={key.get(c, '?')}" for c in ints)])
        for extra in strs:
            if key.get(extra):
                text += f" {extra}={key[extra]}"
    if "gpu_name" in key:
        text += f" on {key['gpu_name']}"
    return text


def health(rows: pd.DataFrame, warn_fraction: float = WARN_FRACTION) -> tuple[str, list[str]]:
    """(report, warnings) of a frame of sweep rows (harness rows or dataset rows).

    The report counts rows per status, overall and for each shape whose rows are not
    all ok. A warning (a line starting with "WARNING") names each shape where more than
    ``warn_fraction`` of the rows failed other than by a compile error or a resource
    limit; compile errors that report out of memory count as ``out_of_memory``.
    """
    if len(rows) == 0:
        return "rows by status: none (no rows)", []
    rows = rows.reset_index(drop=True)  # labels below are looked up by row
    kinds = failure_kind(rows)
    cols = [c for c in _SHAPE_COLS if c in rows.columns]
    # One integer per shape, in key order (a vectorised groupby, not a string per row).
    shape_ids = (rows.groupby(cols, sort=True, observed=True, dropna=False).ngroup() if cols
                 else pd.Series(0, index=rows.index))
    n_shapes = shape_ids.nunique()
    lines = [f"rows by status: {_counts(rows['status'].fillna('').astype(str))} ({len(rows)} rows, {n_shapes} shapes)"]
    relabelled = int(mislabelled_oom(rows).sum())
    if relabelled:
        lines.append(f"  {relabelled} compile_error row(s) report out of memory: counted as out_of_memory below")
    bad_shapes = shape_ids[kinds != "ok"].unique()
    warnings = []
    if len(bad_shapes):
        lines.append(f"shapes with failed rows: {len(bad_shapes)} of {n_shapes}")
    sel = shape_ids.isin(set(bad_shapes))
    for sid, g in kinds[sel].groupby(shape_ids[sel], sort=True):
        key = rows.loc[g.index[0], cols].to_dict()
        lines.append(f"  {_label(key)}: {_counts(g)} (of {len(g)})")
        unexpected = g[~g.isin(("ok", *CONFIG_FAILURES))]
        if len(unexpected) > warn_fraction * len(g):
            warnings.append(f"WARNING: {_label(key)}: {len(unexpected)} of {len(g)} rows "
                            f"({100 * len(unexpected) / len(g):.1f}%) failed other than by a compile error or a "
                            f"resource limit ({_counts(unexpected)}); check the sweep before trusting this shape")
    return "\n".join(lines), warnings
