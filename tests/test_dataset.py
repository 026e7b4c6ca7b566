"""Dataset loader, importers and data card against known answers and broken files."""
from __future__ import annotations

import gzip
import json
import os
import math
import re

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.data import datacard as DC
from gemm_costmodel.data import dataset as D
from gemm_costmodel.data import importers as I
from gemm_costmodel.cli import main as cli_main


def good_row(**kw) -> dict:
    row = {"m": 7, "n": 96, "k": 64, "dtype": "bf16", "candidate": "tiled_m16n32k64_g8_w4s3",
           "variant": "tiled", "block_m": 16, "block_n": 32, "block_k": 64, "group_m": 8, "split_k": 1,
           "num_warps": 4, "num_stages": 3, "status": "ok", "p20_us": 9.0, "p50_us": 10.0, "p80_us": 11.0,
           "stable": True, "eval_shape": False, "arch": "sm90", "gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-x",
           "sm_count": 132, "driver": "580", "torch_version": "2.11", "triton_version": "3.6",
           "git_sha": "abc", "timestamp": "2026-11-21T00:00:00+00:00", "origins": "qwen2.5/Qwen2.5-0.5B/o_proj/tp1",
           "family": "qwen2.5", "e": 1, "top_k": 1}
    row.update(kw)
    return row


VENDOR_PARAMS = dict(variant="vendor", block_m=0, block_n=0, block_k=0, group_m=0, split_k=0, num_warps=0,
                     num_stages=0)


def write_jsonl(path, rows):
    with gzip.open(path, "wt") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return str(path)


def write_parquet(path, rows):
    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


@pytest.mark.data  # re-reads every committed parquet file (tens of seconds)
def test_committed_dataset_loads_typed_and_valid():
    df = D.load_dataset()
    assert len(df) > 50_000
    assert set(df["dtype"].astype(str)) >= {"bf16", "fp16", "fp8"}
    assert df["m"].dtype == np.int64 and df["p50_us"].dtype == np.float64 and df["stable"].dtype == bool
    assert isinstance(df["status"].dtype, pd.CategoricalDtype)
    ok = df[df["status"] == "ok"]
    assert (ok["p50_us"] > 0).all() and (ok["p20_us"] <= ok["p50_us"]).all() and (ok["p50_us"] <= ok["p80_us"]).all()
    assert not df.duplicated(D.KEY).any()
    # Every row has provenance.
    for col in ("gpu_name", "gpu_uuid", "driver", "torch_version", "triton_version", "git_sha", "timestamp"):
        assert (df[col].astype(str).str.len() > 0).all(), col
    # Training shapes come only from the families each op's issue names; the MoE op's held-out
    # families appear only in evaluation shapes (every candidate measured).
    from gemm_costmodel.kernels.shapes import TRAINING_FAMILIES
    from gemm_costmodel.kernels.moe.suites import HELDOUT_FAMILIES as MOE_HELDOUT
    from gemm_costmodel.kernels.moe.suites import TRAINING_FAMILIES as MOE_TRAINING

    def fams(rows):
        return {o.split("/")[0] for s in rows["origins"] for o in s.split(";")}

    op = df["op"].astype(str)
    # The grouped GEMM (MoE training's expert GEMMs) and vLLM's fused-MoE kernel draw their suites from
    # the MoE op's families.
    moe_family_ops = op.isin(["moe", "grouped_gemm", "vllm_moe"])
    assert fams(df[~moe_family_ops]) <= set(TRAINING_FAMILIES)
    moe = df[moe_family_ops]
    assert fams(moe[~moe["eval_shape"]]) <= set(MOE_TRAINING)
    assert fams(moe) <= set(MOE_TRAINING) | set(MOE_HELDOUT)
    assert fams(moe[moe["eval_shape"]]) & set(MOE_HELDOUT)


@pytest.mark.data  # re-reads every committed parquet file (tens of seconds)
def test_committed_parquet_flags_match_what_the_build_writes():
    """Each committed parquet file holds the evaluation flags `build_parquet` gives its shard now:
    no evaluation shape of it is incomplete for the current space or has an out-of-memory row.
    A file built before its op's space grew (the MoE evaluation files kept swap-AB-less runs
    flagged as evaluation after swap-AB joined) would mix superseded runs into the oracle."""
    stale = {}
    for p in D.dataset_files():
        _, oom, incomplete = D.build_rules(D.read_file(p))
        if oom or incomplete:
            stale[p] = (len(oom), len(incomplete))
    assert not stale, f"rebuild with `costmodel dataset build`: (oom, incomplete) eval shapes per file {stale}"


