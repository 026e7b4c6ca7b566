"""The peer benchmark's pure parts: suite, shape files, resume, summary (no GPU)."""
import json
import math

import pytest

from gemm_costmodel.benchmarks import peers as P
from gemm_costmodel.data import shapes as S


def test_default_suite_covers_m_and_big_weights_from_training_families_only():
    suite = P.default_suite("bf16")
    ms = {m for m, _, _, _ in suite}
    assert min(ms) == 1 and max(ms) == 16384 and {2, 4, 16, 64, 128, 512, 2048, 8192} <= ms
    pairs = S.nk_pairs()
    fams = set(S.TRAINING_FAMILIES)
    for _, n, k, dt in suite:
        assert dt == "bf16"
        assert (n, k) in pairs and all(o.split("/")[0] in fams for o in pairs[(n, k)]), (n, k)
    big = {(n, k) for _, n, k, _ in suite if n * k * 2 >= 64 * 2**20}
    assert len(big) >= 2
    assert sum(1 for m, *_ in suite if m == 1) == len(P.SUITE_NK) + len(P.EXTRA_M1_NK)


def test_read_shapes_names_the_bad_field(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text("m,n,k,dtype\n1,4096,4096,bf16\n7,x,4096,\n")
    with pytest.raises(ValueError, match=r"s.csv:3: field 'n'"):
        P.read_shapes(str(f), "bf16")
    f.write_text("m,n,k\n0,4096,4096\n")
    with pytest.raises(ValueError, match=r"field 'm' must be >= 1"):
        P.read_shapes(str(f), "bf16")
    f.write_text("m,n,k,dtype\n3,64,128,fp32\n")
    with pytest.raises(ValueError, match=r"field 'dtype'"):
        P.read_shapes(str(f), "bf16")
    f.write_text("m,n,k,dtype\n3,64,128,\n2,8,16,fp8\n")
    assert P.read_shapes(str(f), "fp16") == [(3, 64, 128, "fp16"), (2, 8, 16, "fp8")]


def test_cli_rejects_bad_shapes_file_before_touching_a_gpu(tmp_path, capsys):
    f = tmp_path / "s.csv"
    f.write_text("m,n,k\n1,-5,4\n")
    assert P.main(["--out", str(tmp_path / "o"), "--shapes", str(f)]) == 2
    assert "field 'n'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        P.main(["--out", str(tmp_path / "o"), "--limit", "-1"])


def test_done_keys_resume(tmp_path):
    path = tmp_path / "peers.jsonl"
    assert P.done_keys(str(path)) == set()
    path.write_text(json.dumps({"m": 1, "n": 2, "k": 3, "dtype": "bf16"}) + "\n\n"
                    + json.dumps({"m": 4, "n": 5, "k": 6, "dtype": "fp8"}) + "\n")
    assert P.done_keys(str(path)) == {"bf16:1x2x3", "fp8:4x5x6"}


def _row(m, ours, ind, cub, **kw):
    return {"m": m, "n": 4096, "k": 4096, "dtype": "bf16", "dispatched": "x", "dispatched_us": ours,
            "inductor_us": ind, "cublas_us": cub, **kw}


def test_summarize_hand_computed():
    rows = [_row(1, 10.0, 11.0, 12.0, inductor_compile_s=2.0, cold_decision_us=300.0),
            _row(16, 20.0, 20.0, 25.0, inductor_compile_s=6.0, cold_decision_us=500.0),
            _row(4096, 100.0, 96.0, 100.0, inductor_compile_s=10.0, cold_decision_us=400.0),
            _row(8, 5.0, None, 6.0, inductor_status="inductor_error: boom")]
    s = P.summarize(rows)
    assert s["shapes"] == 4 and s["shapes_compared"] == 3
    assert s["geomean_vs_inductor"] == pytest.approx((1.1 * 1.0 * 0.96) ** (1 / 3))
    assert s["geomean_vs_cublas"] == pytest.approx((1.2 * 1.25 * 1.0) ** (1 / 3))
    assert s["buckets"]["M=1"] == {"shapes": 1, "vs_inductor": pytest.approx(1.1), "vs_cublas": pytest.approx(1.2)}
    assert s["buckets"]["M=2-64"]["vs_cublas"] == pytest.approx(1.25)
    assert s["buckets"]["M>=2048"]["vs_inductor"] == pytest.approx(0.96)
    assert "M=128-1024" not in s["buckets"]
    assert s["worst_vs_inductor"] == {"shape": "bf16:4096x4096x4096", "speedup": pytest.approx(0.96)}
    # 0.96 < 1/1.03 = 0.9709: more than 3% slower.
    assert s["slower_than_inductor_by_3pct"] == ["bf16:4096x4096x4096"]
    assert s["m1_at_least_as_fast_as_inductor"] is True
    assert s["inductor_compile_s"] == {"median": 6.0, "max": 10.0}
    assert s["cold_decision_us"] == {"median": 400.0, "max": 500.0}
    md = P.summary_markdown(s, {"gpu_name": "G", "copy_gbps": 3000.0})
    assert "geomean vs Inductor: **1.018x**; vs cuBLAS: 1.145x" in md
    assert "| M=1 | 1 | 1.100 | 1.200 |" in md


def test_summarize_m1_slower_and_empty():
    s = P.summarize([_row(1, 10.0, 9.9, 12.0)])
    assert s["m1_at_least_as_fast_as_inductor"] is False
    assert s["slower_than_inductor_by_3pct"] == []  # 0.99 is within 3%
    empty = P.summarize([_row(1, None, 9.9, 12.0)])
    assert empty == {"shapes": 1, "shapes_compared": 0}
    assert "No shape" in P.summary_markdown(empty, {})
    assert math.isnan(P._gm([]))
