"""ONNX export of a trained CostModel, with its manifest.

onnxmltools converts XGBoost regressors but not rankers, so every booster is
first re-declared as a squared-error regressor: the trees and the base score are
unchanged, hence the ONNX output equals the booster's margin for every
formulation. Feature names are cleared (onnxmltools expects f0..fN); the column
order is ``gemm_costmodel.serving.features.FEATURE_NAMES``, recorded in the manifest
together with the schema hash the runtime checks.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from datetime import datetime, timezone

import numpy as np

from gemm_costmodel.serving import features as F
from gemm_costmodel.learning.model import SHORTLIST_EDGES
from gemm_costmodel.serving.runtime import model_name  # defined there: the runtime prefers the exported name

TARGET_OPSET = 15
INPUT_NAME = "features"


def as_regressor(booster):
    """A copy of the booster declared as reg:squarederror, margin unchanged."""
    import xgboost as xgb

    raw = json.loads(booster.save_raw("json"))
    learner = raw["learner"]
    learner["objective"] = {"name": "reg:squarederror", "reg_loss_param": {"scale_pos_weight": "1"}}
    learner["feature_names"] = []
    learner["feature_types"] = []
    out = xgb.Booster()
    out.load_model(bytearray(json.dumps(raw).encode()))
    return out


def to_onnx(booster, n_features: int | None = None):
    """The booster as an ONNX ModelProto with one float32 input of n_features columns."""
    from onnxmltools.convert import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    reg = as_regressor(booster)
    n_features = n_features or booster.num_features()
    return convert_xgboost(reg, initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))],
                           target_opset=TARGET_OPSET)


def _versions() -> dict:
    import onnx
    import onnxmltools
    import xgboost

    return {"xgboost": xgboost.__version__, "onnxmltools": onnxmltools.__version__, "onnx": onnx.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def data_hash(df) -> str:
    """Hash of the training data's keys and medians (order-independent)."""
    cols = ["gpu_name", "dtype", "m", "n", "k", "e", "top_k", "candidate", "p50_us", "stable", "status"]
    # Through object: a nullable column's missing values (e.g. 'stable' on a failed row) would
    # stay float NaN under astype(str) and break the join.
    v = df[cols].astype(object)
    t = v.where(v.notna(), "nan").astype(str).agg("|".join, axis=1).sort_values()
    return hashlib.sha256("\n".join(t).encode()).hexdigest()[:16]


def space_hashes(op: str, arch: str, dtypes) -> dict[str, str]:
    """Hash of the op's candidate space per dtype, for the manifest."""
    from gemm_costmodel import registry

    spec = registry.get(op)
    return {d: spec.space_module().space_hash(spec.configs(arch, d)) for d in dtypes}


def export(model, out_dir: str, op: str, dtypes: list[str], arch: str, space_hashes: dict[str, str],
           training_data_hash: str, metrics: dict | None = None, gpus: list[str] | None = None,
           role: str = "decision") -> tuple[str, str]:
    """Write <out_dir>/<model_name>.onnx and .json (the manifest); returns both paths.

    role 'decision' ranks candidates; role 'latency' (a log_latency model) only
    annotates the decision model's top k with predicted latencies."""
    if role not in ("decision", "latency"):
        raise ValueError(f"role must be 'decision' or 'latency', got {role!r}")
    if role == "latency" and model.config.formulation != "log_latency":
        raise ValueError("a latency companion must be a log_latency model")
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, model_name(op, arch, role))
    data = to_onnx(model.booster_, len(F.feature_names(op))).SerializeToString()
    with open(stem + ".onnx", "wb") as fh:
        fh.write(data)
    manifest = {
        "op": op, "dtypes": sorted(dtypes), "arch": arch, "role": role,
        "formulation": model.config.formulation,
        # Runtime score = score_sign * onnx output; lower = faster.
        "score_sign": -1.0 if model.config.formulation == "rank" else 1.0,
        "predicts_log2_latency_us": model.config.formulation == "log_latency",
        "input_name": INPUT_NAME,
        "feature_schema_hash": F.schema_hash(op),
        "feature_names": list(F.feature_names(op)),
        "config_space_hash": dict(space_hashes),
        "training_data_hash": training_data_hash,
        "training_rows": model.n_rows_, "training_shapes": model.n_shapes_,
        "training_gpus": sorted(gpus or []),
        # Runtime scores only these candidates (per M bucket); see model.SHORTLIST_EDGES.
        "shortlist": ({"m_edges": list(SHORTLIST_EDGES), "buckets": {str(k): v for k, v in model.shortlist_.items()}}
                      if getattr(model, "shortlist_", None) else None),
        "hyperparameters": model.params(),
        "metrics": metrics or {},
        "versions": _versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # The runtime serves the .onnx only if it still has this size and digest: a file copied over
        # it (say the latency companion over the decision model) would otherwise score nonsense.
        "onnx_bytes": len(data),
        "onnx_sha256": hashlib.sha256(data).hexdigest(),
    }
    with open(stem + ".json", "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    return stem + ".onnx", stem + ".json"
