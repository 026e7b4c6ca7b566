"""Summaries against hand-computed answers, and the CLI's summarize/configs commands."""
import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from gemm_costmodel import cli
from gemm_costmodel.benchmarks import summary as S


def row(dtype, m, n, k, candidate, variant, status, p50):
    return dict(dtype=dtype, m=m, n=n, k=k, candidate=candidate, variant=variant, status=status,
                p50_us=p50, p20_us=p50 * 0.99, p80_us=p50 * 1.01)


ROWS = [
    # Shape A: the "wrong" split-K row has the smallest p50 and must be ignored.
    row("bf16", 16, 4096, 4096, "tiled_m16n64k128_g8_w4s3", "tiled", "ok", 40.0),
    row("bf16", 16, 4096, 4096, "splitk_m16n64k128_s4_w4s3", "splitk", "wrong", 1.0),
    row("bf16", 16, 4096, 4096, "cublas", "vendor", "ok", 50.0),
    # Shape B: the persistent kernel wins; cuBLAS is twice as slow.
    row("bf16", 2048, 1024, 512, "tiled_m128n128k64_g8_w4s3", "tiled", "ok", 20.0),
    row("bf16", 2048, 1024, 512, "persistent_m128n128k64_g8_w8s3", "persistent", "ok", 15.0),
    row("bf16", 2048, 1024, 512, "cublas", "vendor", "ok", 30.0),
]


@pytest.fixture
def frame():
    return pd.DataFrame(ROWS)


def test_per_shape_hand_computed(frame):
    ps = S.per_shape(frame)
    assert list(zip(ps["m"], ps["n"], ps["k"])) == [(16, 4096, 4096), (2048, 1024, 512)]
    a, b = ps.iloc[0], ps.iloc[1]
    assert a["oracle_id"] == "tiled_m16n64k128_g8_w4s3" and a["oracle_us"] == 40.0
    assert a["oracle_variant"] == "tiled"
    assert a["cublas_us"] == 50.0 and a["speedup_vs_cublas"] == pytest.approx(1.25)
    assert a["n_rows"] == 3 and a["n_ok"] == 2
    assert b["oracle_id"] == "persistent_m128n128k64_g8_w8s3" and b["oracle_us"] == 15.0
    assert b["oracle_variant"] == "persistent"
    assert b["cublas_us"] == 30.0 and b["speedup_vs_cublas"] == pytest.approx(2.0)
    assert b["n_rows"] == 3 and b["n_ok"] == 3
    assert S.geomean(ps["speedup_vs_cublas"]) == pytest.approx(math.sqrt(1.25 * 2.0))


def test_per_shape_row_order_does_not_matter(frame):
    a = S.per_shape(frame)
    b = S.per_shape(frame.iloc[::-1].reset_index(drop=True))
    pd.testing.assert_frame_equal(a, b)


def test_geomean():
    assert S.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert S.geomean([1.0, float("nan"), 4.0, 0.0, -3.0]) == pytest.approx(2.0)  # NaN and <= 0 ignored
    assert math.isnan(S.geomean([]))
    assert math.isnan(S.geomean([float("nan")]))


def test_min_bytes_hand_computed():
    # (16*4096 + 4096*4096) * 2 B read + 16*4096 * 2 B written
    assert S.min_bytes(16, 4096, 4096, "bf16") == 33816576
    # fp8: 1 B inputs, bf16 output
    assert S.min_bytes(1, 32, 64, "fp8") == (64 + 32 * 64) * 1 + 32 * 2 == 2176
    assert S.min_bytes(2, 3, 5, "fp32") == (10 + 15) * 4 + 6 * 4 == 124


def test_hbm_floor_fraction(frame):
    ps = S.per_shape(frame)
    fl = S.hbm_floor(ps, copy_gbps=1000.0)  # 1000 GB/s = 1e3 bytes per microsecond
    a = fl.iloc[0]
    assert a["weight_mb"] == pytest.approx(4096 * 4096 * 2 / 2**20) == 32.0
    assert a["floor_us"] == pytest.approx(33816576 / 1e6)
    assert a["oracle_floor_frac"] == pytest.approx(33.816576 / 40.0)
    assert a["cublas_floor_frac"] == pytest.approx(33.816576 / 50.0)
    assert "floor_us" not in ps.columns  # input not modified


def test_summarize_text(frame):
    text = S.summarize(frame, copy_gbps=1000.0)
    assert "Oracle (best Triton) vs cuBLAS, 2 shapes" in text
    assert "| bf16 | all | 2 | 1.581x | 2/2 |" in text            # sqrt(2.5) = 1.581
    assert "| bf16 | M <= 64 | 1 | 1.250x | 1/1 |" in text
    assert "| bf16 | M >= 1024 | 1 | 2.000x | 1/1 |" in text
    assert "Oracle variant counts: tiled 1, persistent 1" in text or \
           "Oracle variant counts: persistent 1, tiled 1" in text
    assert "| bf16 | 16 | 4096 | 4096 | 32 | 33.8 | 40.0 | 85% | 68% |" in text


def test_markdown_table():
    df = pd.DataFrame({"a": [1, 2], "b": [0.5, 1 / 3]})
    assert S.markdown_table(df) == "| a | b |\n|---|---|\n| 1 | 0.5 |\n| 2 | 0.3333 |"


