"""Issue 57, the command line and data half: one test per row of the issue's table (6, 7, 8, 9 and
the CLI part of 11), each failing on the code before its fix."""
from __future__ import annotations

import os

import pandas as pd
import pytest

from gemm_costmodel import registry
from gemm_costmodel.cli import _shapes_from_args, build_parser, main as cli_main
from gemm_costmodel.kernels import shapes as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAMPAIGN = "benchmarks/campaigns/moe-newmodel-shapes.csv"
MOE_EVAL = os.path.join(ROOT, "datasets/moe/bf16/moe-eval-h100-shard00of01.parquet")


def _one_line_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("costmodel: error:")]
    assert len(err) == 1, err
    return err[0]


# -- 6: bench --shapes reads every problem field of the op -----------------------------------------

def test_d06_bench_moe_shapes_csv(tmp_path, capsys):
    from gemm_costmodel.benchmarks import harness as H
    from gemm_costmodel.kernels.moe import suites

    # The lead's command line on the H200, up to the candidate lists (measuring needs the GPU).
    args = build_parser().parse_args(["bench", "--op", "moe", "--shapes", os.path.join(ROOT, CAMPAIGN),
                                      "--dtype", "bf16", "--mode", "all"])
    shapes = _shapes_from_args(args)
    assert len(shapes) == 20 and len({s.key for s in shapes}) == 20
    assert {(s.e, s.top_k, s.dtype) for s in shapes} == {(64, 6, "bf16")}  # ERNIE-4.5-21B-A3B, TP1
    assert {(s.stage, s.n, s.k) for s in shapes} == {("gate_up", 3072, 2560), ("down", 2560, 1536)}
    assert {s.routing for s in shapes} == {"balanced", "zipf", "hot"}
    assert sum(s.routing == "balanced" for s in shapes) == 16 and min(s.m for s in shapes) == 1
    assert max(s.m for s in shapes) == 4096
    # A family of neither the training nor the evaluation suites (E, top_k, I, hidden).
    dims = {(m.experts, m.top_k, m.intermediate, m.hidden) for m in suites.ALL_MODELS}
    assert (64, 6, 1536, 2560) not in dims
    spec = registry.get("moe")
    for s in shapes:
        cands = H.select_candidates(H.shape_problem(spec, s), "all", 0, "sm90", op="moe")
        assert len(cands) > 100 and cands[-1].id == "grouped_mm"
        assert H.key_of("moe", s, cands[0].id)[5:7] == (64, 6)

    # Bad files: the file, the line and the column named, before any GPU is asked for.
    cases = [("M,N,K,E,top_k,stage,experts\n", "1: unknown column 'experts'"),
             ("M,N,K,E,top_k\n1,64,48,8,2\n", "1: missing column stage"),
             ("M,N,K,E,top_k,stage\n1,64,48,8,2,gate_up\n4,64,48,0,2,down\n", "3: column E: e must be in 1..512"),
             ("M,N,K,E,top_k,stage\n4,64,48,8,2,middle\n", "2: column stage: stage must be one of"),
             ("M,N,K,E,top_k,stage,routing\n4,64,48,8,2,down,lumpy\n", "2: column routing:"),
             ("M,N,K,E,top_k,stage\n4,64,48,eight,2,down\n", "2: column E: not an integer: 'eight'")]
    for i, (text, fragment) in enumerate(cases):
        bad = tmp_path / f"bad{i}.csv"
        bad.write_text(text)
        assert cli_main(["bench", "--op", "moe", "--shapes", str(bad), "--dtype", "bf16"]) == 2
        assert f"{bad}:{fragment}" in _one_line_error(capsys)
    # A dense op refuses MoE fields it pins (E = 8 is another op), and keeps reading plain shapes.
    dense = tmp_path / "dense.csv"
    dense.write_text("M,N,K,E\n4,64,48,8\n")
    with pytest.raises(ValueError, match=r"dense.csv:2: column E: E=8 is not a gemm problem"):
        S.read_problem_csv(str(dense), "gemm")
    dense.write_text("m,n,k\n4,64,48\n")
    assert [s.key for s in S.read_problem_csv(str(dense), "gemm", "fp16")] == ["fp16:4x64x48"]

    # The same harness path as a suite's shapes: one tiny MoE problem of a CSV, measured in the
    # interpreter (fp16) with a fake timer; its rows carry every problem field.
    from conftest import PROVENANCE
    from gemm_costmodel.benchmarks.store import ResultStore, read_rows
    from gemm_costmodel.kernels.timing import FakeTimer

    tiny = tmp_path / "tiny.csv"
    tiny.write_text("M,N,K,E,top_k,stage,routing\n5,64,48,8,2,gate_up,hot\n")
    args = build_parser().parse_args(["bench", "--op", "moe", "--shapes", str(tiny), "--dtype", "fp16",
                                      "--mode", "sample:2"])
    user = _shapes_from_args(args)
    with ResultStore(tmp_path / "run.jsonl") as store:
        stats = H.run_sweep(user, store, FakeTimer(), mode="sample:2", seed=0, device="cpu", op="moe",
                            provenance=dict(PROVENANCE), progress=False)
    rows = read_rows([tmp_path / "run.jsonl"])
    assert stats.failed == 0 and stats.measured == len(rows) == 2  # the sample (no fp16 vendor row)
    assert {(r["e"], r["top_k"], r["stage"], r["routing"], r["family"]) for r in rows} == {
        (8, 2, "gate_up", "hot", "user")}


