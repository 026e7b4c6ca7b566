"""The CPU dispatch benchmark script runs end to end and writes its result file (small sizes)."""
import json

from gemm_costmodel.benchmarks import dispatch_cpu


def test_dispatch_cpu_smoke(tmp_path):
    assert dispatch_cpu.main(["--out", str(tmp_path), "--cold", "20", "--warm", "50", "--mixed", "200"]) == 0
    res = json.loads((tmp_path / "dispatch_cpu.json").read_text())
    assert res["cold_shortlist"]["decisions"] == 20
    # The shortlist scores fewer candidates than the whole feasible set.
    assert res["cold_shortlist"]["candidates_scored_median"] < res["cold_all_feasible"]["candidates_scored_median"]
    assert res["concurrency"]["errors"] == 0 and res["concurrency"]["mismatches_vs_single_thread"] == 0
    assert res["warm"]["select_ns"] > 0
