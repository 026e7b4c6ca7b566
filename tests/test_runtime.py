"""Runtime dispatch with a tiny model trained here: model/table/heuristic precedence, input
validation, the fallbacks (one DispatchWarning each), the LRU cache, precompute, threads,
and the serving path's imports.

The tiny model (20 trees of depth 4 on one fp16 and one fp8 shard) serves fp16 and fp8 on
sm90; bf16 has no model in it, so bf16 decisions come from the heuristic.
``tiny_model_dir`` builds it once per session and is shared with test_ops and
test_triton_adapter.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels.gemm import heuristic
from gemm_costmodel.serving import runtime
from gemm_costmodel.serving.candidates import table
from gemm_costmodel.kernels.gemm.space import Problem, check_feasible, config_from_id
from gemm_costmodel.serving.runtime import Choice, DispatchWarning, Dispatcher, check_problem, find_model, find_models, seal_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = [os.path.join(ROOT, "datasets", "gemm", "fp8", "eval-fp8-shard01of40.parquet"),
          os.path.join(ROOT, "datasets", "gemm", "fp16", "eval-fp16-shard01of40.parquet")]
GPU = "NVIDIA H100 80GB HBM3"
_TINY: dict = {}


def tiny_model_dir(tmp_path_factory) -> str:
    """Folder with gemm-sm90.onnx + gemm-sm90.json of a tiny model (built once per session)."""
    if "dir" not in _TINY:
        for mod in ("xgboost", "onnxmltools", "onnxruntime"):
            pytest.importorskip(mod)
        missing = [p for p in SHARDS if not os.path.isfile(p)]
        if missing:
            pytest.fail(f"committed training shard missing: {missing[0]}")  # the data ships with the repo
        from gemm_costmodel.learning.model import CostModel, TrainConfig
        from gemm_costmodel.learning.pipeline import export_model, load_training_frame

        df = load_training_frame(SHARDS, op="gemm")
        m = CostModel(TrainConfig(formulation="log_latency", n_estimators=20, max_depth=4)).fit(df)
        out = str(tmp_path_factory.mktemp("tiny-model"))
        export_model(m, df, out)
        # The decision model and its cascade (the first 4 of 20 trees, the other 16).
        assert sorted(os.listdir(out)) == ["gemm-sm90-prefix.onnx", "gemm-sm90-suffix.onnx", "gemm-sm90.json",
                                           "gemm-sm90.onnx"]
        _TINY["dir"] = out
    return _TINY["dir"]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def disp(model_dir):
    """A shared dispatcher (bf16's one fallback warning silenced)."""
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)
        d.model_for("bf16")
    return d


def _feasible(cid, m, n, k, dtype):
    return check_feasible(config_from_id(cid), Problem(m, n, k, dtype))[0]


# -- the model ---------------------------------------------------------------------------

SHAPES = [(1, 4096, 4096), (7, 4097, 1), (16, 14336, 4096), (1, 1, 1), (300, 1000, 777), (8192, 8192, 8192),
          (10000, 20000, 20000)]