def test_dataset_files_under_50mb():
    import os

    for p in D.dataset_files():
        assert os.path.getsize(p) < D.MAX_FILE_BYTES


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.pop("p50_us"), "missing column 'p50_us'"),
    (lambda r: r.update(m=0), "column 'm': non-positive value 0"),
    (lambda r: r.update(k=-5), "column 'k': non-positive value -5"),
    (lambda r: r.update(p50_us=-1.0), "column 'p50_us': negative time"),
    (lambda r: r.update(p50_us=float("nan")), "column 'p50_us': NaN time"),
    (lambda r: r.update(status="slow"), "column 'status': unknown value 'slow'"),
    (lambda r: r.update(dtype="int4"), "column 'dtype': unknown value 'int4'"),
    (lambda r: r.update(n="ninety"), "column 'n'"),
    (lambda r: r.update(m=7.5), "column 'm': non-integer"),
    # Infinite times, on ok and failed rows alike (NaN is how a failed row says 'not timed').
    (lambda r: r.update(p50_us=float("inf"), p80_us=float("inf")), "column 'p50_us': infinite time inf in row 1"),
    (lambda r: r.update(status="wrong", p20_us=-float("inf"), p50_us=np.nan, p80_us=np.nan),
     "column 'p20_us': infinite time -inf in row 1"),
    (lambda r: r.update(status="crash", p20_us=np.nan, p50_us=np.nan, p80_us=float("inf")),
     "column 'p80_us': infinite time inf in row 1"),
    # Percentiles out of order.
    (lambda r: r.update(p20_us=10.5), "column 'p20_us': p20_us 10.5 > p50_us 10.0 in row 1"),
    (lambda r: r.update(p80_us=9.5), "column 'p50_us': p50_us 10.0 > p80_us 9.5 in row 1"),
    # Experts.
    (lambda r: r.update(e=2, top_k=4), "column 'top_k': 4 experts per token > e = 2 in row 1"),
    (lambda r: r.update(e=0), "column 'e': non-positive value 0 in row 1"),
    (lambda r: r.update(top_k=0), "column 'top_k': non-positive value 0 in row 1"),
    # Config parameters: set on a Triton candidate, never negative, as the id says.
    (lambda r: r.update(block_m=0), "column 'block_m': 0 on Triton candidate 'tiled_m16n32k64_g8_w4s3' in row 1"),
    (lambda r: r.update(num_stages=0), "column 'num_stages': 0 on Triton candidate"),
    (lambda r: r.update({**VENDOR_PARAMS, "candidate": "cublas", "block_n": -1}),
     "column 'block_n': negative value -1"),
    (lambda r: r.update(sm_count=-132), "column 'sm_count': negative value -132 in row 1"),
    (lambda r: r.update(split_k=4),
     "column 'split_k': 4 in row 1 disagrees with candidate 'tiled_m16n32k64_g8_w4s3' (its split_k is 1)"),
    (lambda r: r.update(variant="splitk"), "column 'variant': splitk in row 1 disagrees with candidate"),
    (lambda r: r.update(candidate="cublas"), "column 'variant': tiled in row 1 disagrees with candidate 'cublas'"),
    (lambda r: r.update(candidate="tiled_m16n32k64_g8_w4"),
     "column 'candidate': unknown config id 'tiled_m16n32k64_g8_w4' in row 1"),
])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl.gz"])
def test_loader_rejects_bad_data_naming_file_and_column(tmp_path, mutate, match, fmt):
    bad = good_row(m=8)
    mutate(bad)
    first = good_row()
    if match.startswith("missing column"):
        mutate(first)  # a column is missing only if no row has it
    rows = [first, bad]
    path = tmp_path / f"bad.{fmt}"
    if fmt == "parquet":
        if isinstance(bad.get("n"), str):
            pytest.skip("parquet cannot hold mixed int/str columns")
        write_parquet(path, rows)
    else:
        write_jsonl(path, rows)
    with pytest.raises(D.DataError) as exc:
        D.load_dataset([path])
    assert str(path) in str(exc.value) and match in str(exc.value)


def test_failed_rows_may_have_nan_time(tmp_path):
    path = write_parquet(tmp_path / "f.parquet", [good_row(), good_row(candidate="cublas", **VENDOR_PARAMS,
                                                   status="compile_error", p20_us=np.nan, p50_us=np.nan,
                                                   p80_us=np.nan)])
    df = D.load_dataset([path])
    assert sorted(df["status"].astype(str)) == ["compile_error", "ok"]