def test_per_shape_keeps_shape_without_ok_triton_row(frame):
    extra = pd.DataFrame([
        row("bf16", 1, 512, 512, "tiled_m16n32k64_g8_w4s3", "tiled", "compile_error", float("nan")),
        row("bf16", 1, 512, 512, "cublas", "vendor", "ok", 5.0),
    ])
    ps = S.per_shape(pd.concat([frame, extra], ignore_index=True))
    assert len(ps) == 3
    r = ps[ps["m"] == 1].iloc[0]
    assert r["cublas_us"] == 5.0 and math.isnan(r["oracle_us"]) and r["n_ok"] == 1


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def test_cli_summarize_missing_file(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert cli.main(["summarize", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"costmodel: error: result file not found: {missing}\n"


def test_cli_summarize_glob_without_matches(tmp_path, capsys):
    assert cli.main(["summarize", str(tmp_path / "*.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("costmodel: error: no result files match") and err.count("\n") == 1


def test_cli_summarize_empty_file(tmp_path, capsys):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    assert cli.main(["summarize", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("costmodel: error: cannot summarize") and err.count("\n") == 1


def test_cli_summarize_file(tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert cli.main(["summarize", str(p), "--copy-gbps", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Oracle (best Triton) vs cuBLAS, 2 shapes" in out
    assert "| bf16 | all | 2 | 1.581x | 2/2 |" in out


def test_cli_summarize_exit_code_in_subprocess(tmp_path):
    missing = tmp_path / "nope.jsonl"
    res = subprocess.run([sys.executable, "-m", "gemm_costmodel.cli", "summarize", str(missing)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == f"costmodel: error: result file not found: {missing}\n"


def test_cli_configs(capsys):
    assert cli.main(["configs", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert out == ("gemm sm90 bf16: 658 candidates (tiled 92, splitk 192, persistent 38, swapab 92, swapab_tma 92, "
                   "gemv 151, vendor 1)\n")
    assert "658 candidates" in out


def test_cli_configs_all_dtypes(capsys):
    assert cli.main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["gemm sm90 bf16", "gemm sm90 fp16", "gemm sm90 fp8"]
    assert "697 candidates" in lines[2]


# ----------------------------------------------------------------------------
# Broken result files: a one-line reason naming the file (and line), never a
# traceback or a summary of part of the file
# ----------------------------------------------------------------------------

def many_rows(count):
    """count ok rows of distinct shapes (so the summary's shape count shows what was read)."""
    return [row("bf16", m, 1024, 512, "cublas", "vendor", "ok", 10.0 + m) for m in range(1, count + 1)]


def write_gz(path, lines):
    import gzip

    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(lines)
    return path


def test_cli_summarize_good_gz_file(tmp_path, capsys):
    p = write_gz(tmp_path / "r.jsonl.gz", [json.dumps(r) + "\n" for r in many_rows(200)])
    assert cli.main(["summarize", str(p)]) == 0
    assert "Oracle (best Triton) vs cuBLAS, 200 shapes" in capsys.readouterr().out


def test_cli_summarize_truncated_gz(tmp_path, capsys):
    whole = write_gz(tmp_path / "whole.jsonl.gz", [json.dumps(r) + "\n" for r in many_rows(2000)])
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert cli.main(["summarize", str(cut)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"costmodel: error: cannot summarize: {cut}: gzip stream cut short")


def test_cli_summarize_corrupt_line_names_file_and_line(tmp_path, capsys):
    lines = [json.dumps(r) + "\n" for r in many_rows(200)]
    lines[100] = '{"dtype": "bf16", "m": 1\n'   # line 101 of 200
    p = write_gz(tmp_path / "bad.jsonl.gz", lines)
    assert cli.main(["summarize", str(p)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"{p}:101: corrupt line, not JSON" in err and "100 rows read before it" in err


def test_read_rows_torn_last_line(tmp_path):
    from gemm_costmodel.benchmarks.store import RowsError, read_rows

    good = [json.dumps(r) + "\n" for r in many_rows(3)]
    plain = tmp_path / "shard.jsonl"
    plain.write_text("".join(good) + good[0][:20])   # a sweep still writing its 4th row
    assert len(read_rows([plain])) == 3
    with pytest.raises(RowsError, match=r"shard\.jsonl:4: corrupt line.*3 rows read"):
        read_rows([plain], strict=True)
    # A committed .gz is never being written: its torn last line is an error either way.
    gz = write_gz(tmp_path / "shard.jsonl.gz", good + [good[0][:20]])
    with pytest.raises(RowsError, match=r"shard\.jsonl\.gz:4: corrupt line"):
        read_rows([gz])
    # A complete corrupt line is an error even in a file being written.
    plain.write_text(good[0] + "{oops}\n" + good[1])
    with pytest.raises(RowsError, match=r"shard\.jsonl:2: corrupt line.*1 rows read"):
        read_rows([plain])
    plain.write_text(good[0] + "[1, 2]\n")
    with pytest.raises(RowsError, match=r"shard\.jsonl:2: corrupt line, a JSON list"):
        read_rows([plain])
