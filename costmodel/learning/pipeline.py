"""Train, evaluate and export on benchmark data: what `costmodel train/evaluate/export`
and the README's main job run.

One model per (op, arch) is trained on every dtype and GPU of that arch (dtype and
the GPU's numbers are features, so fp16/fp8 borrow strength from bf16); its
manifest lists the dtypes it serves, and the runtime looks models up by
(op, dtype, arch) through that list.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

import numpy as np
import pandas as pd

from gemm_costmodel.data import dataset as D
from gemm_costmodel import registry
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.kernels import hardware
from gemm_costmodel.learning.model import CostModel, TrainConfig, training_rows

Log = Callable[[str], None]


def _print(msg: str) -> None:
    # tqdm.write: a line printed while a progress bar is shown (the folds') goes above the bar.
    from tqdm import tqdm

    tqdm.write(msg)
    sys.stdout.flush()


def load_training_frame(paths=None, root: str = "datasets", dtypes=None, arch: str = "sm90",
                        gpus=None, *, op: str, log: Log | None = None) -> pd.DataFrame:
    """Harness rows of one op and arch (optionally some dtypes / GPUs), validated, without the rows
    of candidates the current space rules out (``dataset.out_of_space``; ``log`` hears how many).
    Raises DataError."""
    registry.get(op)
    df = D.load_dataset(paths, root=root)
    keep = (df["op"] == op) & (df["source"] == "harness") & (df["arch"].astype(str) == arch)
    if dtypes:
        keep &= df["dtype"].astype(str).isin(list(dtypes))
    if gpus:
        keep &= df["gpu_name"].astype(str).isin(list(gpus))
    out = df[keep]
    if not out.empty:
        gone = D.out_of_space(out, op, arch)
        if gone.any():
            if log is not None:
                counts = out.loc[gone, "status"].astype(str).value_counts()
                log(f"data: {int(gone.sum())} rows of candidates the {op} space now rules out skipped ("
                    + ", ".join(f"{s} {n}" for s, n in counts.items()) + ")")
            out = out[~gone]
    if out.empty:
        raise D.DataError(f"no {op} harness rows for arch {arch}"
                          + (f", dtypes {', '.join(dtypes)}" if dtypes else "")
                          + (f", GPUs {', '.join(gpus)}" if gpus else ""))
    if not (out["status"] == "ok").any():
        raise D.DataError("no row with status 'ok' to learn from")
    unknown = sorted(g for g in out["gpu_name"].astype(str).unique() if hardware.lookup(g) is None)
    if unknown:
        # The features need the GPU's numbers: fail here, with the name, rather than mid-training.
        raise D.DataError(f"unknown GPU {unknown[0]!r} in the data: describe it with "
                          "gemm_costmodel.kernels.hardware.register() or COSTMODEL_GPU_SPECS")
    # Categories of filtered-out values would linger in groupbys and tables.
    return out.assign(**{c: out[c].astype(str) for c in ("dtype", "gpu_name", "variant", "family",
                                                         *registry.str_columns())}).reset_index(drop=True)


# The least a model may be trained on, per dtype: problems (the op's full key, per GPU) with at least
# MIN_CANDIDATES_PER_PROBLEM trainable rows (timed, ok, stable). A ranking model learns from the
# order of candidates within a problem, so a problem needs two of them; and one weight shape over
# vLLM's M grid alone is 18 problems, so fewer than 20 cannot even describe one layer across batch
# sizes. The shipped models learn from hundreds to thousands per dtype (models/*.json,
# training_shapes); 10 rows would replace one of them with noise (issue 57).
MIN_PROBLEMS_PER_DTYPE = 20
MIN_CANDIDATES_PER_PROBLEM = 2


def check_enough_data(df: pd.DataFrame, config: TrainConfig, min_problems: int = MIN_PROBLEMS_PER_DTYPE) -> None:
    """DataError when a dtype of ``df`` has fewer than ``min_problems`` problems with
    MIN_CANDIDATES_PER_PROBLEM trainable rows. A dtype without a trainable row, or data without a
    problem of two, is left to ``train`` and the model code, whose errors say so."""
    from gemm_costmodel.learning.model import shape_cols

    rows = training_rows(df, config.stable_only)
    if rows.empty or set(df["dtype"].astype(str)) - set(rows["dtype"].astype(str)):
        return  # ``train`` names the dtype without a trainable row
    per_problem = rows.groupby(shape_cols(rows), observed=True, sort=False).size()
    usable = per_problem[per_problem >= MIN_CANDIDATES_PER_PROBLEM]
    counts = usable.groupby(level="dtype", observed=True).size()
    for dtype in sorted(df["dtype"].astype(str).unique()):
        n = int(counts.get(dtype, 0))
        if 0 < n < min_problems:
            raise D.DataError(f"too little data to train on: dtype {dtype} has {n} problem(s) with "
                              f"{MIN_CANDIDATES_PER_PROBLEM} or more trainable candidates, at least {min_problems} "
                              f"needed (--min-problems to change it)")
        if n == 0 and len(counts):
            raise D.DataError(f"too little data to train on: dtype {dtype} has no problem with "
                              f"{MIN_CANDIDATES_PER_PROBLEM} or more trainable candidates (leave it out with --dtype)")


def train(df: pd.DataFrame, config: TrainConfig, log: Log = _print) -> CostModel:
    """The final model on all rows. Raises DataError for a dtype without a trainable row: the
    manifest would list it, and the runtime would serve it from a model that never saw it."""
    usable = set(training_rows(df, config.stable_only)["dtype"].astype(str))
    missing = sorted(set(df["dtype"].astype(str)) - usable)
    if missing:
        raise D.DataError(f"no {'stable ' if config.stable_only else ''}timed ok row for dtype {missing[0]}: "
                          "nothing to train it on (leave it out with --dtype)")
    t0 = time.perf_counter()
    log(f"train: {config.formulation}, {config.n_estimators} trees of depth {config.max_depth} on "
        f"{len(df)} rows ({df[['gpu_name', 'dtype', 'm', 'n', 'k']].drop_duplicates().shape[0]} shapes)")
    model = CostModel(config).fit(df, progress=_Progress(config.n_estimators, log))
    log(f"train: done in {time.perf_counter() - t0:.1f} s ({model.n_rows_} rows used)")
    return model


class _Progress:
    """xgboost callback: a line every 10% of the rounds, labelled with the part being fitted (a model
    split on M fits its decode trees and the others one after the other: CostModel.fit sets
    ``label``), its time counted from the part's start."""

    def __new__(cls, total: int, log: Log):
        import xgboost as xgb

        class _CB(xgb.callback.TrainingCallback):
            def __init__(self):
                super().__init__()
                self.t0 = time.perf_counter()
                self.label = ""

            def before_training(self, model):
                self.t0 = time.perf_counter()
                return model

            def after_iteration(self, model, epoch, evals_log):
                step = max(total // 10, 1)
                if (epoch + 1) % step == 0 or epoch + 1 == total:
                    log(f"  {self.label}round {epoch + 1}/{total} ({time.perf_counter() - self.t0:.1f} s)")
                return False

        return _CB()


def evaluate(df: pd.DataFrame, config: TrainConfig, schemes=("family", "nk"), log: Log = _print,
             train_gpus=None, sampled: bool = False):
    """Held-out results per scheme: {scheme: (per-shape results, model rows)}. ``train_gpus``:
    learn from those GPUs' rows only, score every GPU's held-out shapes; ``sampled``: hold out
    sampled problems too, against their best measured candidate (``cross_validate``)."""
    out = {}
    for scheme in schemes:
        t0 = time.perf_counter()
        out[scheme] = E.cross_validate(df, config, scheme=scheme, log=log, train_gpus=train_gpus,
                                       sampled=sampled)
        log(f"evaluate: {scheme} folds done in {time.perf_counter() - t0:.1f} s")
    return out


COMPARE_GRID = [
    ("log_latency", 300, 8, 0.1), ("normalized", 300, 8, 0.1), ("rank", 300, 8, 0.1),
]


def compare(df: pd.DataFrame, base: TrainConfig, grid=COMPARE_GRID, log: Log = _print,
            train_gpus=None, sampled: bool = False) -> pd.DataFrame:
    """Leave-family-out metrics of the model for each (formulation, trees, depth, eta) in grid
    (``train_gpus``, ``sampled``: as in ``evaluate``)."""
    rows = []
    for form, n, d, lr in grid:
        cfg = base.with_(formulation=form, n_estimators=n, max_depth=d, learning_rate=lr)
        t0 = time.perf_counter()
        res, _ = E.cross_validate(df, cfg, scheme="family", baselines=False, train_gpus=train_gpus,
                                  sampled=sampled)
        m = E.metrics_table(res, by=["gpu_name", "dtype"])
        for r in m.to_dict("records"):
            rows.append({"formulation": form, "trees": n, "depth": d, "eta": lr, "gpu": r["gpu_name"],
                         "dtype": r["dtype"], "shapes": r["shapes"], "match_2pct": r["match_2pct"],
                         "geomean_slowdown": r["geomean_slowdown"], "p99_slowdown": r["p99_slowdown"],
                         "top8_bench_slowdown": r["top8_bench_slowdown"]})
        log(f"compare: {form} {n}x{d} eta {lr}: {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


def select_best(comparison: pd.DataFrame, dtype: str = "bf16") -> dict:
    """The grid point with the lowest geomean slowdown on `dtype` (all GPUs pooled by shape count)."""
    c = comparison[comparison["dtype"] == dtype]
    if c.empty:
        c = comparison
    w = c.assign(lg=np.log(c["geomean_slowdown"]) * c["shapes"])
    agg = w.groupby(["formulation", "trees", "depth", "eta"]).agg(lg=("lg", "sum"), n=("shapes", "sum"))
    best = (agg["lg"] / agg["n"]).idxmin()
    return dict(zip(["formulation", "n_estimators", "max_depth", "learning_rate"], best))


LATENCY_COMPANION = TrainConfig(formulation="log_latency", n_estimators=100, max_depth=6, learning_rate=0.2)


def export_model(model: CostModel, df: pd.DataFrame, out_dir: str, arch: str = "sm90",
                 metrics: dict | None = None, log: Log = _print, role: str = "decision") -> tuple[str, str]:
    """ONNX + manifest for the model, serving every dtype it was trained on."""
    from gemm_costmodel.learning import export as X

    op = getattr(model, "op_", registry.LEGACY_OP)
    dtypes = sorted(df["dtype"].unique())
    spaces = X.space_hashes(op, arch, dtypes)
    onnx_path, man_path = X.export(model, out_dir, op=op, dtypes=dtypes, arch=arch, space_hashes=spaces,
                                   training_data_hash=X.data_hash(df), metrics=metrics,
                                   gpus=sorted(df["gpu_name"].unique()), role=role)
    log(f"export: {onnx_path} ({os.path.getsize(onnx_path) / 1e6:.2f} MB), manifest {man_path}")
    return onnx_path, man_path


def model_metrics(results: pd.DataFrame) -> dict:
    """Held-out model metrics per GPU and dtype, for the manifest."""
    m = E.metrics_table(results[results["method"] == "model"], by=["gpu_name", "dtype"])
    return {f"{r['gpu_name']}/{r['dtype']}": {k: (round(v, 4) if isinstance(v, float) else v)
                                              for k, v in r.items() if k not in ("method", "gpu_name", "dtype")}
            for r in m.to_dict("records")}