def test_unreadable_and_empty_files(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(D.DataError, match="junk.parquet: unreadable"):
        D.load_dataset([junk])
    with pytest.raises(D.DataError, match="no such file"):
        D.load_dataset([tmp_path / "missing.parquet"])
    with pytest.raises(D.DataError, match="no data files"):
        D.load_dataset(root=str(tmp_path / "empty"))


def test_duplicates_merge_by_median(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", [good_row(p20_us=1.0, p50_us=10.0, p80_us=11.0, stable=False),
                                               good_row(p20_us=2.0, p50_us=30.0, p80_us=31.0, stable=False)])
    b = write_parquet(tmp_path / "b.parquet", [good_row(p20_us=3.0, p50_us=14.0, p80_us=15.0, stable=False),
                                               good_row(status="wrong", p20_us=0.9, p50_us=1.0, p80_us=1.1)])
    df = D.load_dataset([a, b])
    assert len(df) == 1
    r = df.iloc[0]
    assert (r["p20_us"], r["p50_us"], r["p80_us"]) == (2.0, 14.0, 15.0)
    assert r["status"] == "ok" and not r["stable"]  # the wrong duplicate is dropped; all unstable -> unstable


def test_stable_duplicates_supersede_unstable_ones(tmp_path):
    # A glitched unstable measurement (64.5) and its stable re-measurements (12.7, 13.1).
    a = write_parquet(tmp_path / "a.parquet", [good_row(p20_us=63.0, p50_us=64.5, p80_us=77.0, stable=False)])
    b = write_parquet(tmp_path / "b.parquet", [good_row(p20_us=12.5, p50_us=12.7, p80_us=12.9),
                                               good_row(p20_us=12.9, p50_us=13.1, p80_us=13.3)])
    r = D.load_dataset([a, b]).iloc[0]
    assert r["p50_us"] == pytest.approx(12.9) and r["p20_us"] == pytest.approx(12.7) and r["stable"]


def test_complete_evaluation_runs_supersede_other_rows_of_a_key(tmp_path):
    # Two older runs of a shape (demoted: the space grew since) and one complete run;
    # the shape's oracle must come from the complete run alone, whatever the others say.
    old = write_parquet(tmp_path / "old.parquet", [good_row(p50_us=10.0), good_row(p50_us=10.4)])
    new = write_parquet(tmp_path / "new.parquet", [good_row(p50_us=9.0, eval_shape=True)])
    r = D.load_dataset([old, new]).iloc[0]
    assert r["p50_us"] == pytest.approx(9.0) and bool(r["eval_shape"])
    # Without an evaluation row, every row of the key still counts (median).
    r = D.load_dataset([old]).iloc[0]
    assert r["p50_us"] == pytest.approx(10.2) and not bool(r["eval_shape"])
    # Two complete runs of the same key are both kept: their median (here the mean).
    again = write_parquet(tmp_path / "again.parquet", [good_row(p50_us=9.4, eval_shape=True)])
    assert D.load_dataset([old, new, again]).iloc[0]["p50_us"] == pytest.approx(9.2)


def test_rows_of_a_superseding_l2_policy_replace_every_row_of_their_decode_shape(tmp_path):
    other = "tiled_m32n32k64_g8_w4s3"
    params = dict(block_m=32)
    assert D.SUPERSEDE_MAX_M == 4
    old = write_parquet(tmp_path / "old.parquet", [
        good_row(m=4, p50_us=10.0, l2_policy="rotate", eval_shape=True),
        good_row(m=4, candidate=other, p50_us=10.5, l2_policy="rotate", eval_shape=True, **params),
        good_row(m=3, p50_us=10.7, l2_policy="rotate")])
    new = write_parquet(tmp_path / "new.parquet", [good_row(m=4, p50_us=10.8, l2_policy="rotate_experts")])
    df = D.load_dataset([old, new])
    # Shape 4x96x64: only the re-measured row stays (the old run's other candidate is gone too,
    # and so is its evaluation flag); shape 3x96x64, never re-measured, keeps its row.
    s4 = df[df["m"] == 4]
    assert s4["candidate"].tolist() == [good_row()["candidate"]] and s4["p50_us"].tolist() == [10.8]
    assert not s4["eval_shape"].any() and s4["l2_policy"].tolist() == ["rotate_experts"]
    assert df[df["m"] == 3]["p50_us"].tolist() == [10.7]
    assert len(D.load_dataset([old])) == 3


