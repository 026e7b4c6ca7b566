"""The per-op decision benchmark (issue 58): problems from every ranker op's suite through the
registry's fields, and a tiny end-to-end run."""
import json

import pytest

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import dispatch_ops as B


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_problems_carry_the_ops_fields(op):
    spec = registry.get(op)
    for dtype in spec.dtypes:
        probs = B.draw_problems(spec, dtype, 6, seed=1)
        assert len(probs) == 6
        for i, p in enumerate(probs):
            assert set(p) == set(spec.problem_fields) | set(spec.fixed)
            assert p["dtype"] == dtype and p["m"] >= 1
            if i % 2:  # every other problem takes a random M
                assert p["m"] <= B.M_MAX
        # Seeded: the same draw again.
        assert B.draw_problems(spec, dtype, 6, seed=1) == probs
    assert B.suite_name(spec) in spec.suites


def test_dispatch_ops_tiny_run(tmp_path):
    rc = B.main(["--out", str(tmp_path), "--decisions", "4", "--warm-repeats", "1", "--ops", "gemm"])
    assert rc == 0
    res = json.loads((tmp_path / "dispatch_ops.json").read_text())
    got = {(r["op"], r["dtype"]): r for r in res["results"]}
    assert set(got) == {("gemm", d) for d in registry.get("gemm").dtypes}
    for r in got.values():
        assert r["decisions"] == 4 and r["cold"]["decisions"] == 4
        assert 0 < r["cold"]["cpu_p50_us"] and r["warm"]["select_ns"] > 0
        # Every other decision has a random M: both halves are summarised, the slowest kept.
        assert r["cold_suite_m"]["decisions"] == r["cold_random_m"]["decisions"] == 2
        assert len(r["slowest"]) == 4 and r["slowest"][0]["cpu_us"] >= r["slowest"][-1]["cpu_us"]
    assert got[("gemm", "bf16")]["decided_by"] == "model" and got[("gemm", "bf16")]["suite"] == "foundation"
    assert "| gemm | bf16 | model | 4 |" in (tmp_path / "dispatch_ops.md").read_text()


def test_dispatch_ops_without_a_model_times_the_fallback_rule(tmp_path):
    # A folder without models: every decision is the fallback rule's, and the summary says so.
    empty = tmp_path / "no-models"
    empty.mkdir()
    rc = B.main(["--out", str(tmp_path), "--decisions", "2", "--warm-repeats", "1", "--ops", "grouped_gemm",
                 "--models", str(empty)])
    assert rc == 0
    (r,) = json.loads((tmp_path / "dispatch_ops.json").read_text())["results"]
    assert r["decided_by"] == "fallback rule" and r["fallback_reason"] and r["cold"]["decisions"] == 2
    assert "grouped_gemm bf16: no model serves it" in (tmp_path / "dispatch_ops.md").read_text()
