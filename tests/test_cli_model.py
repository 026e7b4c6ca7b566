"""The cost-model commands end to end on the committed fp8 subset, and their errors on bad input."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.serving import features as F
from gemm_costmodel.cli import main as cli_main

EVAL = "datasets/gemm/fp8/eval-fp8-shard01of40.parquet"
TRAIN = "datasets/gemm/fp8/train-fp8-shard00of16.parquet"
FP8 = [EVAL, TRAIN]
# Few trees, one xgboost thread (OpenMP spins when the CPUs are shared).
SMALL = ["--trees", "20", "--depth", "4", "--jobs", "1"]


def quiet(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """`costmodel run` on the fp8 subset: (rc, report folder, model folder, stdout)."""
    base = tmp_path_factory.mktemp("run")
    report, models = base / "report", base / "models"
    rc, out, err = quiet(["run", "--data", *FP8, *SMALL, "--schemes", "family", "--report", str(report),
                          "--out", str(models)])
    return rc, report, models, out, err


def read_json(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def table_rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
            if line.startswith("|")]


def test_run_writes_report_and_model(run_dir):
    rc, report, models, out, err = run_dir
    assert rc == 0, err
    md = (report / "report.md").read_text()
    methods = {r[0] for r in table_rows(md)}
    assert {"model", "cublas", "oracle", "best_static", "nearest_neighbor"} <= methods
    assert "fp8" in next(r for r in table_rows(md) if r[0] == "model")
    assert "## Leave-one-family-out: NVIDIA H200" in md
    # The loss breakdown: its shares of the model's log-slowdown add up to 1 (or all 0).
    assert "## Where the model loses" in md
    head = next(r for r in table_rows(md) if r[0] == "gpu" and "loss_cublas_over_triton" in r)
    row = next(r for r in table_rows(md) if r[0] == "NVIDIA H200" and len(r) == len(head))
    shares = [float(row[head.index(c)]) for c in
              ("loss_cublas_over_triton", "loss_triton_over_cublas", "loss_triton_over_triton")]
    assert sum(shares) == pytest.approx(1.0, abs=0.003) or sum(shares) == 0.0
    pngs = [p for p in os.listdir(report) if p.endswith(".png")]
    assert pngs and all((report / p).stat().st_size > 1000 for p in pngs)
    for p in pngs:
        assert f"]({p})" in md
    assert (report / "results_family.csv").is_file()
    # The default (rank) decision model ships with its cascade and its log-latency companion.
    assert sorted(os.listdir(models)) == ["gemm-sm90-latency.json", "gemm-sm90-latency.onnx",
                                          "gemm-sm90-prefix.onnx", "gemm-sm90-suffix.onnx",
                                          "gemm-sm90.json", "gemm-sm90.onnx"]
    assert read_json(models / "gemm-sm90-latency.json")["role"] == "latency"
    assert read_json(models / "gemm-sm90.json")["role"] == "decision"
    man = read_json(models / "gemm-sm90.json")
    assert man["metrics"], "held-out metrics missing from the manifest"
    m = man["metrics"]["NVIDIA H200/fp8"]
    # 12: the H200 decode shapes lack swap-AB rows, so they are training shapes now.
    assert m["shapes"] == 12 and 1.0 <= m["geomean_slowdown"] < 3.0
    assert man["feature_schema_hash"] == F.schema_hash(op="gemm") and man["dtypes"] == ["fp8"]
    assert man["hyperparameters"]["n_estimators"] == 20 and man["hyperparameters"]["max_depth"] == 4
    # The printed table and the report path.
    assert "| model |" in out and f"report: {report / 'report.md'}" in out


def test_train_booster_then_export(run_dir, tmp_path):
    rc, _, models, _, _ = run_dir
    assert rc == 0
    booster = tmp_path / "b" / "b.json"
    rc, out, err = quiet(["train", "--data", *FP8, *SMALL, "--booster", str(booster), "--no-export",
                          "--out", str(tmp_path / "unused")])
    assert rc == 0, err
    assert booster.is_file() and (tmp_path / "b" / "b.json.train.json").is_file()
    assert not (tmp_path / "unused").exists()  # --no-export
    rc, out, err = quiet(["export", str(booster), "--out", str(tmp_path / "x")])
    assert rc == 0, err
    man = read_json(tmp_path / "x" / "gemm-sm90.json")
    ref = read_json(models / "gemm-sm90.json")
    for key in ("op", "dtypes", "arch", "formulation", "score_sign", "feature_schema_hash", "config_space_hash",
                "training_data_hash", "training_rows", "training_shapes", "training_gpus", "hyperparameters"):
        assert man[key] == ref[key], key
    # Same data, same seed: the same trees, hence the same ONNX outputs.
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 16, size=(64, len(F.FEATURE_NAMES))).astype(np.float32)
    a = ort.InferenceSession(str(tmp_path / "x" / "gemm-sm90.onnx"), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(models / "gemm-sm90.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(a.run(None, {"features": X})[0], b.run(None, {"features": X})[0])


def test_export_keeps_the_shortlist(run_dir, tmp_path):
    rc, _, models, _, _ = run_dir
    booster = tmp_path / "b.json"
    assert quiet(["train", "--data", *FP8, *SMALL, "--booster", str(booster), "--no-export"])[0] == 0
    assert quiet(["export", str(booster), "--out", str(tmp_path / "x")])[0] == 0
    man = read_json(tmp_path / "x" / "gemm-sm90.json")
    assert man["shortlist"] == read_json(models / "gemm-sm90.json")["shortlist"]


def test_evaluate_nk_only_is_labelled_nk(tmp_path):
    rc, out, err = quiet(["evaluate", "--data", *FP8, "--trees", "5", "--depth", "3", "--jobs", "1",
                          "--schemes", "nk", "--report", str(tmp_path / "r")])
    assert rc == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Leave-(N,K)-out" in md
    assert "Leave-one-family-out" not in md


def test_evaluate_train_gpu_learns_from_one_card_and_scores_both(tmp_path):
    # The evaluation file again as if measured on an H100: evaluation shapes of a second card that
    # no model learns from with --train-gpu "NVIDIA H200".
    h100 = tmp_path / "eval-h100.parquet"
    pd.read_parquet(EVAL).assign(gpu_name="NVIDIA H100 80GB HBM3").to_parquet(h100, index=False)
    base = ["evaluate", *SMALL, "--schemes", "family"]
    rc, _, err = quiet([*base, "--data", *FP8, "--report", str(tmp_path / "one")])
    assert rc == 0, err
    rc, _, err = quiet([*base, "--data", *FP8, str(h100), "--train-gpu", "NVIDIA H200",
                        "--report", str(tmp_path / "two")])
    assert rc == 0, err
    one = pd.read_csv(tmp_path / "one" / "results_family.csv")
    two = pd.read_csv(tmp_path / "two" / "results_family.csv")
    one, two = one[one["method"] == "model"], two[two["method"] == "model"]
    assert set(two["gpu_name"]) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    # The same training rows and seed as without the H100 file: the H200 picks are the same.
    h200 = two[two["gpu_name"] == "NVIDIA H200"].set_index("shape")["pick"].sort_index()
    assert h200.equals(one.set_index("shape")["pick"].sort_index())
    assert (two["gpu_name"] == "NVIDIA H100 80GB HBM3").sum() == len(h200)
    assert "## Leave-one-family-out: NVIDIA H100 80GB HBM3" in (tmp_path / "two" / "report.md").read_text()


def test_run_train_gpu_trains_the_final_model_on_that_card(tmp_path):
    h100 = tmp_path / "eval-h100.parquet"
    pd.read_parquet(EVAL).assign(gpu_name="NVIDIA H100 80GB HBM3").to_parquet(h100, index=False)
    booster = tmp_path / "b.json"
    rc, _, err = quiet(["run", *SMALL, "--schemes", "family", "--data", *FP8, str(h100), "--train-gpu", "NVIDIA H200",
                        "--report", str(tmp_path / "r"), "--booster", str(booster), "--no-export"])
    assert rc == 0, err
    side = read_json(str(booster) + ".train.json")
    assert side["gpus"] == ["NVIDIA H200"]


def test_train_gpu_not_in_the_data(tmp_path, capsys):
    rc = cli_main([*model_cmd("evaluate", tmp_path), "--data", *FP8, "--train-gpu", "NVIDIA B200"])
    assert_one_line_error(rc, capsys, "train_gpus", "'NVIDIA B200'")


# -- bad inputs: exit non-zero with a one-line reason -------------------------------------------

@pytest.fixture(scope="module")
def fp8_frame():
    return pd.read_parquet(EVAL)


def assert_one_line_error(rc, capsys, *needles):
    assert rc != 0
    # The loader's note of skipped out-of-space rows (a bf16 copy of fp8 rows has fp8-only
    # configs) is information, not part of the error.
    err = "\n".join(l for l in capsys.readouterr().err.strip().splitlines()
                    if not (l.startswith("data: ") and "space now rules out" in l))
    assert len(err.splitlines()) == 1, err
    assert err.startswith("costmodel: error:"), err
    for n in needles:
        assert n in err, (n, err)


def model_cmd(cmd, tmp_path) -> list[str]:
    extra = {"train": ["--out", str(tmp_path / "m"), "--no-export"],
             "evaluate": ["--report", str(tmp_path / "r")],
             "run": ["--report", str(tmp_path / "r"), "--out", str(tmp_path / "m")]}[cmd]
    return [cmd, *SMALL, *extra]


@pytest.mark.parametrize("cmd", ["train", "evaluate", "run"])
def test_missing_data_file(cmd, tmp_path, capsys):
    missing = str(tmp_path / "nope.parquet")
    rc = cli_main([*model_cmd(cmd, tmp_path), "--data", missing])
    assert_one_line_error(rc, capsys, missing, "no such file")
    assert not (tmp_path / "m").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("cmd", ["train", "evaluate", "run"])
def test_missing_column(cmd, tmp_path, capsys, fp8_frame):
    bad = tmp_path / "bad.parquet"
    fp8_frame.drop(columns=["p50_us"]).to_parquet(bad, index=False)
    rc = cli_main([*model_cmd(cmd, tmp_path), "--data", str(bad)])
    assert_one_line_error(rc, capsys, str(bad), "missing column 'p50_us'")


@pytest.mark.parametrize("cmd", ["train", "evaluate", "run"])
def test_empty_data_set(cmd, tmp_path, capsys, fp8_frame):
    empty = tmp_path / "empty.parquet"
    fp8_frame.iloc[:0].to_parquet(empty, index=False)
    rc = cli_main([*model_cmd(cmd, tmp_path), "--data", str(empty)])
    assert_one_line_error(rc, capsys, str(empty), "no rows")


def test_filters_leave_no_rows(tmp_path, capsys):
    rc = cli_main([*model_cmd("train", tmp_path), "--data", EVAL, "--dtype", "bf16"])
    assert_one_line_error(rc, capsys, "no gemm harness rows", "bf16")


def test_unknown_gpu_in_data(tmp_path, capsys, fp8_frame):
    other = tmp_path / "b200.parquet"
    fp8_frame.assign(gpu_name="NVIDIA B200").to_parquet(other, index=False)
    rc = cli_main([*model_cmd("train", tmp_path), "--data", str(other)])
    assert_one_line_error(rc, capsys, "unknown GPU 'NVIDIA B200'")


@pytest.mark.parametrize("cmd", ["evaluate", "run"])
def test_evaluate_without_evaluation_shapes(cmd, tmp_path, capsys):
    df = pd.read_parquet(TRAIN)
    assert not df["eval_shape"].any()
    only_train = tmp_path / "train_only.parquet"
    df[~df["eval_shape"]].to_parquet(only_train, index=False)
    rc = cli_main([*model_cmd(cmd, tmp_path), "--data", str(only_train)])
    assert_one_line_error(rc, capsys, "no evaluation shapes")
    assert not (tmp_path / "m").exists()


def test_evaluate_with_nothing_to_train_a_fold_on(tmp_path, capsys, fp8_frame):
    one = tmp_path / "one_family.parquet"
    fp8_frame[fp8_frame["family"] == "yi-1.5"].to_parquet(one, index=False)
    rc = cli_main([*model_cmd("evaluate", tmp_path), "--data", str(one), "--schemes", "family"])
    assert_one_line_error(rc, capsys)


def test_export_missing_booster(tmp_path, capsys):
    missing = str(tmp_path / "none.json")
    rc = cli_main(["export", missing, "--out", str(tmp_path / "x")])
    assert_one_line_error(rc, capsys, missing, "no such file")
    assert not (tmp_path / "x").exists()


def test_export_corrupt_booster(tmp_path, capsys):
    booster = tmp_path / "b.json"
    booster.write_text("{not json")
    (tmp_path / "b.json.train.json").write_text("{}")
    rc = cli_main(["export", str(booster), "--out", str(tmp_path / "x")])
    assert_one_line_error(rc, capsys, str(booster))


def test_unknown_formulation_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["train", "--formulation", "lambdamart"])
    assert exc.value.code != 0
    assert "lambdamart" in capsys.readouterr().err


# -- costmodel select ------------------------------------------------------------------------

def test_select_prints_the_shipped_models_top_k(capsys):
    assert cli_main(["select", "16", "4096", "4096", "--top", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("1. ") and "source model" in lines[0]


def test_select_notes_when_the_latency_estimates_disagree_with_the_order(capsys, monkeypatch):
    from gemm_costmodel.serving.runtime import Choice, Dispatcher

    ranked = [Choice("a", "model", 36.5), Choice("b", "model", 34.2), Choice("c", "model", 40.0)]
    monkeypatch.setattr(Dispatcher, "rank", lambda self, *a, **k: ranked)
    assert cli_main(["select", "1", "12288", "7168", "--top", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines() == ["1. a  (source model, predicted 36.50 us)",
                                            "2. b  (source model, predicted 34.20 us)",
                                            "3. c  (source model, predicted 40.00 us)"]
    assert "separate latency estimate" in out.err
    # In order (or without estimates): no note.
    ranked[:] = [Choice("a", "model", 30.0), Choice("b", "model", 30.0), Choice("c", "model", None)]
    assert cli_main(["select", "1", "12288", "7168", "--top", "3"]) == 0
    assert "note:" not in capsys.readouterr().err
    ranked[:] = [Choice("a", "model", 30.0), Choice("b", "model", 31.0)]
    assert cli_main(["select", "1", "12288", "7168", "--top", "2"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_select_bad_dim_exits_2(capsys):
    assert cli_main(["select", "0", "4096", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "M must be >= 1" in err[0]


def test_select_unknown_gpu_falls_back_with_a_warning(capsys, monkeypatch):
    from gemm_costmodel.serving import runtime

    monkeypatch.setattr(runtime, "current_gpu_capability", lambda name: None)  # whatever GPU this machine has
    assert cli_main(["select", "16", "4096", "4096", "--gpu", "NVIDIA Foo 9000"]) == 0
    out = capsys.readouterr()
    # Its arch is unknown, so is which Triton configs it runs: the vendor library.
    assert out.out.strip() == "1. cublas  (source vendor, predicted -)"
    assert "unknown GPU 'NVIDIA Foo 9000'" in out.err and "vendor library (cublas)" in out.err


# -- data that passes validation but leaves nothing to learn: one line, never a traceback --------

def test_train_rejects_infinite_latency_naming_file_and_column(tmp_path, capsys, fp8_frame):
    bad = tmp_path / "inf.parquet"
    df = fp8_frame.copy()
    df.loc[df.index[5], ["p50_us", "p80_us"]] = np.inf   # was: an XGBoost traceback in training
    df.to_parquet(bad, index=False)
    rc = cli_main([*model_cmd("train", tmp_path), "--data", str(bad)])
    assert rc == 2
    assert_one_line_error(rc, capsys, str(bad), "column 'p50_us': infinite time inf in row 5")


@pytest.mark.parametrize("cmd, reason", [("train", "cannot train: no stable timed ok row for dtype fp8"),
                                         ("evaluate", "cannot evaluate: no trainable rows")])
def test_no_stable_rows(cmd, reason, tmp_path, capsys, fp8_frame):
    unstable = tmp_path / "unstable.parquet"
    fp8_frame.assign(stable=False).to_parquet(unstable, index=False)
    rc = cli_main([*model_cmd(cmd, tmp_path), "--data", str(unstable)])
    assert rc == 2   # train: was a ValueError traceback from the model
    assert_one_line_error(rc, capsys, reason)


def test_evaluate_compare_with_no_stable_rows(tmp_path, capsys, fp8_frame):
    unstable = tmp_path / "unstable.parquet"
    fp8_frame.assign(stable=False).to_parquet(unstable, index=False)
    rc = cli_main([*model_cmd("evaluate", tmp_path), "--data", str(unstable), "--compare"])
    assert rc == 2   # was: a ValueError traceback from the comparison, before the guarded evaluation
    assert_one_line_error(rc, capsys, "cannot evaluate: no trainable rows")


def test_train_with_a_dtype_without_stable_rows(tmp_path, capsys, fp8_frame):
    # bf16 rows are fine, every fp8 row is unstable: the model would list fp8 untrained.
    mixed = tmp_path / "mixed.parquet"
    pd.concat([fp8_frame.assign(stable=False), fp8_frame.assign(dtype="bf16")]).to_parquet(mixed, index=False)
    rc = cli_main([*model_cmd("train", tmp_path), "--data", str(mixed)])
    assert rc == 2
    assert_one_line_error(rc, capsys, "cannot train: no stable timed ok row for dtype fp8", "--dtype")


def test_train_on_a_single_row(tmp_path, capsys, fp8_frame):
    one = tmp_path / "one.parquet"
    fp8_frame.iloc[:1].to_parquet(one, index=False)
    rc = cli_main([*model_cmd("train", tmp_path), "--data", str(one)])
    assert rc == 2   # was: 'zero-size array to reduction operation' traceback
    assert_one_line_error(rc, capsys, "cannot train: no shape with two or more trainable candidates")


def test_evaluate_a_single_shape(tmp_path, capsys, fp8_frame):
    first = fp8_frame.iloc[0]
    one = tmp_path / "one_shape.parquet"
    fp8_frame[(fp8_frame["m"] == first["m"]) & (fp8_frame["n"] == first["n"]) & (fp8_frame["k"] == first["k"])
              ].to_parquet(one, index=False)
    rc = cli_main([*model_cmd("evaluate", tmp_path), "--data", str(one)])
    assert rc == 2
    assert_one_line_error(rc, capsys, "cannot evaluate: no evaluation shapes to hold out with training data left")


def test_select_a100_fp8_exits_2(capsys):
    assert cli_main(["select", "16", "4096", "4096", "--dtype", "fp8", "--gpu", "NVIDIA A100-SXM4-80GB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dtype fp8 is not supported on 'NVIDIA A100-SXM4-80GB' (sm80)" in err[0]


def test_select_dim_above_int32_exits_2(capsys):
    assert cli_main(["select", "16", str(2**31), "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["costmodel: error: N must be <= 2**31 - 1 (2147483647), got 2147483648"]


@pytest.mark.parametrize("content, problem", [("{not json", "not valid JSON"),
                                              ('{"name": "X"}', "expected a JSON list"),
                                              ('[{"name": "X"}]', "entry 0: missing field(s) match, arch")])
def test_select_bad_gpu_specs_exits_2(capsys, monkeypatch, tmp_path, content, problem):
    path = tmp_path / "gpus.json"
    path.write_text(content)
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    assert cli_main(["select", "16", "4096", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"costmodel: error: COSTMODEL_GPU_SPECS={path}: {problem}"), err


def test_select_moe_stage_needs_its_fields(capsys):
    assert cli_main(["select", "--op", "moe", "16", "1536", "2048", "--e", "128", "--top-k", "8",
                     "--stage", "gate_up", "--routing", "zipf", "--top", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # At M = 16 the model may pick swap-AB (moeswap_...) as well as tiled (moe_...) configs.
    assert len(lines) == 2 and all(re.search(r" moe(swap)?_m", ln) and "source model" in ln for ln in lines)
    assert cli_main(["select", "--op", "moe", "16", "1536", "2048", "--e", "128", "--top-k", "8"]) == 2
    assert "needs the problem field 'stage'" in capsys.readouterr().err
    assert cli_main(["select", "16", "1536", "2048", "--stage", "down"]) == 2
    assert "op gemm has no problem field 'stage'" in capsys.readouterr().err


def test_weight_gpu_naming_no_row_of_the_data_is_an_error(tmp_path):
    # Matched exactly against gpu_name, a misspelt card would weigh nothing: one line, exit 2, no model.
    rc, out, err = quiet(["train", "--data", *FP8, *SMALL, "--weight-gpu", "H200", "--gpu-weight", "3",
                          "--out", str(tmp_path / "m")])
    assert rc == 2 and "--weight-gpu 'H200': no row of that gpu_name" in err
    assert not list(tmp_path.rglob("*.onnx"))
