"""The fp8_blockscale op's suites, vendor rule, baselines (vLLM's lookup, the hand rule) and
the harness pieces its sweeps needed, against hand-computed answers."""
import json

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import precompile
from gemm_costmodel.kernels.shapes import TRAINING_FAMILIES
from gemm_costmodel.kernels.fp8_blockscale import baselines as B
from gemm_costmodel.kernels.fp8_blockscale import space as S
from gemm_costmodel.kernels.fp8_blockscale import suites


def test_eval_suite_covers_vllms_tuned_pairs_from_training_families_only():
    ev = suites.eval_suite()
    assert len(ev) == len(set(ev)) == 157
    assert {s.family for s in ev} <= set(TRAINING_FAMILIES)
    for n, k in suites.VLLM_H100_NK:
        assert {s.m for s in ev if (s.n, s.k) == (n, k)} == set(suites.EVAL_M_VLLM)
    # Every training family other than DeepSeek-V3 contributes its own (N, K).
    assert {s.family for s in ev} == set(TRAINING_FAMILIES)
    assert all(s.family == "gate" for s in suites.gate_suite())


@pytest.mark.parametrize("m, n, k, ok", [
    (16, 7168, 2048, True), (100, 1536, 7168, True), (4096, 7168, 18432, True),
    (1, 7168, 2048, False),      # CUBLAS_STATUS_NOT_SUPPORTED on the H100 (M % 4)
    (4097, 24576, 1536, False),  # likewise
    (16, 7168, 2304, False),     # 18 scale groups: wrong results on the H100 (K % 512)
    (64, 7168, 128, False),      # 1 scale group: wrong results
    (32, 1000, 1024, False),     # N % 16: refused by torch
])
def test_vendor_rule_matches_the_h100_probe(m, n, k, ok):
    good, why = S.check_feasible(S.VendorConfig(), S.Problem(m, n, k, "fp8"))
    assert good == ok
    assert ok or "torch._scaled_mm" in why
    # The one feasibility source: the vectorised mask agrees.
    cfgs = S.generate_configs("sm90", "fp8")
    mask = S.problem_mask(S.ConfigArrays(cfgs), S.Problem(m, n, k, "fp8"))
    assert bool(mask[[c.id for c in cfgs].index("cublas")]) == ok


