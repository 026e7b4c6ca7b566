"""The peer benchmark's pure parts: suite, shape files, resume, summary (no GPU)."""
import json
import math

import pytest

from gemm_costmodel.benchmarks import peers as P
from gemm_costmodel.kernels import shapes as S


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
    assert empty == {"shapes": 1, "shapes_compared": 0, "floor_impossible": [], "floor_check": "ok"}
    assert "No shape" in P.summary_markdown(empty, {})
    assert math.isnan(P._gm([]))


# The AUTOTUNE table as torch's select_algorithm writes it (best first), between other stderr lines.
_AUTOTUNE_TEXT = """W1124 some warning
AUTOTUNE mm(128x14336, 14336x4096)
strides: [14336, 1], [1, 14336]
dtypes: torch.bfloat16, torch.bfloat16
  triton_mm_7 0.0489 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=64, BLOCK_M=64, BLOCK_N=128, num_stages=4, num_warps=4
  mm 0.0530 ms 92.3%
  triton_mm_3 0.0611 ms 80.0% BLOCK_K=32
SingleProcess AUTOTUNE benchmarking takes 1.2 seconds and 3.4 seconds precompiling for 20 choices
AUTOTUNE mm(8192x4096, 4096x28672)
strides: [4096, 1], [1, 4096]
dtypes: torch.bfloat16, torch.bfloat16
  mm 2.4010 ms 100.0%
"""


def test_parse_autotune_takes_each_tables_first_row():
    picks = P.parse_autotune(_AUTOTUNE_TEXT)
    assert [p["choice"] for p in picks] == ["triton_mm_7", "mm"]
    assert picks[0]["op"] == "mm(128x14336, 14336x4096)"
    assert picks[0]["ms"] == pytest.approx(0.0489)
    assert "BLOCK_M=64, BLOCK_N=128" in picks[0]["description"]
    assert picks[1] == {"op": "mm(8192x4096, 4096x28672)", "choice": "mm", "ms": pytest.approx(2.401),
                        "description": ""}
    assert P.parse_autotune("no tables here\n") == []


def test_is_extern_choice():
    assert all(P.is_extern_choice(c) for c in ("mm", "addmm", "_scaled_mm", "bmm"))
    assert not any(P.is_extern_choice(c) for c in ("triton_mm_7", "decompose_k_mm_4_split", "triton_tem_fused_mm_0"))


def test_rotated_orders():
    assert P.rotated(("a", "b", "c"), 0) == ["a", "b", "c"]
    assert P.rotated(("a", "b", "c"), 1) == ["b", "c", "a"]
    assert P.rotated(("a", "b", "c"), 5) == ["c", "a", "b"]