@pytest.mark.parametrize("dtype", ["fp16", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_select_and_rank_with_the_model(disp, shape, dtype):
    m, n, k = shape
    c = disp.select(m, n, k, dtype)
    assert isinstance(c, Choice)
    assert c.source == "model"
    assert _feasible(c.candidate, m, n, k, dtype)
    assert c.predicted_us is not None and c.predicted_us > 0 and np.isfinite(c.predicted_us)
    assert c.score is not None
    r = disp.rank(m, n, k, dtype, count=5)
    assert 1 <= len(r) <= 5
    assert all(x.source == "model" for x in r)
    assert [x.score for x in r] == sorted(x.score for x in r)
    assert len({x.candidate for x in r}) == len(r)
    assert all(_feasible(x.candidate, m, n, k, dtype) and x.predicted_us > 0 for x in r)
    # select is the rank's first (rank scores with the whole model), unless select's cascade missed
    # the whole model's best (this tiny model's 4-tree prefix is coarse): then its pick scores worse.
    if r[0].candidate != c.candidate:
        assert disp.model_for(dtype).cascade is not None and c.score > r[0].score
    # a log2-latency model's estimate is 2**score.
    assert c.predicted_us == pytest.approx(2.0 ** c.score)
    for count in (1, 2, 3):
        assert len(disp.rank(m, n, k, dtype, count=count)) <= count
    assert [x.candidate for x in disp.rank(m, n, k, dtype, count=2)] == [x.candidate for x in r[:2]]


WEIRD = [1, 2, 7, 15, 16, 17, 63, 65, 127, 129, 1000, 4095, 4096, 4097, 8191, 14336]


def _dim(hi):
    return st.one_of(st.integers(1, hi), st.sampled_from([w for w in WEIRD if w <= hi]))


@settings(max_examples=40, deadline=None)
@given(m=_dim(10000), n=_dim(20000), k=_dim(20000), dtype=st.sampled_from(["fp16", "fp8", "bf16"]))
@example(m=7, n=4097, k=1, dtype="fp8")
@example(m=1, n=1, k=1, dtype="bf16")
@example(m=10000, n=20000, k=7, dtype="fp16")
def test_every_returned_candidate_is_feasible(disp, m, n, k, dtype):
    c = disp.select(m, n, k, dtype)
    assert c.source == ("heuristic" if dtype == "bf16" else "model")
    assert _feasible(c.candidate, m, n, k, dtype), c
    for x in disp.rank(m, n, k, dtype, count=4):
        assert _feasible(x.candidate, m, n, k, dtype), x


def test_heuristic_choice_is_the_heuristics(disp):
    m, n, k = 16, 4096, 4096
    c = disp.select(m, n, k, "bf16")
    assert c == Choice("splitk_m16n64k128_s2_w4s4", "heuristic")
    assert disp.rank(m, n, k, "bf16", count=8) == [c]
    ct = table("sm90", "bf16", op="gemm")
    idx = np.flatnonzero(ct.feasible_mask(m, n, k))
    assert ct.ids[idx[heuristic.choose(m, n, k, 132, ct.candidate_dicts(idx))]] == c.candidate


# -- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [
    (dict(m=0), "M"), (dict(n=-1), "N"), (dict(k=1.5), "K"), (dict(m=True), "M"), (dict(n=np.float64(64)), "N"),
    (dict(m=None), "M"), (dict(m=[64]), "M"), (dict(k={}), "K"), (dict(dtype="int8"), "dtype"),
    (dict(dtype=["fp16"]), "dtype"), (dict(dtype="fp32"), "dtype"), (dict(e=0), "E"),
    (dict(top_k=0), "top_k"), (dict(top_k=3, e=2), "top_k"),
    (dict(m=2**31), "M"), (dict(n=2**31), "N"), (dict(k=np.int64(2**40)), "K"),
], ids=lambda v: repr(v) if isinstance(v, dict) else v)
def test_bad_input_raises_value_error_naming_the_field(disp, kwargs, field):
    args = dict(m=64, n=64, k=64, dtype="fp16")
    args.update(kwargs)
    # A cached decision for the equal int key must not let a bool/float through.
    disp.select(64, 64, 64, "fp16")
    disp.select(1, 64, 64, "fp16")
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        disp.select(**args)
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        disp.rank(**args)


def test_dims_up_to_int32_max_are_accepted():
    check_problem(2**31 - 1, 2**31 - 1, 2**31 - 1, "bf16")
    for name, dims in (("M", (2**31, 1, 1)), ("N", (1, 2**31, 1)), ("K", (1, 1, 2**31))):
        with pytest.raises(ValueError, match=rf"^{name} must be <= 2\*\*31 - 1 \(2147483647\), got 2147483648$"):
            check_problem(*dims, "bf16")


def test_rank_count_and_numpy_ints(disp):
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="count"):
            disp.rank(64, 64, 64, "fp16", count=bad)
    # numpy ints are ints: the same decision as Python ints, served from the same cache entry.
    c = disp.select(5, 4096, 4096, "fp16")
    assert disp.select(np.int64(5), np.int32(4096), np.int64(4096), "fp16") is c
    c2 = disp.select(np.int64(6), 4096, np.int64(4096), "fp16")
    assert disp.select(np.int64(6), 4096, 4096, "fp16") is c2
    assert disp.select(6, 4096, 4096, "fp16") is c2


# -- tuned tables ----------------------------------------------------------------------------

def test_tuned_table_exact_hit_wins(model_dir):
    cid = "tiled_m64n128k64_g8_w4s4"
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir, tuned_table={"entries": {"fp16:64x4096x4096": cid}})
    assert d.select(64, 4096, 4096, "fp16") == Choice(cid, "table")
    # Exact hits only: another M or another dtype go to the model.
    assert d.select(65, 4096, 4096, "fp16").source == "model"
    assert d.select(64, 4096, 4096, "fp8").source == "model"
    # A flat table works too, and adding one clears cached decisions.
    assert d.select(32, 4096, 4096, "fp16").source == "model"
    d.add_tuned_table({"fp16:32x4096x4096": "cublas"})
    assert d.select(32, 4096, 4096, "fp16") == Choice("cublas", "table")