def test_cublas_refusal_is_unsupported_not_a_crash():
    exc = RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmulAlgoGetHeuristic(...)`")
    assert C.classify_exception(exc) == C.STATUS_UNSUPPORTED
    assert C.classify_exception(RuntimeError("Invalid scaling configuration.")) == C.STATUS_UNSUPPORTED
    assert C.classify_exception(RuntimeError("CUDA error: an illegal memory access was encountered")) == C.STATUS_CRASH
    assert C.STATUS_UNSUPPORTED in C.CONFIG_FAILURES


def test_precompile_specialises_on_the_scale_stride():
    # K = 7168 and 18432 agree on every divisibility of K but not on ceil(K/128) % 16 (56 vs 144),
    # which Triton specialises the scale tensors' row stride on.
    a = precompile.specialisation(S.Problem(100, 7168, 7168, "fp8"))
    b = precompile.specialisation(S.Problem(100, 7168, 18432, "fp8"))
    assert a != b
    assert precompile.specialisation(S.Problem(1, 7168, 7168, "fp8")) == a


def _vllm_file(folder, n, k, body, device="NVIDIA_H100_80GB_HBM3"):
    path = folder / f"N={n},K={k},device_name={device},dtype=fp8_w8a8,block_shape=[128,128].json"
    path.write_text(json.dumps(body))
    return path


def test_vllm_tables_nearest_m_lookup_and_default(tmp_path):
    e = lambda bm, st: {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,  # noqa: E731
                        "num_warps": 4, "num_stages": st}
    _vllm_file(tmp_path, 2048, 512, {"1": e(16, 3), "16": e(32, 3), "64": e(64, 4)})
    _vllm_file(tmp_path, 2048, 512, {"1": e(128, 3)}, device="NVIDIA_H200")
    tables = B.load_vllm_tables(str(tmp_path), "NVIDIA H100 80GB HBM3")
    assert set(tables) == {(2048, 512)}
    pick = lambda m: B.vllm_pick(tables, m, 2048, 512)  # noqa: E731
    assert pick(1) == ("bstiled_m16n128k128_g32_w4s3", "tuned")
    assert pick(9)[0] == "bstiled_m32n128k128_g32_w4s3"   # |9-1| = 8 > |9-16| = 7
    assert pick(40)[0] == "bstiled_m32n128k128_g32_w4s3"  # a tie (24, 24): vLLM's min() keeps the first key
    assert pick(5000)[0] == "bstiled_m64n128k128_g32_w4s4"
    assert B.vllm_pick(tables, 16, 4096, 512) == (S.vllm_default().id, "default")
    assert B.load_vllm_tables(str(tmp_path / "missing")) == {}


def test_vllm_table_with_unknown_key_names_the_file(tmp_path):
    _vllm_file(tmp_path, 256, 7168, {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                                           "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3, "kpack": 2}})
    with pytest.raises(ValueError, match=r"N=256,K=7168.*M=1.*unknown \['kpack'\]"):
        B.load_vllm_tables(str(tmp_path))


def _rows(shapes):
    """Eval rows: {(m, n, k): {candidate: p50}} -> frame with sid, variant."""
    out = []
    for sid, ((m, n, k), times) in enumerate(shapes.items()):
        for cid, t in times.items():
            out.append(dict(sid=sid, m=m, n=n, k=k, candidate=cid, p50_us=t,
                            variant="vendor" if cid == "cublas" else S.config_from_id(cid).variant))
    return pd.DataFrame(out)


def test_hand_rule_fits_one_config_per_arm_on_training_shapes():
    a, b, c = "bstiled_m16n64k128_g1_w4s3", "bstiled_m128n128k128_g32_w8s3", "bstiled_m64n128k128_g32_w4s3"
    shapes = {(1, 4096, 7168): {a: 10.0, b: 30.0, c: 12.0, "cublas": 1.0},
              (2, 4096, 7168): {a: 10.0, b: 30.0, c: 11.0},
              (8192, 4096, 7168): {a: 90.0, b: 40.0, c: 50.0},
              (4096, 8192, 7168): {a: 95.0, b: 41.0, c: 52.0},
              (1, 7168, 512): {a: 5.0, b: 9.0, c: 4.0}}
    arms = B.fit_arms(_rows(shapes))
    # The vendor is never an arm's kernel (a hand rule picks among fixed kernels).
    assert "cublas" not in arms.kernels
    assert arms.pick(1, 4096, 7168) == a and arms.pick(8192, 4096, 7168) == b
    assert arms.pick(1, 7168, 512) == c
    assert arms.arm(1, 4096, 7168)[0] == 1 and arms.arm(1, 7168, 512)[0] == 0


def test_registry_wires_the_ops_baselines_and_defaults():
    assert registry.get("gemm").baseline_picks(None, None) == {}
    assert registry.get("gemm").report_sections(None) == []
    spec = registry.get("fp8_blockscale")
    assert spec.vendor_ids == ("cublas",)
    # The dense op's power-of-2-of-M shortlist at 3% (issue 58, docs/dispatch-latency-ops.md).
    assert spec.train_defaults["shortlist_tol"] == 1.03
    assert set(spec.suites) == {"train", "eval", "gate"}


@pytest.mark.data  # re-reads every committed fp8_blockscale parquet file
def test_shipped_fp8_blockscale_data_is_complete():
    from gemm_costmodel.learning.pipeline import load_training_frame

    df = load_training_frame(op="fp8_blockscale")
    ev = df[df["eval_shape"].astype(bool)]
    # The same 157 evaluation shapes on each card whose rows the model learns from.
    per_gpu = ev.groupby("gpu_name")[["m", "n", "k"]].apply(lambda g: len(g.drop_duplicates()))
    assert per_gpu.to_dict() == {"NVIDIA H100 80GB HBM3": 157, "NVIDIA H200": 157}
    # On each card, every evaluation shape has every feasible candidate measured (the oracle is exact).
    for (gpu, m, n, k), g in ev.groupby(["gpu_name", "m", "n", "k"]):
        want = {c.id for c in S.feasible_configs(S.Problem(int(m), int(n), int(k), "fp8"))}
        assert want <= set(g["candidate"]), (gpu, m, n, k)
    assert np.isfinite(ev.loc[ev["status"] == "ok", "p50_us"]).all()


H100 = "NVIDIA H100 80GB HBM3"


def test_out_of_space_rows_are_skipped_by_their_problem():
    """A row is skipped when its candidate is outside the space for its own problem: the same GEMV
    config runs at K = 2048 and is ruled out at K = 512 (tile > 2x K); an unknown id is skipped;
    the space's rules do not touch another op's frame."""
    from gemm_costmodel.data import dataset as D

    rows = [(1, 4096, 2048, "bsgemv_n2k2048_w4"), (1, 4096, 512, "bsgemv_n2k2048_w4"),
            (1, 4096, 512, "bsgemv_n2k1024_w4"), (1, 4096, 512, "bsgemv_n2k4096_w4"),
            (64, 4096, 512, "bsgemv_n2k512_w4"), (64, 4096, 512, S.vllm_default().id)]
    df = pd.DataFrame(rows, columns=["m", "n", "k", "candidate"]).assign(dtype="fp8")
    assert D.out_of_space(df, "fp8_blockscale", "sm90").tolist() == [False, True, False, True, True, False]


@pytest.mark.data  # re-reads every committed fp8_blockscale parquet file
def test_shipped_data_skips_only_the_out_of_space_rows():
    # The shipped data: only the 160 ok GEMV rows with a tile over 2x K (K = 128 to 896, measured
    # before the rule) and the 4 failed vendor rows the vendor rule came from are skipped.
    from gemm_costmodel.learning.pipeline import load_training_frame

    said = []
    load_training_frame(op="fp8_blockscale", log=said.append)
    assert said == ["data: 164 rows of candidates the fp8_blockscale space now rules out skipped "
                    "(ok 160, wrong 2, unsupported 2)"]


def test_shipped_fp8_blockscale_model_serves_the_op():
    import os

    from gemm_costmodel.serving import features as F
    from gemm_costmodel.serving.runtime import Dispatcher

    models = os.path.join(os.path.dirname(registry.__file__), "..", "models")
    man = json.load(open(os.path.join(models, "fp8_blockscale-sm90.json"), encoding="utf-8"))
    assert man["op"] == "fp8_blockscale" and man["feature_schema_hash"] == F.schema_hash("fp8_blockscale")
    d = Dispatcher(gpu_name=H100, op="fp8_blockscale")
    for m, n, k in [(1, 7168, 2048), (7, 576, 7168), (4097, 1000, 1000), (4096, 7168, 18432)]:
        c = d.select(m, n, k, "fp8")
        assert c.source == "model", (m, n, k, c)
        assert S.check_feasible(S.config_from_id(c.candidate), S.Problem(m, n, k, "fp8"))[0]
    # The vendor is never chosen where cuBLASLt refuses the problem (M % 4).
    assert all(ch.candidate != "cublas" for ch in d.rank(7, 7168, 2048, "fp8", count=400))


def test_export_vllm_from_the_shipped_model(tmp_path):
    from gemm_costmodel.learning import vllm_export as V

    (path, table), = V.export([(5120, 8960)], str(tmp_path), gpu_name=H100)
    body = json.load(open(path, encoding="utf-8"))
    assert list(body) == [str(m) for m in V.VLLM_M_GRID]
    for m, entry in body.items():
        cfg = S.from_vllm(entry)
        assert S.check_feasible(cfg, S.Problem(int(m), 5120, 8960, "fp8"))[0]
    assert "N=5120,K=8960,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json" in path