def test_rows_of_both_l2_policies_sit_side_by_side_past_decode(tmp_path):
    """From M = 5 on, a shape's rows under the superseding policy join its others: a model-guided
    pick keeps the problem's random sample beside it, and a key timed under both is the median."""
    other = "tiled_m32n32k64_g8_w4s3"
    old = write_parquet(tmp_path / "old.parquet", [
        good_row(m=5, p50_us=10.0, l2_policy="rotate"),
        good_row(m=5, candidate=other, p50_us=10.5, l2_policy="rotate", block_m=32)])
    new = write_parquet(tmp_path / "new.parquet", [good_row(m=5, p50_us=10.8, l2_policy="rotate_experts")])
    df = D.load_dataset([old, new]).set_index("candidate")
    assert len(df) == 2
    assert df.loc[good_row()["candidate"], "p50_us"] == pytest.approx(10.4)
    assert df.loc[other, "p50_us"] == pytest.approx(10.5)


def test_build_parquet_roundtrip(tmp_path):
    raw = write_jsonl(tmp_path / "train-bf16-shard00of02.jsonl.gz",
                      [good_row(), good_row(dtype="fp16", m=3), good_row(m=9, hostname="x", rel_err=1e-3)])
    out = D.build_parquet([raw], str(tmp_path / "ds"))
    assert sorted(p.split("/")[-2] for p in out) == ["bf16", "fp16"]
    df = D.load_dataset(root=str(tmp_path / "ds"))
    assert len(df) == 3 and "hostname" not in df.columns
    assert df.loc[df["m"] == 9, "rel_err"].iloc[0] == pytest.approx(1e-3)
    assert df.loc[df["m"] == 7, "op"].iloc[0] == "gemm" and df["e"].eq(1).all()


def _eval_rows(m, n, k, dtype="fp16", drop=0):
    from gemm_costmodel.kernels.gemm.space import Problem, config_params, feasible_configs

    cfgs = feasible_configs(Problem(m, n, k, dtype), "sm90")
    return [good_row(m=m, n=n, k=k, dtype=dtype, candidate=c.id, variant=c.variant, eval_shape=True,
                     **config_params(c)) for c in cfgs[: len(cfgs) - drop]]


def test_build_demotes_incomplete_eval_shapes(tmp_path):
    # Two evaluation shapes: one with every feasible candidate, one cut short
    # by a stopped sweep (its last candidate missing).
    raw = write_jsonl(tmp_path / "eval-fp16-shard01of40.jsonl.gz",
                      _eval_rows(7, 96, 64) + _eval_rows(33, 96, 64, drop=1))
    msgs = []
    D.build_parquet([raw], str(tmp_path / "ds"), log=msgs.append)
    df = D.load_dataset(root=str(tmp_path / "ds"))
    per_shape = df.groupby("m")["eval_shape"].agg(["all", "any"])
    assert per_shape.loc[7, "all"] and not per_shape.loc[33, "any"]
    demoted = [m for m in msgs if "incomplete evaluation shape" in m]
    assert len(demoted) == 1 and "1 incomplete evaluation shape" in demoted[0] and "fp16:33x96x64" in demoted[0]
    n_rows = len(_eval_rows(7, 96, 64)) + len(_eval_rows(33, 96, 64)) - 1
    assert msgs[0] == f"{raw}: rows by status: ok {n_rows} ({n_rows} rows, 2 shapes)"  # the sweep's health


