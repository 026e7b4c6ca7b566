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
from gemm_costmodel.serving.runtime import model_name, seal_manifest  # defined there: the runtime checks both

TARGET_OPSET = 15
INPUT_NAME = "features"
# The decision model's cascade (runtime: ``_OnnxModel.cascade``): its first CASCADE_PREFIX_FRACTION
# of the trees score every candidate, and the rest only the CASCADE_KEEP best by that prefix. A
# boosted ensemble's score is the sum of its trees, so the kept candidates get their exact full
# score. On the H100 host the cold decision spent half its time in onnxruntime scoring ~135
# candidates with 100 trees (issue 18). The dense model's 20-tree prefix with 16 kept gave the
# whole model's pick on every one of 500 cold problems (24 since its 1% rank grades, which made
# 16 miss 2 of 500 M = 2 near-ties; registry ``cascade``); the 300-tree fp8_blockscale and MoE models
# (60-tree prefixes) missed it on 10 of 449 and 376 evaluation problems with 16 kept, on 1 each
# with 32 (docs/decisions/).
CASCADE_PREFIX_FRACTION = 0.2
CASCADE_KEEP = 32


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


def tree_count(proto) -> int:
    """Trees of a TreeEnsembleRegressor model (the ids run 0..n-1)."""
    node = _ensemble_node(proto)
    ids = next(a.ints for a in node.attribute if a.name == "nodes_treeids")
    return int(max(ids)) + 1 if len(ids) else 0


def _ensemble_node(proto):
    nodes = [n for n in proto.graph.node if n.op_type == "TreeEnsembleRegressor"]
    if len(proto.graph.node) != 1 or len(nodes) != 1:
        raise ValueError("expected a model of one TreeEnsembleRegressor node (as onnxmltools writes an XGBoost "
                         f"regressor), got {[n.op_type for n in proto.graph.node]}")
    return nodes[0]


def slice_trees(proto, lo: int, hi: int, keep_base: bool):
    """A copy of a tree-ensemble model with only its trees lo..hi-1 (renumbered from 0), and its
    base value only if keep_base: the outputs of [0, t) with keep_base and of [t, n) without sum
    to the whole model's output."""
    import copy

    from onnx import helper

    out = copy.deepcopy(proto)
    node = _ensemble_node(out)
    attrs = {a.name: a for a in node.attribute}
    n_tree = list(attrs["nodes_treeids"].ints)
    t_tree = list(attrs["target_treeids"].ints)
    nodes = [i for i, t in enumerate(n_tree) if lo <= t < hi]
    targets = [i for i, t in enumerate(t_tree) if lo <= t < hi]
    if not nodes:
        raise ValueError(f"no trees in [{lo}, {hi})")

    def pick(a, rows):
        vals = a.ints or a.floats or a.strings
        return [vals[i] for i in rows]

    new = []
    for a in node.attribute:
        if a.name == "nodes_treeids":
            new.append(helper.make_attribute(a.name, [n_tree[i] - lo for i in nodes]))
        elif a.name == "target_treeids":
            new.append(helper.make_attribute(a.name, [t_tree[i] - lo for i in targets]))
        elif a.name.startswith("nodes_"):
            new.append(helper.make_attribute(a.name, pick(a, nodes)))
        elif a.name.startswith("target_"):
            new.append(helper.make_attribute(a.name, pick(a, targets)))
        elif a.name == "base_values" and not keep_base:
            new.append(helper.make_attribute(a.name, [0.0] * len(a.floats)))
        else:
            new.append(a)
    del node.attribute[:]
    node.attribute.extend(new)
    return out


def write_cascade(onnx_path: str, manifest_path: str, prefix_trees: int | None = None,
                  keep: int = CASCADE_KEEP, prefix_fraction: float = CASCADE_PREFIX_FRACTION) -> dict | None:
    """Split a decision model into <stem>-prefix.onnx (its first trees, with the base value) and
    <stem>-suffix.onnx (the rest), and record them in its manifest under "cascade" (files, sizes,
    sha256, prefix_trees, keep). The model itself is unchanged. prefix_trees defaults to
    prefix_fraction of the trees. Returns the manifest entry, or None for a model with
    too few trees to split (the manifest then has no cascade)."""
    import onnx

    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    proto = onnx.load(onnx_path)
    n = tree_count(proto)
    prefix_trees = max(1, round(n * prefix_fraction)) if prefix_trees is None else int(prefix_trees)
    with open(manifest_path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    entry = None
    if 1 <= prefix_trees < n:
        stem = onnx_path[: -len(".onnx")]
        entry = {"prefix_trees": prefix_trees, "trees": n, "keep": int(keep)}
        for part, (lo, hi, base) in (("prefix", (0, prefix_trees, True)), ("suffix", (prefix_trees, n, False))):
            data = slice_trees(proto, lo, hi, base).SerializeToString()
            with open(f"{stem}-{part}.onnx", "wb") as fh:
                fh.write(data)
            entry[part] = {"file": os.path.basename(f"{stem}-{part}.onnx"), "onnx_bytes": len(data),
                           "onnx_sha256": hashlib.sha256(data).hexdigest()}
    manifest.pop("cascade", None)
    if entry is not None:
        manifest["cascade"] = entry
    with open(manifest_path, "w", encoding="utf-8") as fh:
        json.dump(seal_manifest(manifest), fh, indent=1, sort_keys=True)
    return entry


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
        # Runtime ranking score = score - vendor_margin * features[:, vendor_feature] (TrainConfig).
        "vendor_margin": float(model.config.vendor_margin),
        "vendor_feature": F.feature_names(op).index("is_vendor"),
        "input_name": INPUT_NAME,
        "feature_schema_hash": F.schema_hash(op),
        "feature_names": list(F.feature_names(op)),
        "config_space_hash": dict(space_hashes),
        "training_data_hash": training_data_hash,
        "training_rows": model.n_rows_, "training_shapes": model.n_shapes_,
        "training_gpus": sorted(gpus or []),
        # Runtime scores only these candidates (per M bucket); see TrainConfig.shortlist_edges.
        "shortlist": ({"m_edges": list(model.config.shortlist_edges), "buckets": {str(k): v for k, v in model.shortlist_.items()}}
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
        json.dump(seal_manifest(manifest), fh, indent=1, sort_keys=True)
    if role == "decision":
        from gemm_costmodel import registry

        opts = registry.get(op).cascade
        write_cascade(stem + ".onnx", stem + ".json", prefix_trees=opts.get("prefix_trees"),
                      keep=opts.get("keep", CASCADE_KEEP),
                      prefix_fraction=opts.get("prefix_fraction", CASCADE_PREFIX_FRACTION))
    return stem + ".onnx", stem + ".json"