@pytest.mark.parametrize("kw, field", [(dict(e=8, top_k=2), "E=8"), (dict(e=8), "E=8"), (dict(e=4, top_k=4), "E=4")])
def test_dense_op_refuses_experts_naming_the_field(model_dir, kw, field):
    """E and top_k belong to another op: the dense GEMM never silently answers for them."""
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    for call in (d.select, d.rank):
        with pytest.raises(ValueError, match=f"^{field} is not a gemm problem"):
            call(16, 4096, 4096, "bf16", **kw)
    assert d.cache_info()["entries"] == 0  # nothing cached for them


def test_unknown_op_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown op 'no_such_op'; known ops: (.*, )?gemm(, |$)"):
        Dispatcher(gpu_name=GPU, op="no_such_op")


def test_tuned_table_of_another_op_never_answers(model_dir):
    cid = "tiled_m64n128k64_g8_w4s4"
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir, tuned_table={"op": "gemm", "entries": {"fp16:64x4096x4096": cid}})
    assert d.select(64, 4096, 4096, "fp16") == Choice(cid, "table")
    with pytest.raises(ValueError, match="unknown op 'no_such_op'"):
        d.add_tuned_table({"op": "no_such_op", "entries": {"fp16:64x4096x4096": cid}})
    # Another registered op's table is stored under that op: the dense dispatcher never uses it.
    d.add_tuned_table({"op": "fp8_blockscale", "entries": {"fp8:64x4096x4096": "bstiled_m64n128k128_g32_w4s2"}})
    assert d.select(64, 4096, 4096, "fp8").source != "table"


def test_infeasible_or_unknown_table_entries_are_ignored(model_dir):
    bad = "persistent_m128n128k64_g8_w8s3"  # TMA: K=1 fp16 rows are 2 bytes, not 16-byte aligned
    assert not _feasible(bad, 7, 4097, 1, "fp16")
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir,
                   tuned_table={"fp16:7x4097x1": bad, "fp16:8x8x8": "no_such_config",
                                "fp32:8x8x8": "tiled_m16n32k64_g8_w4s3"})
    c = d.select(7, 4097, 1, "fp16")
    assert c.source == "model" and c.candidate != bad and _feasible(c.candidate, 7, 4097, 1, "fp16")
    assert d.select(8, 8, 8, "fp16").source == "model"
    with pytest.raises(ValueError, match="tuned table key"):
        d.add_tuned_table({"fp16:8x8": "cublas"})


def test_tuned_table_file_in_unsure_mode_format(model_dir, tmp_path):
    cid = "splitk_m16n64k128_s4_w4s3"
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({
        "format": "gemm_costmodel.tuned/1",
        "provenance": {"gpu_name": GPU, "torch": "x", "git_sha": "deadbeef", "updated": "2025-01-01T00:00:00+00:00",
                       "k": 8},
        "entries": {"fp16:16x4096x4096": {"candidate": cid, "ms": 0.01, "timed": {cid: 0.01, "cublas": 0.02},
                                          "model_top1": "cublas"}},
    }))
    for table_arg in (str(path), path):
        d = Dispatcher(gpu_name=GPU, models_dir=model_dir, tuned_table=table_arg)
        assert d.select(16, 4096, 4096, "fp16") == Choice(cid, "table")
        assert d.select(16, 4096, 4097, "fp16").source == "model"


# -- fallbacks -------------------------------------------------------------------------------

