"""Sweep health against hand-counted frames: status counts overall and per shape, and a
warning exactly for the shapes where more than 1% of rows failed for a reason other
than a compile error or a resource limit of the config."""
import pandas as pd

from gemm_costmodel.data import dataset as D
from gemm_costmodel.data.health import failure_kind, health, is_oom

OOM_TEXT = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def shape_rows(m, statuses, error=""):
    """Rows of one bf16 shape (m x 4096 x 4096): statuses is [(status, count), ...]."""
    rows = []
    for status, count in statuses:
        rows += [{"gpu_name": "NVIDIA H100 80GB HBM3", "dtype": "bf16", "m": m, "n": 4096, "k": 4096,
                  "status": status, "error": error if status == "compile_error" else ""}] * count
    return rows


def frame():
    return pd.DataFrame(
        # 1 of 100 rows 'wrong': exactly 1%, not above it -> listed, no warning.
        shape_rows(1, [("ok", 97), ("compile_error", 2), ("wrong", 1)])
        # A compile error that reports out of memory is an OOM: 1 of 50 = 2% -> warning.
        + shape_rows(2, [("ok", 48), ("out_of_resources", 1)]) + shape_rows(2, [("compile_error", 1)], OOM_TEXT)
        # All ok: not listed.
        + shape_rows(3, [("ok", 10)])
        # Only failures of the config itself, 5% of the rows: listed, no warning.
        + shape_rows(4, [("ok", 190), ("out_of_resources", 6), ("compile_error", 4)])
        # Crashes and OOMs: 3 of 100 -> warning.
        + shape_rows(5, [("ok", 97), ("crash", 1), ("out_of_memory", 2)]))


def test_health_counts_and_warns_exactly_above_one_percent():
    text, warnings = health(frame())
    gpu = "on NVIDIA H100 80GB HBM3"
    assert text.splitlines() == [
        "rows by status: ok 442, wrong 1, compile_error 7, out_of_resources 7, out_of_memory 2, crash 1 "
        "(460 rows, 5 shapes)",
        "  1 compile_error row(s) report out of memory: counted as out_of_memory below",
        "shapes with failed rows: 4 of 5",
        f"  bf16:1x4096x4096 {gpu}: ok 97, wrong 1, compile_error 2 (of 100)",
        f"  bf16:2x4096x4096 {gpu}: ok 48, out_of_resources 1, out_of_memory 1 (of 50)",
        f"  bf16:4x4096x4096 {gpu}: ok 190, compile_error 4, out_of_resources 6 (of 200)",
        f"  bf16:5x4096x4096 {gpu}: ok 97, out_of_memory 2, crash 1 (of 100)",
    ]
    assert len(warnings) == 2 and all(w.startswith("WARNING: ") for w in warnings)
    assert warnings[0].startswith(f"WARNING: bf16:2x4096x4096 {gpu}: 1 of 50 rows (2.0%) failed other than by "
                                  "a compile error or a resource limit (out_of_memory 1)")
    assert warnings[1].startswith(f"WARNING: bf16:5x4096x4096 {gpu}: 3 of 100 rows (3.0%) failed other than by "
                                  "a compile error or a resource limit (out_of_memory 2, crash 1)")


def test_health_threshold_and_healthy_sweeps():
    # The same frame with a 0.5% threshold also warns about the shape at exactly 1%.
    _, warnings = health(frame(), warn_fraction=0.005)
    assert [w.split(" ")[1] for w in warnings] == ["bf16:1x4096x4096", "bf16:2x4096x4096", "bf16:5x4096x4096"]
    text, warnings = health(pd.DataFrame(shape_rows(3, [("ok", 10)]) + shape_rows(9, [("ok", 5)])))
    assert text == "rows by status: ok 15 (15 rows, 2 shapes)" and warnings == []
    assert health(pd.DataFrame(columns=["status"])) == ("rows by status: none (no rows)", [])


def test_oom_labels():
    df = pd.DataFrame(shape_rows(2, [("compile_error", 1)], OOM_TEXT) + shape_rows(2, [("compile_error", 1)], "x")
                      + shape_rows(2, [("out_of_memory", 1), ("ok", 1)]))
    assert list(is_oom(df)) == [True, False, True, False]
    assert list(failure_kind(df)) == ["out_of_memory", "compile_error", "out_of_memory", "ok"]
    # Raw harness rows written before the 'error' column existed: no mislabelled OOMs.
    assert list(is_oom(df.drop(columns=["error"]))) == [False, False, True, False]


def test_dataset_exposes_health():
    assert D.health is health
