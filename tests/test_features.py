"""Feature registry: names, schema hash, runtime/training parity and hand-computed values."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel.serving.candidates import table as candidate_table

H200 = hardware.spec_for("NVIDIA H200")
# Features that only make sense for a tiled kernel: zero on the vendor (cuBLAS) row.
TILE_FEATURES = ("tiles_m", "tiles_n", "log2_programs", "occupancy", "waves", "tail_fraction", "wave_efficiency",
                 "sm_fill", "pad_m", "pad_n", "pad_k", "k_iters", "m_fill", "acc_per_thread", "smem_kb",
                 "log2_tile_flops", "log2_t_waves_us", "log2_traffic_bytes", "traffic_over_l2", "log2_t_traffic_us")


def col(name: str) -> int:
    return F.FEATURE_NAMES.index(name)


def base_cols(m, n, k, variant, params: dict, dtype="fp8", spec=H200, e=1, top_k=1) -> dict:
    """One row of base columns (scalars)."""
    p = {q: 0 for q in F.PARAMS}
    p.update(params)
    return {"m": m, "n": n, "k": k, "e": e, "top_k": top_k, "dtype_code": F.DTYPE_CODES[dtype],
            "variant_code": F.VARIANT_CODES[variant], **p, **F.gpu_columns(spec, dtype)}


def runtime_cols(ct, idx, m, n, k, dtype="fp8", spec=H200) -> dict:
    """The dict the runtime builds: a scalar shape and candidate arrays (runtime.Dispatcher._score)."""
    return {"m": m, "n": n, "k": k, "e": 1, "top_k": 1, "dtype_code": F.DTYPE_CODES[dtype],
            "variant_code": ct.variant_code[idx], **{p: ct.params[p][idx] for p in F.PARAMS},
            **F.gpu_columns(spec, dtype)}


def frame_for(ct, idx, m, n, k, dtype="fp8", gpu="NVIDIA H200") -> pd.DataFrame:
    """The same (shape, candidate) rows as a dataset frame."""
    rows = []
    for i in idx:
        rows.append({"m": m, "n": n, "k": k, "e": 1, "top_k": 1, "dtype": dtype, "variant": ct.variants[i],
                     "gpu_name": gpu, **{p: int(ct.params[p][i]) for p in F.PARAMS}})
    return pd.DataFrame(rows)


# -- registry ----------------------------------------------------------------------

def test_registry_names_unique_and_in_order():
    names = [f.name for f in F.REGISTRY]
    assert len(names) == len(set(names))
    assert F.FEATURE_NAMES == tuple(names)
    assert names[:3] == ["log2_m", "log2_n", "log2_k"]
    # The config parameters appear in PARAMS order, contiguously.
    i = names.index(F.PARAMS[0])
    assert tuple(names[i:i + len(F.PARAMS)]) == F.PARAMS
    assert all(f.doc for f in F.REGISTRY)
    for t in TILE_FEATURES:
        assert t in names


def test_registering_a_duplicate_name_raises():
    before = list(F.REGISTRY)
    with pytest.raises(ValueError, match="registered twice"):
        F.feature("log2_m", "dup", lambda c: c.m)
    assert F.REGISTRY == before


def test_schema_hash_stable_and_tracks_version(monkeypatch):
    h = F.schema_hash(op="gemm")
    assert h == F.schema_hash(op="gemm")
    assert len(h) == 16 and all(c in "0123456789abcdef" for c in h)
    monkeypatch.setattr(F, "FEATURE_VERSION", F.FEATURE_VERSION + 1)
    assert F.schema_hash(op="gemm") != h
    monkeypatch.undo()
    assert F.schema_hash(op="gemm") == h


def test_schema_hash_tracks_feature_names(monkeypatch):
    h = F.schema_hash(op="gemm")
    monkeypatch.setattr(F, "FEATURE_NAMES", F.FEATURE_NAMES[:-1])
    assert F.schema_hash(op="gemm") != h


# -- runtime vs training path ---------------------------------------------------------

@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (7, 4097, 1000), (333, 2048, 7168), (4097, 1536, 512)])
def test_runtime_dict_equals_from_frame(m, n, k):
    ct = candidate_table("sm90", "fp8", op="gemm")
    idx = np.flatnonzero(ct.feasible_mask(m, n, k))
    assert len(idx) > 10
    runtime = F.compute(runtime_cols(ct, idx, m, n, k), op="gemm")
    training = F.from_frame(frame_for(ct, idx, m, n, k), hardware.spec_for)
    assert runtime.dtype == np.float32 and runtime.shape == (len(idx), len(F.FEATURE_NAMES))
    np.testing.assert_array_equal(runtime, training)


def test_scalar_only_input_gives_one_row():
    X = F.compute(base_cols(64, 1024, 1024, "tiled", {"block_m": 64, "block_n": 64, "block_k": 64, "group_m": 8,
                                                      "split_k": 1, "num_warps": 4, "num_stages": 3}), op="gemm")
    assert X.shape == (1, len(F.FEATURE_NAMES))


# -- hand-computed values ----------------------------------------------------------------

def test_tiled_features_by_hand():
    # fp8 on H200: 132 SMs, 228 KiB smem/SM, 60 MiB L2, 1979 TFLOP/s, 4800 GB/s; 1-byte inputs.
    p = {"block_m": 16, "block_n": 64, "block_k": 128, "group_m": 8, "split_k": 1, "num_warps": 4, "num_stages": 3}
    x = F.compute(base_cols(7, 4097, 1000, "tiled", p), op="gemm")[0]
    want = {
        "log2_m": math.log2(7), "log2_n": math.log2(4097), "log2_k": math.log2(1000),
        "dtype_code": 2, "in_bytes": 1, "variant_code": 0, "is_vendor": 0,
        "block_m": 16, "block_n": 64, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 3,
        "sm_count": 132, "peak_tflops": 1979, "hbm_gbps": 4800,
        "tiles_m": 1,                     # ceil(7 / 16)
        "tiles_n": 65,                    # ceil(4097 / 64): 64 * 64 = 4096, one more
        "k_iters": 8,                     # ceil(1000 / 128), no split
        "log2_programs": math.log2(65),   # 1 * 65 * 1
        # smem = 3 stages * (16 + 64) * 128 * 1 B = 30720 B = 30 KiB; floor(228 KiB / 30 KiB) = 7; warps: 64/4 = 16
        "smem_kb": 30, "occupancy": 7,
        "waves": 65 / (132 * 7),
        "tail_fraction": 65 / 924,
        "wave_efficiency": 65 / 924,      # one (partial) wave
        "sm_fill": 65 / 132,
        "pad_m": 1 - 7 / 16,
        "pad_n": 1 - 4097 / 4160,
        "pad_k": 1 - 1000 / 1024,
        "m_fill": 7 / 16,
        "acc_per_thread": 16 * 64 / 128,  # 8
        "log2_tile_flops": math.log2(2 * 16 * 64 * 1024),
        "log2_flops": math.log2(2 * 7 * 4097 * 1000),
        # inputs once (x: 7x1000, w: 4097x1000, 1 B) + output once (7x4097, 2 B)
        "log2_min_bytes": math.log2(7 * 1000 + 4097 * 1000 + 7 * 4097 * 2),
        # every program loads (16 + 64) x 1024 bytes; no split-K partials
        "log2_traffic_bytes": math.log2(65 * 80 * 1024),
        "traffic_over_l2": 65 * 80 * 1024 / (60 * 2**20),
    }
    for name, v in want.items():
        assert x[col(name)] == pytest.approx(v, rel=1e-6), name


def test_splitk_features_by_hand():
    p = {"block_m": 16, "block_n": 64, "block_k": 128, "group_m": 1, "split_k": 4, "num_warps": 4, "num_stages": 3}
    x = F.compute(base_cols(7, 4097, 1000, "splitk", p), op="gemm")[0]
    # 8 K tiles over 4 splits: 2 tiles (256 elements) per split; the 4 splits cover 1024 of K.
    programs = 1 * 65 * 4
    traffic = programs * (16 + 64) * 256 * 1 + 2 * 4 * 7 * 4097 * 4  # operands + fp32 partials written and read
    want = {
        "variant_code": 1, "split_k": 4,
        "tiles_m": 1, "tiles_n": 65, "k_iters": 2,
        "log2_programs": math.log2(260),
        "occupancy": 7,
        "waves": 260 / 924,
        "tail_fraction": 260 / 924,
        "sm_fill": 1.0,                   # 260 programs > 132 SMs
        "pad_m": 1 - 7 / 16,
        "pad_k": 1 - 1000 / 1024,
        "log2_tile_flops": math.log2(2 * 16 * 64 * 256),  # = 19
        "log2_flops": math.log2(2 * 7 * 4097 * 1000),
        "log2_traffic_bytes": math.log2(traffic),
        "log2_t_traffic_us": math.log2(traffic / 4800e9 * 1e6),
    }
    for name, v in want.items():
        assert x[col(name)] == pytest.approx(v, rel=1e-6), name
    assert x[col("log2_tile_flops")] == 19


def test_vendor_row_has_zero_tile_features():
    x = F.compute(base_cols(7, 4097, 1000, "vendor", {}), op="gemm")[0]
    assert np.all(np.isfinite(x))
    for name in TILE_FEATURES:
        assert x[col(name)] == 0.0, name
    assert x[col("is_vendor")] == 1.0 and x[col("variant_code")] == 3
    for name in F.PARAMS:
        assert x[col(name)] == 0.0, name
    # Roofline features do not depend on the tile and are still there.
    assert x[col("log2_flops")] == pytest.approx(math.log2(2 * 7 * 4097 * 1000), rel=1e-6)
    t_c = 2 * 7 * 4097 * 1000 / 1979e12 * 1e6
    t_m = (7 * 1000 + 4097 * 1000 + 7 * 4097 * 2) / 4800e9 * 1e6
    assert x[col("log2_t_compute_us")] == pytest.approx(math.log2(t_c), rel=1e-6)
    assert x[col("log2_t_memory_us")] == pytest.approx(math.log2(t_m), rel=1e-6)
    assert x[col("log2_t_roofline_us")] == pytest.approx(math.log2(max(t_c, t_m)), rel=1e-6)


def test_dtype_changes_bytes_and_peak():
    p = {"block_m": 64, "block_n": 64, "block_k": 64, "group_m": 8, "split_k": 1, "num_warps": 4, "num_stages": 3}
    bf = F.compute(base_cols(64, 1024, 1024, "tiled", p, dtype="bf16"), op="gemm")[0]
    f8 = F.compute(base_cols(64, 1024, 1024, "tiled", p, dtype="fp8"), op="gemm")[0]
    assert bf[col("in_bytes")] == 2 and f8[col("in_bytes")] == 1
    assert bf[col("peak_tflops")] == 989 and f8[col("peak_tflops")] == 1979
    assert bf[col("smem_kb")] == 2 * f8[col("smem_kb")]


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("m", [1, 7, 4097])
@pytest.mark.parametrize("n, k", [(4096, 4096), (4097, 1000), (16, 16), (65536, 65536)])
def test_weird_shapes_all_finite(m, n, k, dtype):
    ct = candidate_table("sm90", dtype, op="gemm")
    idx = np.arange(len(ct))  # every candidate, feasible or not
    X = F.compute(runtime_cols(ct, idx, m, n, k, dtype=dtype), op="gemm")
    assert np.all(np.isfinite(X))
    feas = np.flatnonzero(ct.feasible_mask(m, n, k))
    assert np.all(np.isfinite(F.compute(runtime_cols(ct, feas, m, n, k, dtype=dtype), op="gemm")))


def test_grouped_gemm_counts_topk_rows():
    p = {"block_m": 16, "block_n": 64, "block_k": 128, "group_m": 8, "split_k": 1, "num_warps": 4, "num_stages": 3}
    x = F.compute(base_cols(7, 4096, 1024, "tiled", p, e=8, top_k=2), op="gemm")[0]
    assert x[col("tiles_m")] == 1  # 14 rows
    assert x[col("log2_flops")] == pytest.approx(math.log2(2 * 14 * 4096 * 1024), rel=1e-6)


@pytest.mark.parametrize("missing", ["m", "variant_code", "hbm_gbps", "num_stages"])
def test_missing_base_column_raises(missing):
    cols = base_cols(7, 4097, 1000, "vendor", {})
    del cols[missing]
    with pytest.raises(ValueError, match=f"missing base column '{missing}'"):
        F.compute(cols, op="gemm")


def test_from_frame_unknown_gpu_raises():
    ct = candidate_table("sm90", "fp8", op="gemm")
    df = frame_for(ct, [0, 1], 7, 4096, 1024, gpu="Imaginary GPU X1")
    with pytest.raises(ValueError, match="Imaginary GPU X1"):
        F.from_frame(df, hardware.spec_for)


# -- the runtime's per-table path (CandidateFeatures, issue 18) ----------------------------------
H100 = hardware.spec_for("NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("op,dtype", [("gemm", "bf16"), ("gemm", "fp16"), ("gemm", "fp8"), ("fp8_blockscale", "fp8")])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (7, 1000, 1048), (64, 28672, 4096), (4097, 333, 517),
                                   (16384, 151936, 8192), (3, 16, 16)])
def test_candidate_features_equal_compute(op, dtype, m, n, k):
    """The cached path gives exactly the training path's matrix, on every feasible candidate and
    on an arbitrary subset in arbitrary order."""
    ct = candidate_table("sm90", dtype, op)
    fz = F.CandidateFeatures(ct.params, ct.variant_code, dtype, H100, op)
    idx = np.flatnonzero(ct.feasible_mask(m, n, k))
    assert len(idx) > 0
    sub = np.random.default_rng(m + n + k).permutation(idx)[: max(1, len(idx) // 3)]
    for rows in (idx, sub, idx[:1]):
        want = F.compute(runtime_cols(ct, rows, m, n, k, dtype, H100), op)
        got = fz.matrix(rows, m, n, k)
        assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(got, want)


def test_candidate_features_equal_compute_moe():
    from gemm_costmodel.kernels.moe import features as MF

    ct = candidate_table("sm90", "bf16", "moe")
    fz = F.CandidateFeatures(ct.params, ct.variant_code, "bf16", H100, "moe")
    for m, n, k, e, top_k, stage, routing in ((1, 1536, 2048, 128, 8, "gate_up", "balanced"),
                                               (4097, 2048, 768, 64, 6, "down", "zipf")):
        idx = np.flatnonzero(ct.feasible_mask(m, n, k))
        cols = runtime_cols(ct, idx, m, n, k, "bf16", H100)
        cols.update(e=e, top_k=top_k)
        inputs = MF.problem_inputs(m, e, top_k, stage=stage, block_m=ct.params["block_m"][idx], routing=routing)
        cols.update(inputs)
        np.testing.assert_array_equal(fz.matrix(idx, m, n, k, e, top_k, inputs), F.compute(cols, "moe"))


def test_feature_uses_labels_hold():
    """A "problem" feature is one value over all candidates of a problem; a "config" feature does not
    change with the problem (both checked on every candidate of the bf16 space)."""
    ct = candidate_table("sm90", "bf16", op="gemm")
    idx = np.arange(len(ct))
    a = F.compute(runtime_cols(ct, idx, 33, 5120, 8192, "bf16", H100), op="gemm")
    b = F.compute(runtime_cols(ct, idx, 4096, 1000, 1048, "bf16", H100), op="gemm")
    for j, f in enumerate(F.REGISTRY):
        if f.uses == "problem":
            assert np.all(a[:, j] == a[0, j]), f.name
        if f.uses == "config":
            np.testing.assert_array_equal(a[:, j], b[:, j], err_msg=f.name)
    assert {f.uses for f in F.REGISTRY} == set(F.USES)


def test_feature_uses_must_be_known():
    with pytest.raises(ValueError, match="uses must be one of"):
        F.feature("brand_new", "doc", lambda c: c.m, uses="shape")
    assert "brand_new" not in F.FEATURE_NAMES and all(f.name != "brand_new" for f in F.REGISTRY)


def test_feature_fn_is_log2_and_tile_zeroing_of_its_arg():
    """fn (training) is only_tiled(_log2(arg)) as the flags say; the runtime evaluates arg and
    applies the log2s and the zeroing per block (CandidateFeatures)."""
    ct = candidate_table("sm90", "bf16", op="gemm")
    idx = np.arange(len(ct))
    ctx = F._Ctx(runtime_cols(ct, idx, 33, 5120, 8192, "bf16", H100))
    for f in F.REGISTRY:
        want = f.arg(ctx)
        if f.log2:
            want = np.log2(np.maximum(want, 1e-30))
        if f.tiled_only:
            want = np.where(ctx.tiled, want, 0.0)
        np.testing.assert_array_equal(f.fn(ctx), want, err_msg=f.name)
    assert {f.name for f in F.REGISTRY if f.log2} >= {"log2_m", "log2_flops", "log2_programs", "log2_t_waves_us"}


def test_candidate_features_general_registry(monkeypatch):
    """CandidateFeatures' paths that the shipped registry does not take (a "both" feature that is
    not tiled-only, beside tiled-only ones; a log2 "both" feature that is not tiled-only; a
    tiled-only "problem"-labelled one) still equal compute."""
    monkeypatch.setattr(F, "REGISTRY", list(F.REGISTRY))
    F.feature("test_log2_rows_per_bn", "test", lambda c: c.rows / c.bn, log2=True)
    F.feature("test_n_per_bk", "test", lambda c: c.n / c.bk)
    F.feature("test_tiled_k", "test", lambda c: c.k + 0 * c.bm, uses="problem", tiled_only=True)
    monkeypatch.setattr(F, "FEATURE_NAMES", tuple(f.name for f in F.REGISTRY))
    ct = candidate_table("sm90", "fp8", op="gemm")
    fz = F.CandidateFeatures(ct.params, ct.variant_code, "fp8", H100, "gemm")
    assert fz._both_tiled is not None
    for m, n, k in ((1, 4096, 4096), (4097, 333, 517)):
        idx = np.flatnonzero(ct.feasible_mask(m, n, k))
        want = F.compute(runtime_cols(ct, idx, m, n, k, "fp8", H100), op="gemm")
        assert want.shape[1] == len(F.REGISTRY)
        np.testing.assert_array_equal(fz.matrix(idx, m, n, k), want)


@pytest.mark.parametrize("op,dtype", [("gemm", "bf16"), ("gemm", "fp8"), ("fp8_blockscale", "fp8"), ("moe", "bf16")])
@pytest.mark.parametrize("m,n,k,top_k", [(1, 4096, 4096, 1), (4097, 151936, 8192, 1), (16384, 28672, 18432, 8),
                                         (7, 333, 517, 6)])
def test_grouped_integer_factors_equal_the_formula_left_to_right(op, dtype, m, n, k, top_k):
    """traffic and log2_t_waves_us group their integer config factors (edge_bytes, occ_tile_mn2)
    so a decision computes them once per table: exact integer products, so bit for bit the
    formula written left to right, on every candidate of the table (split-K and vendor rows
    included) and at the largest problems the suites hold."""
    ct = candidate_table("sm90", dtype, op)
    idx = np.arange(len(ct.ids))
    cols = runtime_cols(ct, idx, m, n, k, dtype, H100)
    cols.update(top_k=top_k)
    c = F._Ctx(cols)
    left_to_right = (c.programs * c.tile_edge * c.k_per_split * c.in_b + c.partials_per_output * c.rows * c.n * 4)
    np.testing.assert_array_equal(c.traffic, left_to_right)
    np.testing.assert_array_equal(c.full_waves * c.occ_tile_mn2 * c.k_per_split,
                                  c.full_waves * c.occupancy * 2 * c.bm * c.bn * c.k_per_split)
    assert (c.traffic > 0).all()


# -- fp8_blockscale's own features (kernels/fp8_blockscale/features.py) --------------------------
def test_fp8_blockscale_pow2_features_known_answers():
    """log2 of the largest power of two dividing N and K, on every candidate row of a problem and
    in the training path: 7168 = 7 * 2^10, 12288 = 3 * 2^12, 2880 = 45 * 2^6, odd -> 0."""
    from gemm_costmodel.kernels.fp8_blockscale import features as BF

    np.testing.assert_array_equal(BF.pow2_part([7168, 12288, 2880, 4096, 4097, 1]), [10, 12, 6, 12, 0, 0])
    names = F.feature_names("fp8_blockscale")
    assert names[-2:] == ("log2_n_pow2", "log2_k_pow2") and names[:-2] == F.FEATURE_NAMES
    ct = candidate_table("sm90", "fp8", "fp8_blockscale")
    fz = F.CandidateFeatures(ct.params, ct.variant_code, "fp8", H100, "fp8_blockscale")
    for (m, n, k), want in (((1, 12288, 7168), (12, 10)), ((7, 333, 4096), (0, 12)), ((4097, 576, 1536), (6, 9))):
        idx = np.flatnonzero(ct.feasible_mask(m, n, k))
        got = fz.matrix(idx, m, n, k)[:, -2:]
        np.testing.assert_array_equal(got, np.tile(np.float32(want), (len(idx), 1)))


@pytest.mark.parametrize("bad", [0, -4, 6.5])
def test_fp8_blockscale_pow2_part_rejects_non_positive_integers(bad):
    from gemm_costmodel.kernels.fp8_blockscale import features as BF

    with pytest.raises(ValueError, match="positive integers"):
        BF.pow2_part([bad])


def test_fp8_blockscale_schema_hash_covers_its_features(monkeypatch):
    """A model trained before the features existed is refused: the op's hash changes with them,
    and the dense op's does not."""
    from gemm_costmodel import registry

    dense, now = F.schema_hash("gemm"), F.schema_hash("fp8_blockscale")
    spec = registry.REGISTRY["fp8_blockscale"]
    monkeypatch.setitem(registry.REGISTRY, "fp8_blockscale",
                        dataclasses.replace(spec, features="", extra_features=()))
    assert F.schema_hash("fp8_blockscale") != now
    assert F.schema_hash("gemm") == dense