def _assert_one_warning(d, expect_in_reason, dtypes=("fp16", "fp8")):
    """Many decisions (select and rank, new shapes each time) give heuristic, feasible answers and
    exactly one DispatchWarning."""
    rng = np.random.default_rng(0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for i in range(60):
            m, n, k = (int(v) for v in rng.integers(1, 9000, size=3))
            dtype = dtypes[i % len(dtypes)]
            c = d.select(m, n, k, dtype)
            assert c.source == "heuristic" and c.predicted_us is None
            assert _feasible(c.candidate, m, n, k, dtype)
            r = d.rank(m, n, k, dtype, count=4)
            assert r == [c]
    got = [w for w in rec if issubclass(w.category, DispatchWarning)]
    assert len(got) == 1, [str(w.message) for w in got]
    assert expect_in_reason in str(got[0].message)
    for dtype in dtypes:
        assert expect_in_reason in d.fallback_reasons[dtype]


@pytest.fixture
def model_copy(model_dir, tmp_path):
    dst = tmp_path / "models"
    shutil.copytree(model_dir, dst)
    return dst


def _edit_manifest(folder, name="gemm-sm90.json", **changes):
    path = folder / name
    man = json.loads(path.read_text())
    man.update(changes)
    # Re-sealed: these tests stand for a model exported that way, not for an edited manifest.
    path.write_text(json.dumps(seal_manifest(man)))


def _drop_integrity_fields(folder, name="gemm-sm90.json"):
    path = folder / name
    man = json.loads(path.read_text())
    del man["onnx_bytes"], man["onnx_sha256"]
    path.write_text(json.dumps(seal_manifest(man)))


def test_fallback_missing_model_folder(tmp_path):
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(tmp_path / "nowhere")), "does not exist")


def test_fallback_truncated_onnx(model_copy):
    onnx = model_copy / "gemm-sm90.onnx"
    data = onnx.read_bytes()
    onnx.write_bytes(data[: len(data) // 2])
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "does not match its manifest")


def test_fallback_truncated_onnx_of_a_manifest_without_integrity_fields(model_copy):
    # An older manifest (no onnx_bytes / onnx_sha256) is served unchecked: the broken file only shows on loading.
    _drop_integrity_fields(model_copy)
    onnx = model_copy / "gemm-sm90.onnx"
    onnx.write_bytes(onnx.read_bytes()[:1000])
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "cannot load")


def test_fallback_missing_onnx_file(model_copy):
    (model_copy / "gemm-sm90.onnx").unlink()
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "is missing")


def test_fallback_schema_hash_mismatch(model_copy):
    _edit_manifest(model_copy, feature_schema_hash="0123456789abcdef")
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "feature schema hash")
    # The warning says how to get a model of the current features.
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "retrain: costmodel run --op gemm")


def test_fallback_unknown_gpu_is_the_vendor_library(model_dir, monkeypatch):
    # No GPU of that name here to ask for its compute capability: its arch, hence its space, is unknown.
    monkeypatch.setattr(runtime, "current_gpu_capability", lambda name: None)
    d = Dispatcher(gpu_name="NVIDIA Foo 9000", models_dir=model_dir)
    assert d.spec is None and d.arch is None and d.space_arch is None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for m, n, k in SHAPES:
            for dtype in ("bf16", "fp16"):
                assert d.select(m, n, k, dtype) == Choice("cublas", "vendor")
                assert d.rank(m, n, k, dtype, count=4) == [Choice("cublas", "vendor")]
    got = [str(w.message) for w in rec if issubclass(w.category, DispatchWarning)]
    assert len(got) == 1 and "vendor library (cublas)" in got[0] and "unknown GPU 'NVIDIA Foo 9000'" in got[0], got
    assert "unknown GPU" in d.fallback_reasons["bf16"]


def test_fallback_model_for_another_arch(model_copy):
    _edit_manifest(model_copy, arch="sm100")
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "sm100")


def test_fallback_when_scoring_fails(model_copy):
    # The model loads, but session.run gets a wrong input name: the serving path still answers.
    _edit_manifest(model_copy, input_name="not_the_input")
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), "scoring failed")


def test_fallback_unreadable_manifest_is_skipped(model_copy):
    (model_copy / "aaa-broken.json").write_text("{not json")
    d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        assert d.select(16, 4096, 4096, "fp16").source == "model"


# -- model integrity ---------------------------------------------------------------------------

SHIPPED = os.path.join(ROOT, "models")


@pytest.fixture
def shipped_copy(tmp_path):
    """The shipped decision model and latency companion, copied (byte-identical) to a temporary folder."""
    dst = tmp_path / "shipped"
    dst.mkdir()
    for stem in ("gemm-sm90", "gemm-sm90-latency"):
        for ext in (".json", ".onnx"):
            shutil.copy(os.path.join(SHIPPED, stem + ext), dst / (stem + ext))
    for part in ("prefix", "suffix"):
        shutil.copy(os.path.join(SHIPPED, f"gemm-sm90-{part}.onnx"), dst / f"gemm-sm90-{part}.onnx")
    return dst