def test_import_csv_keeps_foreign_arch(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("M,N,K,dtype,candidate,latency_us,arch,gpu_name\n"
                 "16,4096,4096,bf16,tiled_m16n64k128_g8_w4s3,12.5,sm80,NVIDIA A100\n"
                 "1,1024,512,fp16,my_kernel_v2,3.0,gfx942,MI300X\n")
    df = I.import_csv(str(p))
    assert list(df["arch"]) == ["sm80", "gfx942"]
    r0, r1 = df.iloc[0], df.iloc[1]
    assert (r0["variant"], r0["block_n"], r0["block_k"], r0["p50_us"], r0["source"]) == ("tiled", 64, 128, 12.5, "csv")
    assert (r1["variant"], r1["block_m"], r1["candidate"]) == ("foreign", 0, "my_kernel_v2")


@pytest.mark.parametrize("text, match", [
    ("M,N,K,dtype,candidate,arch\n1,2,3,bf16,x,sm90\n", "missing column 'latency_us'"),
    ("M,N,K,dtype,candidate,latency_us,arch\n1,2,3,bf16,x,fast,sm90\n", "latency_us"),
    ("M,N,K,dtype,candidate,latency_us,arch\n0,2,3,bf16,x,1.0,sm90\n", "column 'm': non-positive"),
    ("M,N,K,dtype,candidate,latency_us,arch\n1,2,3,int4,x,1.0,sm90\n", "column 'dtype'"),
    ("", "empty file"),
])
def test_import_csv_rejects_bad_files(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(D.DataError, match=match):
        I.import_csv(str(p))


def test_import_vllm_table(tmp_path):
    name = "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"
    body = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                  "num_warps": 4, "num_stages": 4},
            "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
                   "num_warps": 8, "num_stages": 3},
            "triton_version": "3.1.0"}
    (tmp_path / name).write_text(json.dumps(body))
    df = I.import_vllm(str(tmp_path / name), hidden=4096, top_k=2)
    assert list(df["m"]) == [1, 64]
    r = df.iloc[1]
    assert (r["op"], r["e"], r["n"], r["k"], r["top_k"], r["dtype"], r["arch"]) == \
        ("fused_moe", 8, 14336, 4096, 2, "fp8", "sm90")
    assert r["candidate"] == "vllm_m64n128k128_g16_w8s3" and math.isnan(r["p50_us"]) and r["source"] == "vllm"
    bs = "E=256,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    (tmp_path / bs).write_text(json.dumps({"1": body["1"]}))
    assert I.import_vllm(str(tmp_path / bs), hidden=7168)["op"].iloc[0] == "fused_moe_blockscale"
    (tmp_path / "E=1,N=1,device_name=X,dtype=int8_w8a16.json").write_text("{}")
    with pytest.raises(D.DataError, match="unsupported vLLM dtype"):
        I.import_vllm(str(tmp_path / "E=1,N=1,device_name=X,dtype=int8_w8a16.json"), hidden=1)


def test_arch_of():
    assert I.arch_of("NVIDIA_H100_80GB_HBM3") == "sm90"
    assert I.arch_of("NVIDIA H200") == "sm90"
    assert I.arch_of("NVIDIA A100-SXM4-80GB") == "sm80"
    assert I.arch_of("Some GPU") == "unknown"


