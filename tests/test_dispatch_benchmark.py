"""The CPU dispatch benchmark script runs end to end and writes its result file (small sizes)."""
import json

import pytest

from gemm_costmodel.benchmarks import dispatch_cpu


def test_dispatch_cpu_smoke(tmp_path):
    assert dispatch_cpu.main(["--out", str(tmp_path), "--cold", "20", "--warm", "50", "--mixed", "200"]) == 0
    res = json.loads((tmp_path / "dispatch_cpu.json").read_text())
    assert res["cold_shortlist"]["decisions"] == 20
    # Every run reports its threads' CPU time beside the wall time, and the off-CPU count.
    assert 0 < res["cold_shortlist"]["cpu_p50_us"] <= res["cold_shortlist"]["max_us"]
    assert 0 <= res["cold_shortlist"]["off_cpu_decisions"] <= 20
    # The shortlist scores fewer candidates than the whole feasible set.
    assert res["cold_shortlist"]["candidates_scored_median"] < res["cold_all_feasible"]["candidates_scored_median"]
    assert res["concurrency"]["errors"] == 0 and res["concurrency"]["mismatches_vs_single_thread"] == 0
    assert res["warm"]["select_ns"] > 0


def test_latency_summary_splits_off_cpu_decisions():
    # 100 decisions: 98 at 200 us wall / 190 us CPU, one whose own work is slow (900 us wall and
    # CPU) and one preempted (5,000 us wall, 200 us CPU: 4.8 ms off the CPU).
    wall = [200.0] * 98 + [900.0, 5000.0]
    cpu = [190.0] * 98 + [900.0, 200.0]
    s = dispatch_cpu.latency_summary(wall, cpu)
    assert s["decisions"] == 100 and s["max_us"] == 5000.0 and s["cpu_max_us"] == 900.0
    assert s["off_cpu_decisions"] == 1  # the slow-but-busy one is not off the CPU
    # numpy's linear percentile over 99 on-CPU values: rank 0.99 * 98 = 97.02 -> 200 + 0.02 * 700.
    assert s["p99_us_on_cpu"] == pytest.approx(214.0)
    assert s["p50_us"] == 200.0 and s["cpu_p50_us"] == 190.0
    # The wall p99 (rank 98.01 of 100 values) sits between the two slow decisions.
    assert s["p99_us"] == pytest.approx(900.0 + 0.01 * 4100.0)
    with pytest.raises(ValueError, match="one length"):
        dispatch_cpu.latency_summary([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        dispatch_cpu.latency_summary([], [])


@pytest.mark.parametrize("interleave", [False, True])
def test_timed_decisions_run_back_to_back_unless_interleaved(tmp_path, monkeypatch, interleave):
    # The phase probes (``Dispatcher._feasible`` is theirs alone: select does not call it) run the
    # whole model, whose trees a cascaded select never reads; between two timed decisions they
    # would evict the cascade's trees from the CPU's caches. By default every timed select of a
    # run comes first, then the probes; --interleave-phases keeps the old order.
    from gemm_costmodel.serving.runtime import Dispatcher

    events = []
    select, feasible = Dispatcher.select, Dispatcher._feasible
    monkeypatch.setattr(Dispatcher, "select", lambda self, *a, **k: events.append("S") or select(self, *a, **k))
    monkeypatch.setattr(Dispatcher, "_feasible", lambda self, *a: events.append("P") or feasible(self, *a))
    args = ["--out", str(tmp_path), "--cold", "6", "--warm", "5", "--mixed", "5"]
    assert dispatch_cpu.main(args + (["--interleave-phases"] if interleave else [])) == 0
    first = "".join(events[:12])  # the first run's 6 decisions and 6 probes (warm_up calls neither)
    assert first == ("SP" * 6 if interleave else "S" * 6 + "P" * 6)
    res = json.loads((tmp_path / "dispatch_cpu.json").read_text())
    assert res["phases"] == ("interleaved" if interleave else "separate pass")
    assert res["cold_shortlist"]["cascade_agreement"] == 1.0