def test_shipped_manifests_record_their_onnx_files():
    import hashlib

    for stem in ("gemm-sm90", "gemm-sm90-latency"):
        man = json.loads(open(os.path.join(SHIPPED, stem + ".json"), encoding="utf-8").read())
        data = open(os.path.join(SHIPPED, stem + ".onnx"), "rb").read()
        assert man["onnx_bytes"] == len(data)
        assert man["onnx_sha256"] == hashlib.sha256(data).hexdigest()
    path, man = find_model(SHIPPED, "gemm", "bf16", "sm90")
    assert path == os.path.join(SHIPPED, "gemm-sm90.onnx") and man["role"] == "decision"
    path, man = find_model(SHIPPED, "gemm", "bf16", "sm90", role="latency")
    assert path == os.path.join(SHIPPED, "gemm-sm90-latency.onnx") and man["role"] == "latency"


def test_latency_model_copied_over_the_decision_model_falls_back(shipped_copy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        assert Dispatcher(gpu_name=GPU, models_dir=str(shipped_copy)).select(16, 4096, 4096, "fp16").source == "model"
    shutil.copy(shipped_copy / "gemm-sm90-latency.onnx", shipped_copy / "gemm-sm90.onnx")
    d = Dispatcher(gpu_name=GPU, models_dir=str(shipped_copy))
    _assert_one_warning(d, "onnx_sha256", dtypes=("bf16", "fp16", "fp8"))
    assert "gemm-sm90.onnx does not match its manifest" in d.fallback_reasons["bf16"]
    # The companion itself is intact and still loads; only the decision model is refused.
    assert d.latency_model_for("bf16") is not None


def test_size_mismatch_falls_back(model_copy):
    size = (model_copy / "gemm-sm90.onnx").stat().st_size
    _edit_manifest(model_copy, onnx_bytes=size + 1)
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)),
                        f"{size} bytes, the manifest's onnx_bytes says {size + 1}")


def test_hash_mismatch_alone_falls_back(model_copy):
    _edit_manifest(model_copy, onnx_sha256="0" * 64)
    d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
    _assert_one_warning(d, "the manifest's onnx_sha256 says 000000000000")
    assert "onnx_bytes" not in d.fallback_reasons["fp16"]  # the size is right: only the digest is named


@pytest.mark.parametrize("field,value", [("onnx_bytes", "19850"), ("onnx_sha256", 12)])
def test_integrity_field_of_the_wrong_type_falls_back(model_copy, field, value):
    _edit_manifest(model_copy, **{field: value})
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)), f"{field} must be")