# -- 11 (CLI): select / configs default to a dtype the op takes ---------------------------------------

def test_d11_select_fp8_blockscale_dtype(capsys):
    assert cli_main(["select", "--op", "fp8_blockscale", "16", "4096", "4096"]) == 0
    assert "source" in capsys.readouterr().out
    assert cli_main(["select", "--op", "fp8_blockscale", "16", "4096", "4096", "--dtype", "bf16"]) == 2
    err = _one_line_error(capsys)
    assert "op fp8_blockscale does not take dtype bf16; it takes: fp8" in err
    assert "fp16" not in err and "fp32" not in err
    assert cli_main(["configs", "--op", "fp8_blockscale"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("fp8_blockscale sm90 fp8: ")
    assert cli_main(["configs", "--op", "fp8_blockscale", "--dtype", "fp16"]) == 2
    assert "it takes: fp8" in _one_line_error(capsys)
    # MoE: --stage is required, and says so in --help and in a one-line error.
    help_text = build_parser()._subparsers._group_actions[0].choices["select"].format_help()
    assert "required with --op moe" in " ".join(help_text.split())
    assert cli_main(["select", "--op", "moe", "16", "1536", "2048", "--e", "128", "--top-k", "8"]) == 2
    assert "op moe needs the problem field 'stage': give --stage" in _one_line_error(capsys)


# -- 7: train refuses too little data and never overwrites the shipped models unasked -----------------

def test_d07_train_guards_data_and_output(tmp_path, capsys, monkeypatch):
    from gemm_costmodel.serving.runtime import _models_dir

    shipped = os.path.join(_models_dir(), "moe-sm90.json")
    before = open(shipped, "rb").read()
    eval_rows = pd.read_parquet(MOE_EVAL)
    first = eval_rows.iloc[0]
    one_problem = eval_rows[(eval_rows[["m", "n", "k", "stage", "routing"]] == first[["m", "n", "k", "stage", "routing"]]
                             ).all(axis=1) & (eval_rows["status"] == "ok")].head(10)
    ten = tmp_path / "ten.parquet"
    one_problem.to_parquet(ten, index=False)
    small = ["--op", "moe", "--data", str(ten), "--trees", "2", "--jobs", "1", "--no-latency-model"]
    # Run elsewhere, so that the code before the fix wrote its model under tmp_path, not over the shipped one.
    monkeypatch.chdir(tmp_path)
    # No --out: refused (it was the shipped folder).
    assert cli_main(["train", *small]) == 2
    assert "give --out DIR" in _one_line_error(capsys)
    # The shipped folder itself only with --force.
    assert cli_main(["train", *small, "--out", _models_dir()]) == 2
    assert "is the shipped models folder" in _one_line_error(capsys)
    # Ten rows of one problem: too little to learn from.
    assert cli_main(["train", *small, "--out", str(tmp_path / "m")]) == 2
    err = _one_line_error(capsys)
    assert "too little data to train on: dtype bf16 has 1 problem(s)" in err and "at least 20" in err
    assert not (tmp_path / "m" / "moe-sm90.onnx").exists()
    # An output folder that cannot be written: refused before the data is read or a tree is grown.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli_main(["train", *small, "--min-problems", "1", "--out", str(blocker / "models")]) == 2
    out_err = capsys.readouterr()
    assert "cannot write there" in out_err.err and "train:" not in out_err.out + out_err.err
    assert open(shipped, "rb").read() == before
    # Enough data (the threshold lowered to this test's one problem) trains into --out.
    assert cli_main(["train", *small, "--min-problems", "1", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "moe-sm90.onnx").is_file() and open(shipped, "rb").read() == before


# -- 8: dataset validate checks each op's fields, ids and values; counts problems by the full key ----

def test_d08_dataset_validate_moe_fields(tmp_path, capsys):
    good = pd.read_parquet(MOE_EVAL)
    # Three ok rows of every problem: balanced and zipf problems share (M, N, K).
    good = good[good["status"] == "ok"].groupby(["m", "n", "k", "e", "top_k", "stage", "routing"]).head(3)
    good = good.reset_index(drop=True)
    path = tmp_path / "good.parquet"
    good.to_parquet(path, index=False)
    assert cli_main(["dataset", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    full = good[["dtype", "m", "n", "k", "e", "top_k", "stage", "routing"]].drop_duplicates().shape[0]
    assert full > good[["dtype", "m", "n", "k"]].drop_duplicates().shape[0]  # so the count tells them apart
    assert out.startswith(f"ok: {len(good)} rows, {full} shapes (problems by each op's full key: moe {full})")

    bad = good.copy()
    bad.loc[0:9, "candidate"] = "moe_m16n64k128_warp9"  # no id of the MoE space
    bad.loc[10, "stage"] = "middle"
    bad.loc[11, "routing"] = "lumpy"
    bad.loc[12, "op"] = "moe2"
    bad.loc[13, "arch"] = "sm99"
    bad.loc[14, ["e", "top_k"]] = (100000, 8)
    bad.loc[15, "rel_err"] = float("inf")
    dup = bad.iloc[[20]].assign(p50_us=bad["p50_us"].iat[20] * 10, p20_us=bad["p50_us"].iat[20] * 10,
                                p80_us=bad["p50_us"].iat[20] * 10, stable=True)
    bad.loc[20, "stable"] = True
    bad = pd.concat([bad, dup], ignore_index=True)
    path = tmp_path / "bad.parquet"
    bad.to_parquet(path, index=False)
    assert cli_main(["dataset", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    for fragment in ("column 'candidate': 10 rows of 1 id(s) not in the moe space: 'moe_m16n64k128_warp9'",
                     "stage must be one of", "routing must be one of", "column 'op': 1 rows of unknown op(s) 'moe2'",
                     "column 'arch': 1 rows of unknown arch(s) 'sm99'", "e must be in 1..512, got 100000",
                     "column 'rel_err': 1 ok rows with an infinite error",
                     "1 (problem, candidate) key(s) timed more than 2x apart on one card"):
        assert fragment in err, (fragment, err)
    assert "ok:" not in err


# -- 9: summarize groups by the op's full problem key ---------------------------------------------------

def test_d09_summarize_moe_full_key(capsys):
    from gemm_costmodel.benchmarks import summary
    from gemm_costmodel.benchmarks.store import read_rows

    shard = os.path.join(ROOT, "datasets/raw/moe-eval-h100-shard00of01.jsonl.gz")
    rows = pd.DataFrame(read_rows([shard]))
    full = rows[["dtype", "m", "n", "k", "e", "top_k", "stage", "routing"]].drop_duplicates()
    assert len(full) > len(rows[["dtype", "m", "n", "k"]].drop_duplicates())
    assert cli_main(["summarize", shard]) == 0
    assert f"### Oracle (best Triton) vs cuBLAS, {len(full)} shapes" in capsys.readouterr().out
    ps = summary.per_shape(rows)
    # Each problem's oracle is its own best: the fastest ok Triton row of that very problem.
    ok = rows[(rows["status"] == "ok") & (rows["variant"] != "vendor")]
    keys = ["dtype", "m", "n", "k", "e", "top_k", "stage", "routing"]
    want = ok.loc[ok.groupby(keys)["p50_us"].idxmin(), keys + ["candidate"]]
    got = ps[keys + ["oracle_id"]].rename(columns={"oracle_id": "candidate"})
    pd.testing.assert_frame_equal(got.sort_values(keys).reset_index(drop=True),
                                  want.sort_values(keys).reset_index(drop=True), check_dtype=False)
