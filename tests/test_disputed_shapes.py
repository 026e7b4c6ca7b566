"""benchmarks/explore/disputed_shapes.py: which evaluation shapes get a third run (issue 16)."""
import pandas as pd

import disputed_shapes


def _rows(shape, run, times):
    m, n, k = shape
    return [{"m": m, "n": n, "k": k, "dtype": "fp8", "candidate": c, "p50_us": t, "run": run}
            for c, t in times.items()]


def test_a_glitch_near_the_best_disputes_the_shape_and_one_far_from_it_does_not():
    rows = []
    # Shape A: config b reads 1.18x in run 2 and ties the best in run 1: disputed (spread 1.18).
    rows += _rows((16, 2048, 512), "r1", {"a": 3.0, "b": 3.0, "c": 5.0})
    rows += _rows((16, 2048, 512), "r2", {"a": 3.0, "b": 3.54, "c": 5.0})
    # Shape B: the runs disagree only on c, 1.67x off the best: outside --near, not disputed.
    rows += _rows((100, 4096, 512), "r1", {"a": 4.0, "b": 4.1, "c": 6.0})
    rows += _rows((100, 4096, 512), "r2", {"a": 4.0, "b": 4.1, "c": 9.0})
    # Shape C: 4% apart, under the 5% spread.
    rows += _rows((1, 1536, 1536), "r1", {"a": 2.0, "b": 2.1})
    rows += _rows((1, 1536, 1536), "r2", {"a": 2.08, "b": 2.1})
    # Shape D: one run only: nothing to compare.
    rows += _rows((512, 256, 7168), "r1", {"a": 10.0, "b": 20.0})
    out = disputed_shapes.disputed(pd.DataFrame(rows), near=1.10, spread=1.05)
    assert list(zip(out["M"], out["N"], out["K"])) == [(16, 2048, 512)]
    got = out.iloc[0]
    assert got["runs"] == 2 and got["near_candidates"] == 2 and abs(got["max_spread"] - 1.18) < 1e-9
    assert list(out.columns[:4]) == ["M", "N", "K", "dtype"]  # the bench --only format


def test_a_shape_with_three_runs_is_settled():
    # The glitch of the first test with a third run that agrees with run 1: the median of three
    # rejects it, so the shape needs no further run (unless max_runs asks for more).
    rows = []
    rows += _rows((16, 2048, 512), "r1", {"a": 3.0, "b": 3.0})
    rows += _rows((16, 2048, 512), "r2", {"a": 3.0, "b": 3.54})
    rows += _rows((16, 2048, 512), "r3", {"a": 3.0, "b": 3.0})
    df = pd.DataFrame(rows)
    assert disputed_shapes.disputed(df, near=1.10, spread=1.05).empty
    out = disputed_shapes.disputed(df, near=1.10, spread=1.05, max_runs=3)
    assert len(out) == 1 and out.iloc[0]["runs"] == 3


def test_runs_of_different_gpus_are_never_compared():
    # The same shape on an H100 and an H200 is two shapes: one run each, nothing to compare.
    rows = [{**r, "gpu_name": "H100"} for r in _rows((16, 2048, 512), "r1", {"a": 3.0, "b": 3.0})]
    rows += [{**r, "gpu_name": "H200"} for r in _rows((16, 2048, 512), "r2", {"a": 2.0, "b": 3.0})]
    assert disputed_shapes.disputed(pd.DataFrame(rows), near=1.10, spread=1.05).empty