def test_manifest_without_integrity_fields_still_loads(model_copy):
    _drop_integrity_fields(model_copy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
        assert d.select(16, 4096, 4096, "fp16").source == "model"
    assert d.model_for("fp16").path == str(model_copy / "gemm-sm90.onnx")


def _stale(folder, kind):
    """Put a stale or broken gemm-sm90-old.json (sorts before gemm-sm90.json) beside the valid model."""
    old = folder / "gemm-sm90-old.json"
    shutil.copy(folder / "gemm-sm90.json", old)
    if kind == "unreadable":
        old.write_text("{not json")
    elif kind == "not an object":
        old.write_text("[1, 2]")
    elif kind == "missing onnx":
        pass  # no gemm-sm90-old.onnx
    else:
        shutil.copy(folder / "gemm-sm90.onnx", folder / "gemm-sm90-old.onnx")
        changes = {"wrong arch": dict(arch="sm100"), "old schema": dict(feature_schema_hash="0123456789abcdef"),
                   "bad hash": dict(onnx_sha256="f" * 64), "bad size": dict(onnx_bytes=1),
                   "broken onnx": {}, "valid copy": {}}[kind]
        _edit_manifest(folder, "gemm-sm90-old.json", **changes)
    if kind == "broken onnx":
        onnx = folder / "gemm-sm90-old.onnx"
        onnx.write_bytes(onnx.read_bytes()[:1000])
        _drop_integrity_fields(folder, "gemm-sm90-old.json")  # so that it fails only when loaded


@pytest.mark.parametrize("kind", ["unreadable", "not an object", "missing onnx", "wrong arch", "old schema",
                                  "bad hash", "bad size", "broken onnx", "valid copy"])
def test_stale_manifest_beside_a_valid_one_does_not_disable_it(model_copy, kind):
    _stale(model_copy, kind)
    assert sorted(os.listdir(model_copy))[0] == "gemm-sm90-old.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
        c = d.select(16, 4096, 4096, "fp16")
    assert c.source == "model"
    # The exported name wins over any other manifest, valid or not.
    assert d.model_for("fp16").path == str(model_copy / "gemm-sm90.onnx")
    assert find_model(str(model_copy), "gemm", "fp16", "sm90")[0] == str(model_copy / "gemm-sm90.onnx")


def test_broken_model_under_the_exported_name_gives_way_to_a_valid_copy(model_copy):
    for ext in (".json", ".onnx"):
        shutil.copy(model_copy / f"gemm-sm90{ext}", model_copy / f"gemm-sm90-new{ext}")
    onnx = model_copy / "gemm-sm90.onnx"
    onnx.write_bytes(onnx.read_bytes()[::-1])  # same size, other bytes: only the digest tells
    found, reasons = find_models(str(model_copy), "gemm", "fp16", "sm90")
    assert [os.path.basename(p) for p, _ in found] == ["gemm-sm90-new.onnx"]
    assert len(reasons) == 1 and reasons[0].startswith("gemm-sm90.json: gemm-sm90.onnx does not match its manifest "
                                                       "(sha256 ")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
        assert d.select(16, 4096, 4096, "fp16").source == "model"
    assert d.model_for("fp16").path == str(model_copy / "gemm-sm90-new.onnx")


def test_stale_manifest_alone_is_named_in_the_reason(model_copy):
    _stale(model_copy, "bad hash")
    for ext in (".json", ".onnx"):
        (model_copy / f"gemm-sm90{ext}").unlink()
    _assert_one_warning(Dispatcher(gpu_name=GPU, models_dir=str(model_copy)),
                        "gemm-sm90-old.json: gemm-sm90-old.onnx does not match its manifest")


def test_two_valid_models_without_the_exported_name_pick_the_first_file_name(model_copy):
    for stem in ("gemm-sm90-b", "gemm-sm90-a"):
        for ext in (".json", ".onnx"):
            shutil.copy(model_copy / f"gemm-sm90{ext}", model_copy / f"{stem}{ext}")
    for ext in (".json", ".onnx"):
        (model_copy / f"gemm-sm90{ext}").unlink()
    found, reasons = find_models(str(model_copy), "gemm", "fp16", "sm90")
    assert [os.path.basename(p) for p, _ in found] == ["gemm-sm90-a.onnx", "gemm-sm90-b.onnx"] and not reasons
    d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
    assert d.select(16, 4096, 4096, "fp16").source == "model"
    assert d.model_for("fp16").path == str(model_copy / "gemm-sm90-a.onnx")


def test_a_model_that_fails_to_load_gives_way_to_the_next(model_copy):
    # Without the exported name, gemm-sm90-a (an unloadable file, no integrity fields) comes first.
    _stale(model_copy, "broken onnx")
    for ext in (".json", ".onnx"):
        (model_copy / f"gemm-sm90-old{ext}").rename(model_copy / f"gemm-sm90-a{ext}")
        (model_copy / f"gemm-sm90{ext}").rename(model_copy / f"gemm-sm90-b{ext}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        d = Dispatcher(gpu_name=GPU, models_dir=str(model_copy))
        assert d.select(16, 4096, 4096, "fp16").source == "model"
    assert d.model_for("fp16").path == str(model_copy / "gemm-sm90-b.onnx")


def test_tuned_table_still_wins_without_a_model(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)
        d = Dispatcher(gpu_name=GPU, models_dir=str(tmp_path),
                       tuned_table={"bf16:16x4096x4096": "cublas"})
        assert d.select(16, 4096, 4096, "bf16") == Choice("cublas", "table")
        assert d.select(16, 4096, 4095, "bf16").source == "heuristic"


# -- cache -------------------------------------------------------------------------------------

def test_lru_keeps_at_most_cache_size_and_evicts_least_recently_used(model_dir):
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir, cache_size=3)
    A, B, C, D = [(m, 4096, 4096, "fp16") for m in (1, 2, 3, 4)]
    a, b, c = d.select(*A), d.select(*B), d.select(*C)
    assert d.cache_info() == {"entries": 3, "capacity": 3}
    assert d.select(*A) is a  # warm: the identical cached object; A is now the most recent
    dd = d.select(*D)  # evicts B, the least recently used
    assert d.cache_info()["entries"] == 3
    assert d.select(*C) is c and d.select(*A) is a
    b2 = d.select(*B)  # recomputed (equal, but a new object); evicts D
    assert b2 == b and b2 is not b
    assert d.cache_info()["entries"] == 3
    assert d.select(*C) is c and d.select(*A) is a and d.select(*B) is b2
    d2 = d.select(*D)
    assert d2 == dd and d2 is not dd
    d.clear_cache()
    assert d.cache_info()["entries"] == 0


def test_precompute_fills_the_cache(model_dir, monkeypatch):
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    nk = [(4096, 4096), (14336, 4096), (4096, 14336)]
    ms = [1, 7, 16, 100, 4096]
    assert d.precompute(nk, "fp16", ms=ms) == len(nk) * len(ms)
    assert d.cache_info()["entries"] == len(nk) * len(ms)

    def no_decisions(*a, **kw):
        raise AssertionError("precomputed shapes must be served from the cache")

    monkeypatch.setattr(d, "_decide", no_decisions)
    for n, k in nk:
        for m in ms:
            assert d.select(m, n, k, "fp16").source == "model"
    # The default M grid: powers of two up to 16384.
    d2 = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    assert d2.precompute([(4096, 4096)], "fp8") == 15
    assert d2.cache_info()["entries"] == 15


@pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")
def test_threads_get_the_single_threaded_answers(model_dir):
    rng = np.random.default_rng(1)
    ms = [1, 2, 7, 16, 17, 64, 65, 300, 1024, 4097]
    nks = [(4096, 4096), (4097, 7), (1, 14336), (14336, 4096), (1000, 1000)]
    pool = [(int(m), n, k, dt) for m in ms for n, k in nks for dt in ("fp16", "fp8", "bf16")]  # 150 problems
    ops = [("rank" if rng.random() < 0.1 else "select", pool[i]) for i in rng.integers(0, len(pool), 2000)]

    ref_d = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    expected = {}
    for op, p in set(ops):
        expected[(op, p)] = ref_d.select(*p) if op == "select" else tuple(ref_d.rank(*p, count=3))

    d = Dispatcher(gpu_name=GPU, models_dir=model_dir, cache_size=64)
    barrier = threading.Barrier(8)
    errors, mismatches = [], []

    def work(seed):
        order = np.random.default_rng(seed).permutation(len(ops))
        try:
            barrier.wait()
            for j in order:
                op, p = ops[j]
                got = d.select(*p) if op == "select" else tuple(d.rank(*p, count=3))
                if got != expected[(op, p)]:
                    mismatches.append((op, p, got))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:3]
    assert not mismatches, mismatches[:3]
    assert d.cache_info()["entries"] <= 64