def test_cli_import_errors(tmp_path, capsys):
    assert cli_main(["import", "vllm", "x.json", "--out", str(tmp_path / "o.parquet")]) == 2
    assert "pass --hidden" in capsys.readouterr().err
    assert cli_main(["import", "csv", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("costmodel: error:") and "no such file" in err and "\n" not in err


def _eval_frame():
    rows = []
    # Two evaluation shapes, 3 candidates each; hand-computed figures below.
    lat = {(1, "a"): 10.0, (1, "b"): 20.0, (1, "cublas"): 10.05,
           (2, "a"): 40.0, (2, "b"): 20.0, (2, "cublas"): 30.0}
    for (m, c), t in lat.items():
        rows.append(good_row(m=m, candidate={"a": DC.DEFAULT_CONFIG, "b": "splitk_m16n32k64_s2_w4s3"}.get(c, c),
                             variant="vendor" if c == "cublas" else "tiled", p20_us=t, p50_us=t, p80_us=t,
                             eval_shape=True))
    return D.normalize(pd.DataFrame(rows))


def test_eval_figures_hand_computed():
    figs = DC.eval_figures(_eval_frame(), tie_tol=0.01)
    assert len(figs) == 1  # one GPU, one dtype: figures are keyed by (gpu_name, dtype)
    f = next(v for (gpu, dtype), v in figs.items() if dtype == "bf16")
    assert f["eval_shapes"] == 2
    # Triton oracle: 10 and 20; cuBLAS 10.05 and 30 -> geomean(1.005, 1.5)
    assert f["cublas_over_triton_oracle"] == pytest.approx(math.sqrt(1.005 * 1.5))
    # Default config: 10/10 and 40/20 -> geomean(1, 2)
    assert f["default_slowdown"] == pytest.approx(math.sqrt(2))
    # Static configs: default sqrt(2), split-K sqrt(2*1)=sqrt(2), cublas sqrt(1.005*1.5)=1.2278 -> cublas
    assert f["best_static_config"] == "cublas"
    assert f["best_static_slowdown"] == pytest.approx(math.sqrt(1.005 * 1.5))
    # Ties within 1%: shape 1 has the default and cuBLAS (10.05 <= 10.1), shape 2 only split-K.
    assert f["ties_median"] == 1.5 and f["shapes_with_tie"] == 1


def test_noise_floor_hand_computed():
    r = pd.DataFrame({"status": ["ok"] * 4, "orig_p50_us": [10.0, 10.0, 10.0, 10.0],
                      "p50_us": [10.1, 9.8, 13.0, 10.0], "orig_stable": [True, True, False, True]})
    nf = DC.noise_floor(r)
    assert nf["pairs"] == 4 and nf["median"] == pytest.approx(0.015)
    assert nf["stable_pairs"] == 3 and nf["stable_median"] == pytest.approx(0.01)


def test_build_rejects_a_corrupt_raw_shard_naming_file_and_line(tmp_path, capsys):
    raw = tmp_path / "train-bf16-shard00of02.jsonl.gz"
    with gzip.open(raw, "wt") as fh:
        fh.write(json.dumps(good_row(m=1)) + "\n" + json.dumps(good_row(m=2)) + "\n{torn\n"
                 + json.dumps(good_row(m=3)) + "\n")
    with pytest.raises(D.DataError, match=re.escape(f"{raw}:3: corrupt line, not JSON") + ".*2 rows read before it"):
        D.build_parquet([str(raw)], str(tmp_path / "ds"))
    assert cli_main(["dataset", "build", "--raw", str(raw), "--root", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"costmodel: error: {raw}:3: corrupt line")
    assert not (tmp_path / "ds").exists()
    # A raw shard copied while its sweep was writing it: the torn last line is an error too.
    plain = tmp_path / "train-bf16-shard01of02.jsonl"
    plain.write_text(json.dumps(good_row()) + "\n" + json.dumps(good_row(m=2))[:30])
    with pytest.raises(D.DataError, match=re.escape(f"{plain}:2: corrupt line")):
        D.load_dataset([str(plain)])


def test_loader_rejects_a_truncated_gz(tmp_path):
    whole = write_jsonl(tmp_path / "whole.jsonl.gz", [good_row(m=m) for m in range(1, 3000)])
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(open(whole, "rb").read()[:4000])
    with pytest.raises(D.DataError, match=re.escape(f"{cut}: gzip stream cut short after line ")):
        D.load_dataset([str(cut)])


OOM_ERROR = "OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"


def _oom_row(m, suite, status="out_of_memory"):
    return good_row(m=m, candidate="cublas", **VENDOR_PARAMS, status=status, p20_us=np.nan, p50_us=np.nan,
                    p80_us=np.nan, eval_shape=True, suite=suite, error=OOM_ERROR)


@pytest.mark.parametrize("status", ["out_of_memory", "compile_error"])  # compile_error: the old label of an OOM
def test_out_of_memory_rows_load_and_demote_their_shape(tmp_path, status):
    # One evaluation run of two shapes: m=7 lost its cuBLAS row to an OOM, m=33 is whole.
    run_a = write_parquet(tmp_path / "a.parquet", [
        good_row(m=7, eval_shape=True, suite="eval-a"), _oom_row(7, "eval-a", status),
        good_row(m=33, eval_shape=True, suite="eval-a"),
        good_row(m=33, candidate="cublas", **VENDOR_PARAMS, eval_shape=True, suite="eval-a")])
    df = D.load_dataset([run_a])
    assert sorted(df["status"].astype(str)) == sorted(["ok", status, "ok", "ok"])
    ev = df.groupby("m")["eval_shape"].agg(["all", "any"])
    assert not ev.loc[7, "any"] and ev.loc[33, "all"]
    # A complete run of m=7 by another sweep is an evaluation shape again, and its rows supersede.
    run_b = write_parquet(tmp_path / "b.parquet", [
        good_row(m=7, p20_us=8.0, p50_us=8.0, p80_us=8.0, eval_shape=True, suite="eval-b"),
        good_row(m=7, candidate="cublas", **VENDOR_PARAMS, eval_shape=True, suite="eval-b")])
    df = D.load_dataset([run_a, run_b])
    m7 = df[df["m"] == 7].set_index("candidate")
    assert m7["eval_shape"].all() and (m7["status"] == "ok").all()
    assert m7.loc["tiled_m16n32k64_g8_w4s3", "p50_us"] == 8.0


def test_build_reports_sweep_health_and_demotes_oom_shapes(tmp_path, capsys):
    # Shape m=7: 1 OOM row of 2 (50%: a warning); shape m=33: 1 compile error of 2 (no warning).
    raw = write_jsonl(tmp_path / "eval-bf16-shard01of40.jsonl.gz", [
        good_row(m=7, eval_shape=True, suite="eval"), _oom_row(7, "eval"),
        good_row(m=33, eval_shape=True, suite="eval"),
        good_row(m=33, candidate="cublas", **VENDOR_PARAMS, eval_shape=True, suite="eval", status="compile_error",
                 p20_us=np.nan, p50_us=np.nan, p80_us=np.nan, error="CompilationError: x")])
    ok = write_jsonl(tmp_path / "train-bf16-shard00of16.jsonl.gz", [good_row(m=9, suite="train")])
    assert cli_main(["dataset", "build", "--raw", raw, ok, "--root", str(tmp_path / "ds")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"{raw}: rows by status: ok 2, compile_error 1, out_of_memory 1 (4 rows, 2 shapes)" in err
    assert "  bf16:7x96x64 on NVIDIA H200: ok 1, out_of_memory 1 (of 2)" in err
    assert "  bf16:33x96x64 on NVIDIA H200: ok 1, compile_error 1 (of 2)" in err
    warnings = [line for line in err if line.startswith("WARNING")]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: bf16:7x96x64 on NVIDIA H200: 1 of 2 rows (50.0%)")
    assert any("1 evaluation shape(s) with out-of-memory rows stored as training shapes: bf16:7x96x64" in line
               for line in err)
    assert f"{ok}: rows by status: ok 1 (1 rows, 1 shapes)" in err
    assert err[-1] == "all 2 shards: rows by status: ok 3, compile_error 1, out_of_memory 1"
    # m=33 lacks most feasible candidates too, so it is stored as an incomplete shape.
    assert any("1 incomplete evaluation shape(s) stored as training shapes: bf16:33x96x64" in line for line in err)
    df = pd.read_parquet(tmp_path / "ds" / "gemm" / "bf16" / "eval-bf16-shard01of40.parquet")
    assert len(df) == 4 and not df["eval_shape"].any()


def test_cli_validate_rejects_bad_data_in_one_line(tmp_path, capsys):
    good = write_parquet(tmp_path / "good.parquet", [good_row(), _oom_row(7, "eval")])
    assert cli_main(["dataset", "validate", good]) == 0
    assert capsys.readouterr().out.startswith("ok: 2 rows, 1 shapes")
    bad = write_parquet(tmp_path / "bad.parquet", [good_row(), good_row(m=8, p80_us=float("inf"))])
    assert cli_main(["dataset", "validate", bad]) == 2
    err = capsys.readouterr().err
    assert err == f"costmodel: error: {bad}: column 'p80_us': infinite time inf in row 1\n"


def test_out_of_memory_row_measured_again_by_the_same_sweep_keeps_the_evaluation_shape(tmp_path):
    """The harness retries an out_of_memory candidate on resume and appends the new row:
    the shape is complete again and the old row is dropped before health and merge."""
    import pandas as pd

    from gemm_costmodel.data import dataset as D

    base = {"op": "gemm", "e": 1, "top_k": 1, "dtype": "bf16", "m": 8, "n": 64, "k": 64, "arch": "sm90",
            "gpu_name": "NVIDIA H100 80GB HBM3", "suite": "s", "eval_shape": True}
    rows = pd.DataFrame([
        {**base, "candidate": "a", "status": "ok", "error": ""},
        {**base, "candidate": "b", "status": "out_of_memory", "error": "timing: CUDA out of memory"},
        {**base, "candidate": "b", "status": "ok", "error": ""},
        {**base, "m": 16, "candidate": "b", "status": "out_of_memory", "error": "timing: CUDA out of memory"},
        {**base, "m": 16, "candidate": "a", "status": "ok", "error": ""},
    ])
    assert D.unresolved_oom(rows).tolist() == [False, False, False, True, False]
    kept = D.drop_resolved_oom(rows)
    assert len(kept) == 4 and not ((kept["m"] == 8) & (kept["status"] == "out_of_memory")).any()
    demoted_df, demoted = D.demote_oom_eval_shapes(rows)
    assert demoted == [("NVIDIA H100 80GB HBM3", "bf16", 16, 64, 64)]
    assert demoted_df.loc[rows["m"] == 8, "eval_shape"].all()
    assert not demoted_df.loc[rows["m"] == 16, "eval_shape"].any()


def test_harness_rows_of_other_ops_get_their_ops_own_parameters(tmp_path):
    """Rows written through the dense op's parameter view (before the harness used each op's own)
    load with the op's view, the one its runtime computes features from."""
    bs = dict(op="fp8_blockscale", dtype="fp8", m=16, n=576, k=7168)
    rows = [
        good_row(**bs, candidate="bstiled_m64n128k128_g32_w4s2", block_m=64, block_n=128, block_k=128, group_m=32,
                 split_k=0, num_warps=4, num_stages=2),
        good_row(**bs, candidate="bssplitk_m16n64k128_s4_w4s3", variant="splitk", block_m=16, block_n=64,
                 block_k=128, group_m=0, split_k=4, num_warps=4, num_stages=3),
        good_row(op="moe", dtype="bf16", m=16, n=1536, k=2048, e=128, top_k=8, stage="gate_up", routing="zipf",
                 candidate="moe_m16n64k128_g1_w4s4", block_m=16, block_n=64, block_k=128, group_m=1, split_k=0,
                 num_warps=4, num_stages=4),
        # A dense row keeps what it says (and is checked against its id).
        good_row(),
    ]
    df = D.read_file(write_jsonl(tmp_path / "r.jsonl.gz", rows)).set_index("candidate")
    assert df.loc["bstiled_m64n128k128_g32_w4s2", "split_k"] == 1
    assert df.loc["bssplitk_m16n64k128_s4_w4s3", "group_m"] == 1
    assert df.loc["bssplitk_m16n64k128_s4_w4s3", "split_k"] == 4
    assert df.loc["moe_m16n64k128_g1_w4s4", "split_k"] == 1
    assert df.loc["tiled_m16n32k64_g8_w4s3", "group_m"] == 8
    with pytest.raises(D.DataError, match="column 'split_k': 0 in row 0 disagrees"):
        D.read_file(write_jsonl(tmp_path / "g.jsonl.gz", [good_row(split_k=0)]))


def test_dataset_build_reads_what_bench_writes_by_default(tmp_path, monkeypatch, capsys):
    """`costmodel bench` writes plain .jsonl shards to datasets/raw (its default --out); `dataset
    build` with no --raw reads them there beside the gzipped ones, a resumed shard's .jsonl
    instead of its committed .gz twin (issue 56: no moving files by hand)."""
    from gemm_costmodel.cli import build_parser

    assert build_parser().parse_args(["bench"]).out == os.path.join("datasets", "raw")
    raw = tmp_path / "datasets" / "raw"
    raw.mkdir(parents=True)
    plain = lambda p, rows: p.write_text("".join(json.dumps(r) + "\n" for r in rows))  # noqa: E731
    plain(raw / "sweep-shard00of01.jsonl", [good_row(m=5)])
    write_jsonl(raw / "train-bf16-shard00of02.jsonl.gz", [good_row(m=9)])
    plain(raw / "train-bf16-shard00of02.jsonl", [good_row(m=9), good_row(m=11)])
    monkeypatch.chdir(tmp_path)
    assert cli_main(["dataset", "build"]) == 0
    df = D.load_dataset(root="datasets")
    assert sorted(df["m"]) == [5, 9, 11]


def test_build_keeps_eval_shapes_measured_before_a_later_grid(tmp_path):
    """A grid added to a variant later (space.LATER_GRIDS_SM90) is required all or none: a shape
    measured before it existed keeps its oracle; one holding part of it was cut short."""
    from gemm_costmodel.kernels.gemm.space import config_from_id, config_generation

    def without(rows, keep_new):
        new = [r for r in rows if config_generation(config_from_id(r["candidate"]))]
        assert new  # the deep tiled and persistent grids are feasible here
        old = [r for r in rows if not config_generation(config_from_id(r["candidate"]))]
        return old + new[:keep_new]

    before = without(_eval_rows(40, 256, 1024), 0)
    part = without(_eval_rows(48, 256, 1024), 1)
    raw = write_jsonl(tmp_path / "eval-fp16-shard01of40.jsonl.gz", before + part)
    D.build_parquet([raw], str(tmp_path / "ds"), log=[].append)
    per_shape = load_dataset_eval(tmp_path)
    assert per_shape.loc[40, "all"] and not per_shape.loc[48, "any"]


def load_dataset_eval(tmp_path):
    return D.load_dataset(root=str(tmp_path / "ds")).groupby("m")["eval_shape"].agg(["all", "any"])
