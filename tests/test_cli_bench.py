"""`costmodel bench` shape selection (the measuring itself needs a GPU)."""
from __future__ import annotations

from gemm_costmodel.kernels import shapes as S
from gemm_costmodel.kernels.gemm import suites as GS
from gemm_costmodel.cli import _shapes_from_args, build_parser, main as cli_main


def _args(argv):
    return build_parser().parse_args(["bench", *argv])


def test_only_keeps_the_listed_suite_shapes_with_their_origins(tmp_path):
    suite = GS.training_suite("bf16")
    a, b = suite[3], suite[-1]
    csv = tmp_path / "redo.csv"
    # One listed shape is not in the suite (K=17): it is ignored, not invented.
    csv.write_text(f"M,N,K,dtype\n{a.m},{a.n},{a.k},bf16\n{b.m},{b.n},{b.k},bf16\n7,4096,17,bf16\n")
    got = _shapes_from_args(_args(["--suite", "train", "--dtype", "bf16", "--only", str(csv)]))
    assert sorted((s.m, s.n, s.k) for s in got) == sorted([(a.m, a.n, a.k), (b.m, b.n, b.k)])
    assert {s.origins for s in got} == {a.origins, b.origins} and all(s.family != "user" for s in got)


def test_only_with_a_stage_column_keeps_only_those_stages(tmp_path):
    """An MoE re-measure of one stage: a gate_up and a down shape of one layer differ in (N, K), but
    the stage column must still narrow the list to the stages it names."""
    from gemm_costmodel import registry

    suite = registry.get("moe").suite("train", "fp8")
    down = next(s for s in suite if s.stage == "down" and s.m == 1)
    up = next(s for s in suite if s.stage == "gate_up" and s.m == 1)
    csv = tmp_path / "redo.csv"
    csv.write_text(f"M,N,K,dtype,stage\n{down.m},{down.n},{down.k},fp8,down\n{up.m},{up.n},{up.k},fp8,down\n")
    got = _shapes_from_args(_args(["--op", "moe", "--suite", "train", "--dtype", "fp8", "--only", str(csv)]))
    assert got and {s.stage for s in got} == {"down"}
    assert {(s.m, s.n, s.k) for s in got} == {(down.m, down.n, down.k)}
    without = tmp_path / "both.csv"
    without.write_text(f"M,N,K,dtype\n{down.m},{down.n},{down.k},fp8\n{up.m},{up.n},{up.k},fp8\n")
    both = _shapes_from_args(_args(["--op", "moe", "--suite", "train", "--dtype", "fp8", "--only", str(without)]))
    assert {s.stage for s in both} == {"down", "gate_up"}


def test_only_without_a_dtype_column_selects_every_listed_dtype(tmp_path):
    """An --only list of M, N, K alone names the shapes in each dtype the sweep selects (it was read
    as bf16, so an fp8 sweep of it stopped with 'none of its shapes')."""
    fp8 = GS.training_suite("fp8")
    a = next(s for s in fp8 if s.m == 1)
    csv = tmp_path / "m1.csv"
    csv.write_text(f"M,N,K\n{a.m},{a.n},{a.k}\n")
    got = _shapes_from_args(_args(["--suite", "train", "--dtype", "fp8", "--only", str(csv)]))
    assert {(s.m, s.n, s.k, s.dtype) for s in got} == {(a.m, a.n, a.k, "fp8")}
    both = _shapes_from_args(_args(["--suite", "train", "--dtype", "bf16", "fp8", "--only", str(csv)]))
    assert {s.dtype for s in both} <= {"bf16", "fp8"} and "fp8" in {s.dtype for s in both}
    # With a dtype column the list names that dtype only.
    csv.write_text(f"M,N,K,dtype\n{a.m},{a.n},{a.k},bf16\n")
    only_bf16 = _shapes_from_args(_args(["--suite", "train", "--dtype", "bf16", "fp8", "--only", str(csv)]))
    assert {s.dtype for s in only_bf16} <= {"bf16"}


def test_only_with_no_suite_shape_fails_with_one_line(tmp_path, capsys):
    csv = tmp_path / "none.csv"
    csv.write_text("M,N,K\n7,4096,17\n")
    assert cli_main(["bench", "--suite", "train", "--only", str(csv)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of its shapes" in err[0]