# -- imports -------------------------------------------------------------------------------------

def test_serving_path_imports_no_training_stack():
    code = ("import sys, gemm_costmodel.serving.runtime, gemm_costmodel.serving.ops, "
            "gemm_costmodel.serving.triton_adapter; "
            "bad=[m for m in ('xgboost','pandas','sklearn','onnxmltools') if m in sys.modules]; assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


# -- the cascade (issue 18: the cold decision) ------------------------------------------------------
def _cold_problems(count=120, seed=7):
    rng = np.random.default_rng(seed)
    return [(int(rng.choice([1, 2, 3, 7, 16, 33, 64, 100, 256, 1000, 4096, 4097, 16384])),
             int(rng.choice([512, 1000, 2048, 4096, 5120, 14336, 28672])),
             int(rng.choice([512, 896, 1048, 4096, 8192, 14336])), str(rng.choice(["bf16", "fp16", "fp8"])))
            for _ in range(count)]


def test_shipped_cascade_matches_the_whole_model():
    """The shipped dense model's cascade (20 of 100 trees on every shortlisted candidate, the rest on
    the best 32) picks what the whole model picks, with the whole model's score."""
    d = Dispatcher(gpu_name=GPU, models_dir=SHIPPED)
    assert d.model_for("bf16").cascade is not None, d.model_for("bf16").cascade_problem
    plain = Dispatcher(gpu_name=GPU, models_dir=SHIPPED)
    for dt in ("bf16", "fp16", "fp8"):
        plain.model_for(dt).cascade = None
    agree = 0
    problems = _cold_problems()
    for p in problems:
        a, b = d.select(*p), plain.select(*p)
        agree += a.candidate == b.candidate
        if a.candidate == b.candidate:
            assert a.score == pytest.approx(b.score, abs=1e-4)
    assert agree == len(problems)
    # rank() scores every candidate with the whole model: the same list.
    assert [c.candidate for c in d.rank(64, 4096, 4096, "bf16", count=20)] == \
        [c.candidate for c in plain.rank(64, 4096, 4096, "bf16", count=20)]


def test_broken_cascade_scores_with_the_whole_model(shipped_copy):
    (shipped_copy / "gemm-sm90-suffix.onnx").write_bytes(b"not a model")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)  # a broken cascade costs speed, not a fallback
        d = Dispatcher(gpu_name=GPU, models_dir=str(shipped_copy))
        model = d.model_for("bf16")
    assert model is not None and model.cascade is None
    assert "gemm-sm90-suffix.onnx" in model.cascade_problem and "bytes" in model.cascade_problem
    ref = Dispatcher(gpu_name=GPU, models_dir=SHIPPED)
    for p in _cold_problems(count=20, seed=8):
        assert d.select(*p).candidate == ref.select(*p).candidate
    os.remove(shipped_copy / "gemm-sm90-prefix.onnx")
    assert "missing" in Dispatcher(gpu_name=GPU, models_dir=str(shipped_copy)).model_for("fp16").cascade_problem