def test_time_rounds_interleaves_and_cancels_a_drift():
    from gemm_costmodel.kernels.timing import FakeTimer

    # Two contenders of the same true time on a GPU that slows by 1 us per measurement (heating):
    # timed one after the other, b would read slower; rotated, both report the median round
    # (round 1: a 104, b 103), one apart instead of growing apart.
    calls = []

    def latency(key):
        calls.append(key)
        return 100.0 + len(calls)

    out = P.time_rounds({"a": lambda i: None, "b": lambda i: None}, FakeTimer(latency), 1, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out["a"]["rounds_us"] == [101.0, 104.0, 105.0] and out["b"]["rounds_us"] == [102.0, 103.0, 106.0]
    assert out["a"]["us"] == 104.0 and out["b"]["us"] == 103.0
    assert out["a"]["round"] == out["b"]["round"] == 1
    assert out["a"]["p20_us"] == pytest.approx(104.0 * 0.99) and out["a"]["stable"] is True
    with pytest.raises(ValueError, match="rounds"):
        P.time_rounds({"a": lambda i: None}, FakeTimer(), 1, rounds=0)


def test_summary_names_inductors_pick_on_slower_shapes():
    rows = [_row(128, 53.0, 48.9, 53.0, inductor_choice="triton_mm_7"),
            _row(8192, 100.0, 100.0, 100.0, inductor_choice="mm")]
    s = P.summarize(rows)
    assert s["slower_detail"] == [{"shape": "bf16:128x4096x4096", "speedup": pytest.approx(48.9 / 53.0),
                                   "dispatched": "x", "inductor_choice": "triton_mm_7"}]
    assert s["inductor_picks_extern"] == 1 and s["inductor_picks_known"] == 2
    md = P.summary_markdown(s, {"copy_gbps": 1.0})
    assert "| bf16:128x4096x4096 | 0.923 | x | triton_mm_7 |" in md
    assert "Inductor picked cuBLAS (extern) on 1 of 2" in md


def test_cli_rejects_zero_rounds(capsys):
    with pytest.raises(SystemExit):
        P.main(["--out", "x", "--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_time_rounds_reports_one_round_for_every_contender():
    """Both contenders' times come from one round, the median by level (the geometric mean of the
    round's times), never a pair of rounds chosen per contender."""
    from gemm_costmodel.kernels.timing import Timing

    class Scripted:
        def __init__(self, table):
            self.table, self.r = table, 0

        def measure_paired(self, fns, n_copies):
            row = self.table[self.r]
            self.r += 1
            return {lb: Timing(v, v, v, 3, 1) for lb, v in row.items()}

    table = [{"a": 100.0, "b": 100.0}, {"a": 110.0, "b": 130.0}, {"a": 125.0, "b": 112.0}]
    out = P.time_rounds({"a": None, "b": None}, Scripted(table), 1, rounds=3)
    # levels: 100*100, 110*130 = 14300, 125*112 = 14000 -> sorted rounds 0, 2, 1; median round 2
    assert out["a"]["round"] == out["b"]["round"] == 2
    assert (out["a"]["us"], out["b"]["us"]) == (125.0, 112.0)
    # Per-label medians would have said a 110 (round 1) and b 112 (round 2): a pair never timed together.
    assert out["a"]["rounds_us"] == [100.0, 110.0, 125.0] and out["b"]["rounds_us"] == [100.0, 130.0, 112.0]
    two = P.time_rounds({"a": None}, Scripted([{"a": 9.0}, {"a": 7.0}]), 1, rounds=2)
    assert two["a"]["us"] == 7.0 and two["a"]["round"] == 1  # even count: the lower middle


def test_copy_bandwidth_counts_read_and_write_per_launch_and_checks_the_datasheet():
    """The fixed copy (issue 63): bytes read + written per launch over the timer's per-launch p50
    (a replay of n_inner copies is already divided by n_inner), the best of every method and trial,
    checked against the datasheet."""
    from gemm_costmodel.kernels.timing import FakeTimer, Timing

    nbytes = 4096  # 1,024 floats a side on the CPU
    t = FakeTimer(lambda key: {"copy_memcpy": 4.0, "copy_kernel": 2.0}[key])
    c = P.copy_bandwidth(t, nbytes=nbytes, device="cpu", trials=2, warmup_s=0, datasheet_gbps=5.0)
    assert t.calls == 4 and [r["method"] for r in c["readings"]] == ["memcpy", "kernel"] * 2
    # 2 * 4096 bytes in 2 us = 4.096 GB/s (the kernel); the memcpy reads 2.048.
    assert c["gbps"] == pytest.approx(2 * nbytes / 2e-6 / 1e9) and c["method"] == "kernel"
    assert c["readings"][0]["gbps"] == pytest.approx(2.048)
    assert c["datasheet_fraction"] == pytest.approx(4.096 / 5.0) and c["check"] == "ok"
    assert "impossible" in P.copy_bandwidth(t, nbytes=nbytes, device="cpu", trials=1, warmup_s=0,
                                            datasheet_gbps=4.0)["check"]
    assert "suspect" in P.copy_bandwidth(t, nbytes=nbytes, device="cpu", trials=1, warmup_s=0,
                                         datasheet_gbps=6.0)["check"]

    class Replays:
        """A timer whose replays hold 8 copies: its p50 is already one copy's time."""

        def measure(self, fn, n_copies, key=""):
            fn(0)
            return Timing(1.9, 2.0, 2.1, n_samples=15, n_inner=8)

    c = P.copy_bandwidth(Replays(), nbytes=nbytes, device="cpu", trials=1, warmup_s=0)
    assert c["gbps"] == pytest.approx(4.096) and c["readings"][0]["n_inner"] == 8
    assert c["datasheet_fraction"] is None and c["check"] == "ok"


def test_shape_bytes_and_copy_fraction():
    assert P.shape_bytes(1, 8192, 4608, "bf16") == (8192 * 4608 + 4608) * 2 + 8192 * 2
    assert P.shape_bytes(2, 64, 128, "fp8") == (64 * 128 + 2 * 128) * 1 + 2 * 64 * 2  # fp8 writes bf16
    # 75.5 MB in 22.3 us at a 4,300 GB/s copy: 0.79 of it.
    b = P.shape_bytes(1, 8192, 4608, "bf16")
    assert P.copy_fraction(b, 22.3, 4300.0) == pytest.approx(b / 22.3e-6 / 4300e9)
    assert 0.78 < P.copy_fraction(b, 22.3, 4300.0) < 0.80


def test_summarize_flags_an_impossible_floor_and_recomputes_from_the_copy():
    b = P.shape_bytes(1, 4096, 4096, "bf16")
    us = b / 4000e9 * 1e6  # moves at 4,000 GB/s
    rows = [_row(1, us, us * 1.1, us * 1.2, bytes=b, dispatched_floor_fraction=9.9)]
    s = P.summarize(rows, copy_gbps=2764.0)  # the H200's mis-measured copy: 1.45, impossible
    assert s["floor_check"] == "failed"
    assert s["floor_impossible"][0]["contender"] == "dispatched"
    assert s["floor_impossible"][0]["fraction"] == pytest.approx(4000 / 2764)
    assert "Floor check failed" in P.summary_markdown(s, {"copy_gbps": 2764.0})
    s = P.summarize(rows, copy_gbps=4300.0)
    assert s["floor_check"] == "ok" and s["m1"][0]["floor_fraction"] == pytest.approx(4000 / 4300)
    # A read-only kernel may pass the copy's read + write rate: above the copy, below the datasheet
    # (the H200's 4,800 GB/s) is possible; above the datasheet is not; an unknown card keeps 1.02.
    assert P.summarize(rows, copy_gbps=3800.0, peak_gbps=4800.0)["floor_check"] == "ok"
    assert P.summarize(rows, copy_gbps=3800.0)["floor_check"] == "failed"
    assert P.summarize(rows, copy_gbps=3000.0, peak_gbps=3900.0)["floor_check"] == "failed"
    assert P.peak_gbps_of("NVIDIA H200") == 4800.0 and P.peak_gbps_of("no such GPU") is None
    assert "m1_big_weights_min_copy_fraction" not in s  # a 32 MB weight: below the 64 MB of the acceptance
    # Without a copy bandwidth, the rows' own fractions (9.9 here) are read.
    assert P.summarize(rows)["floor_check"] == "failed"


def test_heldout_suite_is_outside_the_training_layers_and_spans_m():
    suite = P.heldout_suite("bf16")
    assert len(suite) == 13 and min(m for m, *_ in suite) == 1 and max(m for m, *_ in suite) == 2048
    pairs = S.nk_pairs()
    assert not [(n, k) for _, n, k, _ in suite if (n, k) in pairs]
    assert sum(1 for m, *_ in suite if m == 1) == 5 and sum(1 for m, *_ in suite if m == 2) == 2
    # fp8 (per-tensor, torch._scaled_mm) needs N and K divisible by 16.
    assert all(n % 16 == 0 and k % 16 == 0 for _, n, k, _ in P.heldout_suite("fp8"))
    assert set(P.SUITES) == {"default", "heldout"}


def test_readme_peers_block_is_regenerated_from_the_committed_run():
    text = "a\n" + P.PEERS_BEGIN + "\nstale\n" + P.PEERS_END + "\nb\n"
    new = P.rewrite_readme(text)
    assert "stale" not in new and new.startswith("a\n" + P.PEERS_BEGIN) and new.endswith(P.PEERS_END + "\nb\n")
    assert "| h200-m4-rows/heldout-bf16 | H200 | 13 | **1.069x** |" in new  # results/peers/h200-m4-rows
    with pytest.raises(ValueError, match="no peers block"):
        P.rewrite_readme("no markers")
    readme = open("README.md", encoding="utf-8").read()
    assert P.rewrite_readme(readme) == readme  # the README's block is current
