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
    rc = B.main(["--out", str(tmp_path), "--decisions", "4", "--warm-repeats", "1", "--ops", "gemm", "grouped_gemm"])
    assert rc == 0
    res = json.loads((tmp_path / "dispatch_ops.json").read_text())
    got = {(r["op"], r["dtype"]): r for r in res["results"]}
    assert set(got) == {("gemm", d) for d in registry.get("gemm").dtypes} | {("grouped_gemm", "bf16")}
    for r in got.values():
        assert r["decisions"] == 4 and r["cold"]["decisions"] == 4
        assert 0 < r["cold"]["cpu_p50_us"] and r["warm"]["select_ns"] > 0
    assert got[("gemm", "bf16")]["decided_by"] == "model" and got[("gemm", "bf16")]["suite"] == "foundation"
    md = (tmp_path / "dispatch_ops.md").read_text()
    assert "| gemm | bf16 | model | 4 |" in md
    # grouped_gemm ships no model yet: its times are the fallback rule's, and the summary says so.
    gg = got[("grouped_gemm", "bf16")]
    if gg["decided_by"] != "model":
        assert gg["fallback_reason"] and "grouped_gemm bf16: no model serves it" in md
        assert "/" + "work" not in json.dumps(gg)  # no machine path in a committed result