class _ScoresById:
    """A stand-in onnxruntime session: the score of a row is table[row[0]] (rows carry their id)."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float32)

    def run(self, _outputs, feeds):
        (X,) = feeds.values()
        return [self.table[X[:, 0].astype(int)].reshape(-1, 1)]


def test_cascade_keeps_every_row_tied_at_the_cut(model_dir):
    """Rows tied with the prefix's keep-th best all get the suffix: here rows 2-5 tie for the 3rd
    place by the prefix and row 5 is the whole model's best, which argpartition alone could drop."""
    model = Dispatcher(gpu_name=GPU, models_dir=model_dir).model_for("fp16")
    sign = model.sign
    prefix = _ScoresById(sign * np.array([0, 1, 2, 2, 2, 2, 3, 4, 5, 6]))
    suffix = _ScoresById(sign * np.array([5, 5, 5, 5, 5, -10, 0, 0, 0, 0]))
    model.cascade = (prefix, suffix, 3)
    rows = np.zeros((10, len(F.feature_names(op="gemm"))), dtype=np.float32)
    rows[:, 0] = np.arange(10)
    for perm in (np.arange(10), np.arange(10)[::-1], np.random.default_rng(1).permutation(10)):
        order, s = model.best(rows[perm], perm, 1)
        assert perm[order[0]] == 5 and s[0] == pytest.approx(-8.0)


def test_best_through_the_cascade_by_hand(model_dir):
    """best(): with keep >= the rows, the whole model scores everything; otherwise only the prefix's
    best `keep` rows get the suffix, and ties go to the lower tiebreak."""
    d = Dispatcher(gpu_name=GPU, models_dir=model_dir)
    model = d.model_for("fp16")
    assert model.cascade is not None
    prefix, suffix, _ = model.cascade
    rows = np.random.default_rng(0).random((40, len(F.feature_names(op="gemm")))).astype(np.float32) * 10
    tie = np.arange(40)
    whole = model.score(rows)
    model.cascade = (prefix, suffix, 40)
    order, s = model.best(rows, tie, 1)
    np.testing.assert_array_equal(order, np.lexsort((tie, whole))[:1])
    order, s = model.best(rows, tie, 5)  # a ranking: the whole model, exact order
    np.testing.assert_array_equal(order, np.lexsort((tie, whole))[:5])
    np.testing.assert_allclose(s, whole[order], atol=0)
    pre = model.score(rows, prefix)
    kept = np.argsort(pre, kind="stable")[:3]
    want = kept[np.lexsort((kept, whole[kept]))][:1]
    # With keep 3: the best of the prefix's 3 best rows by their whole-model scores.
    model.cascade = (prefix, suffix, 3)
    order, s = model.best(rows, tie, 1)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_allclose(s, whole[want], atol=1e-4)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 16, 17, 1024, 1025, 4096, 4097, 10 ** 6])
def test_shortlist_bucket_at_runtime_is_trainings(m):
    """The runtime finds M's shortlist bucket with bisect over the manifest's edges; training
    (model.m_bucket_index) with searchsorted: the same bucket at and around every edge."""
    from gemm_costmodel.learning.model import m_bucket_index

    d = Dispatcher(gpu_name=GPU)
    model = d.model_for("bf16")
    edges = tuple(model.manifest["shortlist"]["m_edges"])
    assert edges == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)  # the registry's dense edges
    ct = table("sm90", "bf16", op="gemm")
    ids = set(model.manifest["shortlist"]["buckets"][str(int(m_bucket_index(m, edges)))])
    np.testing.assert_array_equal(model.shortlist_mask(ct, m), [c in ids for c in ct.ids])
