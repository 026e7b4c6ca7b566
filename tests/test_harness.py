"""Sweep harness on the CPU with a fake timer: rows, resume after kills, crash markers, sharding."""
import hashlib
import random
import json
import math
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import harness as H
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.store import ResultStore, read_rows, row_key
from gemm_costmodel.kernels.timing import FakeTimer
from gemm_costmodel.kernels.gemm.space import (PersistentConfig, Problem, VendorConfig,
                                                 feasible_configs)
from gemm_costmodel.kernels.shapes import Shape

from conftest import PROVENANCE

MODE = "sample:3"
SEED = 2  # with this seed the sampled candidates cover all four variants

# Tiny fp16/fp32 shapes with origins. K >= 2 * 64 so that split-K candidates exist.
SHAPES = [
    Shape(1, 40, 136, "fp16", ("llama-3.1/Llama-3.1-8B/qkv_proj/tp1", "mistral/Mistral-7B-v0.3/qkv_proj/tp1")),
    Shape(7, 33, 256, "fp16", ("qwen2.5/Qwen2.5-7B/o_proj/tp2",)),
    Shape(16, 64, 128, "fp32", ("phi/Phi-4/down_proj/tp8",)),
    Shape(33, 72, 136, "fp16", ("gemma-2/Gemma-2-2B/qkv_proj/tp8",)),
]


def latency(key: str) -> float:
    """Deterministic fake latency (us) of a row key."""
    return 5.0 + int.from_bytes(hashlib.sha256(key.encode()).digest()[:2], "little") / 100.0


def candidates(shape, seed=SEED, mode=MODE):
    return H.select_candidates(Problem(shape.m, shape.n, shape.k, shape.dtype), mode, seed, op="gemm")


def expected_keys(shapes=SHAPES, seed=SEED):
    return {H.key_of("gemm", s, c.id) for s in shapes for c in candidates(s, seed)}


TOTAL = sum(len(candidates(s)) for s in SHAPES)


def sweep(path, shapes=SHAPES, timer=None, seed=SEED, **kw):
    timer = timer if timer is not None else FakeTimer(latency)
    kw.setdefault("op", "gemm")  # SHAPES are dense GEMMs
    with ResultStore(path) as store:
        stats = H.run_sweep(shapes, store, timer, mode=MODE, seed=seed, device="cpu",
                            provenance=dict(PROVENANCE), suite="test", progress=False, **kw)
    return stats, timer


def rows_of(path):
    return read_rows([path])


def strip_time(rows):
    return [{k: v for k, v in r.items() if k != "timestamp"} for r in rows]


def same_rows(a, b):
    """Rows equal up to timestamps, NaN == NaN."""
    a, b = strip_time(a), strip_time(b)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def raise_on_call(n, exc):
    """latency_fn that raises exc on its n-th call (1-based)."""
    count = {"n": 0}

    def fn(key):
        count["n"] += 1
        if count["n"] == n:
            raise exc
        return latency(key)

    return fn


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One uninterrupted run of SHAPES: (path, rows, stats, timer)."""
    path = tmp_path_factory.mktemp("baseline") / "full.jsonl"
    stats, timer = sweep(path)
    return path, rows_of(path), stats, timer


def copy_of(baseline, tmp_path):
    dst = tmp_path / "run.jsonl"
    shutil.copy(baseline[0], dst)
    return dst


# ----------------------------------------------------------------------------
# A full run
# ----------------------------------------------------------------------------

def test_expected_candidate_counts():
    for s in SHAPES:
        n = len(candidates(s))
        assert n == (4 if s.dtype == "fp16" else 3)  # 3 Triton + cuBLAS (no vendor for fp32)


def test_full_run_one_row_per_shape_candidate(baseline):
    path, rows, stats, timer = baseline
    assert {r["variant"] for r in rows} == {"tiled", "splitk", "persistent", "vendor"}
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == TOTAL
    assert set(keys) == expected_keys()
    for s in SHAPES:
        assert sum(1 for r in rows if (r["m"], r["n"], r["k"], r["dtype"]) == (s.m, s.n, s.k, s.dtype)) \
            == len(candidates(s))
    assert stats.shapes == len(SHAPES)
    assert stats.measured == TOTAL and stats.skipped == 0 and stats.failed == 0
    assert timer.calls == TOTAL


def test_full_run_rows_content(baseline):
    _, rows, _, _ = baseline
    by_key = {row_key(r): r for r in rows}
    for s in SHAPES:
        for c in candidates(s):
            r = by_key[H.key_of("gemm", s, c.id)]
            for field, value in PROVENANCE.items():
                assert r[field] == value, field
            assert r["status"] == C.STATUS_OK, r["error"]
            assert r["rel_err"] < C.ERROR_BOUNDS[s.dtype]
            assert r["p20_us"] <= r["p50_us"] <= r["p80_us"]
            assert r["p50_us"] == pytest.approx(latency("|".join(map(str, H.key_of("gemm", s, c.id)))))
            assert r["variant"] == c.variant
            assert r["suite"] == "test" and r["timer"] == "fake" and r["seed"] == SEED
            assert r["family"] == s.origins[0].split("/")[0]
            assert r["origins"] == ";".join(s.origins)
            assert r["eval_shape"] is False and r["n_candidates"] == len(candidates(s))
            assert r["n_copies"] == 1 and r["l2_policy"] == "rotate"
            assert r["stable"] is True and r["n_samples"] == 3
            assert r["timestamp"]


def test_rerun_same_seed_measures_nothing(baseline, tmp_path):
    path = copy_of(baseline, tmp_path)
    before = path.read_bytes()
    stats, timer = sweep(path)
    assert timer.calls == 0
    assert stats.measured == 0 and stats.shapes == 0
    assert stats.skipped == TOTAL
    assert path.read_bytes() == before


# ----------------------------------------------------------------------------
# Kills and crashes
# ----------------------------------------------------------------------------

def test_kill_between_shapes_then_resume_equals_uninterrupted(baseline, tmp_path):
    path = tmp_path / "run.jsonl"
    done = []

    def kill_after_two(shape, info):
        done.append(shape)
        if len(done) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(path, on_shape=kill_after_two)
    n_first = len(candidates(SHAPES[0])) + len(candidates(SHAPES[1]))
    assert len(rows_of(path)) == n_first
    assert not (tmp_path / "run.jsonl.inflight").exists()

    stats, timer = sweep(path)
    assert timer.calls == TOTAL - n_first
    assert stats.skipped == n_first and stats.measured == TOTAL - n_first
    assert same_rows(rows_of(path), baseline[1])


@pytest.mark.parametrize("nth", [1, 5, TOTAL])
def test_kill_inside_candidate_then_resume(baseline, tmp_path, nth):
    """KeyboardInterrupt while timing the nth candidate, then resume in a new ResultStore."""
    path = tmp_path / "run.jsonl"
    with pytest.raises(KeyboardInterrupt):
        sweep(path, timer=FakeTimer(raise_on_call(nth, KeyboardInterrupt())))
    assert len(rows_of(path)) == nth - 1
    marker = tmp_path / "run.jsonl.inflight"
    assert not marker.exists()  # a user interrupt is not a crash: no marker left

    stats, timer = sweep(path)
    rows = rows_of(path)
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys))                      # no duplicates
    assert set(keys) == {row_key(r) for r in baseline[1]}   # nothing missing
    # The interrupted candidate is measured again on resume, like all not yet stored.
    assert timer.calls == TOTAL - nth + 1
    assert stats.skipped == nth - 1
    assert same_rows(rows, baseline[1])


def test_sigterm_inside_candidate_stops_like_ctrl_c(baseline, tmp_path):
    """`timeout` sends SIGTERM: no crash marker is left and the resume completes the run."""
    import os
    import signal

    from gemm_costmodel.cli import stop_on_sigterm

    def term_on_third(key, calls=[]):  # noqa: B006 - call counter
        calls.append(key)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return latency(key)

    old = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        path = tmp_path / "run.jsonl"
        with pytest.raises(KeyboardInterrupt):
            sweep(path, timer=FakeTimer(term_on_third))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert len(rows_of(path)) == 2 and not (tmp_path / "run.jsonl.inflight").exists()
    stats, timer = sweep(path)
    assert timer.calls == TOTAL - 2 and same_rows(rows_of(path), baseline[1])


def test_sweep_reports_where_the_time_went(tmp_path):
    import time as _time

    def slow(key):
        _time.sleep(0.004)
        return latency(key)

    stats, timer = sweep(tmp_path / "run.jsonl", timer=FakeTimer(slow))
    ph = stats.phase_seconds
    assert set(ph) == {"setup", "gate", "timing", "store"} and min(ph.values()) > 0
    assert ph["timing"] >= 0.004 * timer.calls  # the timer's sleeps land in 'timing'
    assert sum(ph.values()) <= stats.seconds


def test_torn_last_line_truncated_and_remeasured(baseline, tmp_path):
    path = copy_of(baseline, tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    last = lines[-1]
    torn = b"".join(lines[:-1]) + last[: len(last) // 2]
    path.write_bytes(torn)

    store = ResultStore(path)
    try:
        assert path.read_bytes() == b"".join(lines[:-1])   # cut back to the last newline
        assert len(store.keys) == TOTAL - 1
        assert not store.done(row_key(json.loads(last)))
    finally:
        store.close()

    stats, timer = sweep(path)
    assert timer.calls == 1 and stats.measured == 1 and stats.skipped == TOTAL - 1
    assert same_rows(rows_of(path), baseline[1])


def test_corrupt_line_drops_rest_and_resume_remeasures(baseline, tmp_path):
    path = copy_of(baseline, tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"{not json}\n"
    path.write_bytes(b"".join(lines))
    stats, timer = sweep(path)
    assert timer.calls == TOTAL - 3
    rows = rows_of(path)
    assert len(rows) == TOTAL
    assert {row_key(r) for r in rows} == {row_key(r) for r in baseline[1]}


def _spy_launches(mp):
    launched = []
    orig = C.Operands.run

    def spy(self, cfg):
        launched.append((self.x.shape[0], self.w.shape[0], self.x.shape[1], cfg.id))
        return orig(self, cfg)

    mp.setattr(C.Operands, "run", spy)
    return launched


def test_one_death_inside_a_candidate_is_measured_again(baseline, tmp_path, monkeypatch):
    """A process killed from outside (SIGKILL, a lease ending) leaves the in-flight marker:
    the candidate is no crash of its own, the resume measures it again."""
    path = tmp_path / "run.jsonl"
    victim = H.key_of("gemm", SHAPES[1], candidates(SHAPES[1])[1].id)
    with ResultStore(path) as store:
        store.begin(victim)  # a previous process died inside this candidate, once
    with ResultStore(path) as store:
        assert store.died_in() == (victim, 1) and store.crashed_key() is None
    launched = _spy_launches(monkeypatch)
    stats, timer = sweep(path)
    assert (victim[2], victim[3], victim[4], victim[7]) in launched
    assert timer.calls == TOTAL and stats.failed == 0
    assert same_rows(rows_of(path), baseline[1])
    assert not (tmp_path / "run.jsonl.inflight").exists()


def test_second_death_inside_a_candidate_records_crash_without_running(baseline, tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    victim = H.key_of("gemm", SHAPES[1], candidates(SHAPES[1])[1].id)
    with ResultStore(path) as store:
        store.begin(victim, deaths=1)  # measured again after one death, and died again
    assert ResultStore(path).crashed_key() == victim
    launched = _spy_launches(monkeypatch)
    stats, timer = sweep(path)

    rows = rows_of(path)
    by_key = {row_key(r): r for r in rows}
    assert set(by_key) == expected_keys()
    crash = by_key[victim]
    assert crash["status"] == C.STATUS_CRASH
    assert crash["error"] == "the process died while running this candidate (2 times)"
    assert math.isnan(crash["p50_us"]) and crash["gpu_name"] == PROVENANCE["gpu_name"]
    assert (victim[2], victim[3], victim[4], victim[7]) not in launched
    assert timer.calls == TOTAL - 1
    assert stats.failed == 1 and stats.measured == TOTAL - 1
    assert sum(r["status"] == C.STATUS_OK for r in rows) == TOTAL - 1
    assert not (tmp_path / "run.jsonl.inflight").exists()


def test_marker_of_older_sweeps_counts_as_one_death(baseline, tmp_path):
    path = tmp_path / "run.jsonl"
    victim = H.key_of("gemm", SHAPES[1], candidates(SHAPES[1])[1].id)
    (tmp_path / "run.jsonl.inflight").write_text(json.dumps(list(victim)))
    with ResultStore(path) as store:
        assert store.died_in() == (victim, 1)


_KILL_SCRIPT = """
import json, os, sys, time
from gemm_costmodel.benchmarks import harness as H
from gemm_costmodel.benchmarks.store import ResultStore
from gemm_costmodel.kernels.timing import FakeTimer
from gemm_costmodel.kernels.shapes import Shape

path, ready, nth, prov = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
shapes = [Shape(*s[:4], tuple(s[4])) for s in json.loads(sys.argv[5])]
calls = []

def latency(key):
    calls.append(key)
    if len(calls) == nth:  # in flight: tell the test, then wait to be killed
        # Written aside, then renamed: the test polls for the file and must never read it half written.
        with open(ready + ".tmp", "w") as fh:
            fh.write(key)
        os.replace(ready + ".tmp", ready)
        time.sleep(120)
    return 5.0 + len(key) / 10.0

with ResultStore(path) as store:
    H.run_sweep(shapes, store, FakeTimer(latency), mode=%r, seed=%d, device="cpu",
                provenance=prov, suite="test", progress=False, op="gemm")
""" % (MODE, SEED)


def _run_killable(path, ready, nth):
    import subprocess
    import sys

    shapes = [[s.m, s.n, s.k, s.dtype, list(s.origins)] for s in SHAPES]
    return subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(path), str(ready), str(nth),
                             json.dumps(PROVENANCE), json.dumps(shapes)])


def test_sigkilled_sweep_subprocess_resumes_without_loss_or_duplicates(tmp_path):
    """A real sweep process SIGKILLed mid-shape, inside a candidate, then rerun: every key
    once, the in-flight candidate measured again (not charged as a crash)."""
    import os
    import signal
    import time as _time

    path, ready = tmp_path / "run.jsonl", tmp_path / "ready"
    nth = len(candidates(SHAPES[0])) + 2  # the 2nd candidate of the 2nd shape
    proc = _run_killable(path, ready, nth)
    deadline = _time.monotonic() + 300
    while not ready.exists():
        assert proc.poll() is None, "the sweep ended before it was killed"
        assert _time.monotonic() < deadline, "the sweep never reached the candidate"
        _time.sleep(0.05)
    in_flight = ready.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = rows_of(path)
    assert len(before) == nth - 1
    marker = json.loads((tmp_path / "run.jsonl.inflight").read_text())
    assert "|".join(map(str, marker["key"])) == in_flight and marker["deaths"] == 0

    proc = _run_killable(path, tmp_path / "never", 10**9)  # the rerun is not killed
    assert proc.wait(timeout=600) == 0
    rows = rows_of(path)
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys))  # none duplicated
    assert set(keys) == expected_keys()  # none lost
    assert rows[: nth - 1] == before  # the first run's rows untouched
    redo = [r for r in rows if "|".join(map(str, row_key(r))) == in_flight]
    assert len(redo) == 1 and redo[0]["status"] == C.STATUS_OK  # measured again, no crash
    assert not any(r["status"] == C.STATUS_CRASH for r in rows)
    assert not (tmp_path / "run.jsonl.inflight").exists()


def test_stale_or_garbage_marker_is_ignored(baseline, tmp_path):
    path = copy_of(baseline, tmp_path)
    with ResultStore(path) as store:
        store.begin(row_key(baseline[1][0]))  # already stored: not a crash
        assert store.crashed_key() is None
    (tmp_path / "run.jsonl.inflight").write_text("not json")
    with ResultStore(path) as store:
        assert store.crashed_key() is None


def test_cuda_error_in_timing_records_crash_and_stops(baseline, tmp_path):
    path = tmp_path / "run.jsonl"
    timer = FakeTimer(raise_on_call(3, RuntimeError("CUDA error: an illegal memory access was encountered")))
    with pytest.raises(RuntimeError, match="CUDA context lost"):
        sweep(path, timer=timer)
    rows = rows_of(path)
    assert len(rows) == 3
    assert rows[-1]["status"] == C.STATUS_CRASH and rows[-1]["error"].startswith("timing: CUDA error")
    assert not (tmp_path / "run.jsonl.inflight").exists()
    stats, timer = sweep(path)  # resume: the crash row stays, nothing is duplicated
    assert timer.calls == TOTAL - 3
    assert {row_key(r) for r in rows_of(path)} == expected_keys()


def test_generic_timing_error_is_a_row_and_sweep_continues(tmp_path):
    path = tmp_path / "run.jsonl"
    stats, _ = sweep(path, timer=FakeTimer(raise_on_call(2, ValueError("bad timer"))))
    rows = rows_of(path)
    assert len(rows) == TOTAL
    assert rows[1]["status"] == C.STATUS_COMPILE_ERROR and rows[1]["error"] == "timing: bad timer"
    assert stats.failed == 1 and stats.measured == TOTAL - 1


def test_store_ignores_duplicate_append(tmp_path):
    path = tmp_path / "s.jsonl"
    row = {"dtype": "fp16", "m": 1, "n": 2, "k": 3, "candidate": "cublas", "p50_us": 1.0}
    with ResultStore(path) as store:
        store.append(row)
        store.append(dict(row, p50_us=2.0))
        assert store.keys == {("gemm", "fp16", 1, 2, 3, 1, 1, "cublas", "", "")}  # rows without op: dense GEMM
    with ResultStore(path) as store:
        store.append(row)
    assert rows_of(path) == [row]


# ----------------------------------------------------------------------------
# Sharding
# ----------------------------------------------------------------------------

MANY = [Shape(m, n, k, d) for m in (1, 7, 33) for n, k in ((40, 72), (64, 128), (4096, 4096))
        for d in ("bf16", "fp16")]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shards_partition_shapes(n):
    parts = [H.shard_shapes(MANY, (i, n)) for i in range(n)]
    assert sorted(map(repr, sum(parts, []))) == sorted(map(repr, MANY))   # union == all
    for i in range(n):
        for j in range(i + 1, n):
            assert not set(parts[i]) & set(parts[j])                       # disjoint
        assert parts[i] == [s for s in MANY if s in parts[i]]              # input order kept
    if n > 1:
        assert sum(1 for p in parts if p) > 1                              # actually split


def test_in_shard_is_sha256_of_shape_key():
    s = Shape(7, 40, 72, "fp16", ("a/b/c/tp1",))
    h = int.from_bytes(hashlib.sha256(b"fp16:7x40x72").digest()[:8], "little")
    for n in (1, 2, 3, 5):
        assert H.in_shard(s, (h % n, n))
        assert H.in_shard(Shape(7, 40, 72, "fp16"), (h % n, n))  # origins do not matter


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 20000)),
                max_size=20, unique=True), st.integers(1, 7))
def test_shard_partition_property(dims, n):
    shapes = [Shape(m, nn, k, "bf16") for m, nn, k in dims]
    parts = [H.shard_shapes(shapes, (i, n)) for i in range(n)]
    assert sum(len(p) for p in parts) == len(shapes)
    assert set().union(*map(set, parts)) == set(shapes)


@pytest.mark.parametrize("n", [2, 3])
def test_sharded_runs_cover_unsharded_run(baseline, tmp_path, n):
    keys = []
    for i in range(n):
        path = tmp_path / f"shard{i}of{n}.jsonl"
        sweep(path, shapes=H.shard_shapes(SHAPES, (i, n)))
        keys += [row_key(r) for r in rows_of(path)]
    assert len(keys) == len(set(keys))
    assert set(keys) == {row_key(r) for r in baseline[1]}


@pytest.mark.parametrize("text,want", [("0/1", (0, 1)), ("2/3", (2, 3)), (" 1 / 4 ", (1, 4))])
def test_parse_shard_ok(text, want):
    assert H.parse_shard(text) == want


@pytest.mark.parametrize("text", ["3/3", "a/b", "1", "-1/2", "0/0", "1/2/3", ""])
def test_parse_shard_rejects(text):
    with pytest.raises(ValueError, match="shard"):
        H.parse_shard(text)


# ----------------------------------------------------------------------------
# Candidate selection
# ----------------------------------------------------------------------------

PROB = Problem(64, 4096, 4096, "bf16")


def test_select_candidates_same_seed_same_list():
    a = H.select_candidates(PROB, "sample:5", 0, op="gemm")
    assert a == H.select_candidates(PROB, "sample:5", 0, op="gemm")
    assert a != H.select_candidates(PROB, "sample:5", 1, op="gemm")


def test_select_candidates_sample_k():
    from gemm_costmodel.kernels.gemm.space import config_generation

    feas = feasible_configs(PROB)
    # The base: the first grids of the base variants; issue 63's deep tiled/persistent grids
    # (generation "63") are sampled at the same rate on a stream of their own, like swap-AB.
    base = [c for c in feas if c.variant in H.SAMPLE_BASE_VARIANTS and not config_generation(c)]
    later = [c for c in feas if c.variant in ("swapab", "swapab_tma")]
    deep = [c for c in feas if config_generation(c) == "63"]
    assert len(base) == 315 and len(later) == 56 and len(deep) == 7  # M=64: swap-AB's 64-token configs
    for k, n_later in ((1, 0), (3, 0), (10, 2), (48, 9)):
        got = H.select_candidates(PROB, f"sample:{k}", 7, op="gemm")
        tri = [c for c in got if not isinstance(c, VendorConfig)]
        assert len(set(tri)) == len(tri) == k + n_later
        # k of the base variants (the same draw as before swap-AB existed), and each later
        # variant at the same rate: 48 / 315 of its 28 configs rounds to 4.
        assert [c for c in tri if c.variant in H.SAMPLE_BASE_VARIANTS and not config_generation(c)] == \
            sorted(random.Random(H.stable_hash(f"{PROB.key}/7")).sample(base, k), key=feas.index)
        assert got[-1] == VendorConfig() and len(got) == k + n_later + 1
        assert all(c in feas for c in got)
        assert tri == [c for c in feas if c in tri]  # in space order
    # Asking for more than exist gives every feasible candidate.
    assert H.select_candidates(PROB, "sample:100000", 0, op="gemm") == feas


def test_select_candidates_variant_mode():
    got = H.select_candidates(PROB, "variant:swapab,swapab_tma", 0, op="gemm")
    feas = feasible_configs(PROB)
    assert got == [c for c in feas if c.variant in ("swapab", "swapab_tma")] + [VendorConfig()]
    assert len(got) == 57
    assert H.select_candidates(PROB, "variant:persistent", 0, op="gemm")[-1] == VendorConfig()
    # Prefill shapes have no swap-AB candidate: nothing to add (the vendor alone would only
    # repeat an earlier row), so the sweep skips them.
    assert H.select_candidates(Problem(4096, 4096, 4096, "bf16"), "variant:swapab", 0, op="gemm") == []
    for bad in ("variant:", "variant:nope", "variant:swapab,nope"):
        with pytest.raises(ValueError, match="unknown variant"):
            H.select_candidates(PROB, bad, 0, op="gemm")


def test_select_candidates_pick_mode(tmp_path):
    feas = feasible_configs(PROB)
    a, b = feas[7], feas[3]
    path = tmp_path / "picks.csv"
    # Two feasible configs of PROB, one id the space does not generate, and another problem's row.
    path.write_text(f"key,candidate\n{PROB.key},{a.id}\n{PROB.key},{b.id}\n{PROB.key},tiled_m7n7k7_g1_w1s1\n"
                    f"{Problem(8, 8, 8, 'fp16').key},{a.id}\n")
    got = H.select_candidates(PROB, f"pick:{path}", 0, op="gemm")
    # The listed feasible configs in space order, then the vendor as the run's anchor.
    assert got == [b, a, VendorConfig()]
    # A problem the file does not list has nothing to measure.
    assert H.select_candidates(Problem(16, 4096, 4096, "bf16"), f"pick:{path}", 0, op="gemm") == []


def test_select_candidates_pick_mode_skips_unlisted_before_feasibility(tmp_path, monkeypatch):
    # An adaptation round lists 400 of a suite's 11,270 problems; the others must cost nothing
    # (their feasibility work took ~1,000 s of a round on the GPU host).
    path = tmp_path / "picks.csv"
    path.write_text(f"key,candidate\n{PROB.key},{feasible_configs(PROB)[0].id}\n")
    spec = H.registry.get("gemm")
    calls = []
    monkeypatch.setattr(type(spec), "feasible_configs", lambda self, p, arch="sm90", include_vendor=True: calls.append(p) or [])
    assert H.select_candidates(Problem(16, 4096, 4096, "bf16"), f"pick:{path}", 0, op="gemm") == []
    assert calls == []


def test_select_candidates_pick_mode_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        H.select_candidates(PROB, f"pick:{tmp_path / 'nope.csv'}", 0, op="gemm")
    bad = tmp_path / "bad.csv"
    bad.write_text("problem,candidate\nx,y\n")
    with pytest.raises(ValueError, match="no 'key' column"):
        H.select_candidates(PROB, f"pick:{bad}", 0, op="gemm")
    empty = tmp_path / "empty.csv"
    empty.write_text(f"key,candidate\n{PROB.key},\n")
    with pytest.raises(ValueError, match="line 2: empty key or candidate"):
        H.select_candidates(PROB, f"pick:{empty}", 0, op="gemm")


def test_select_candidates_all_and_respects_feasibility():
    assert H.select_candidates(PROB, "all", 0, op="gemm") == feasible_configs(PROB)
    odd = Problem(7, 33, 100, "fp16")  # K * 2 B = 200: no persistent
    for seed in range(5):
        assert not any(isinstance(c, PersistentConfig) for c in H.select_candidates(odd, "sample:20", seed, op="gemm"))


@pytest.mark.parametrize("mode", ["random", "sample", "sample:x", "ALL", ""])
def test_select_candidates_bad_mode(mode):
    with pytest.raises(ValueError):
        H.select_candidates(PROB, mode, 0, op="gemm")


def test_store_non_object_json_line_is_treated_as_corrupt(tmp_path):
    path = tmp_path / "s.jsonl"
    good = {"dtype": "fp16", "m": 1, "n": 2, "k": 3, "candidate": "cublas"}
    later = dict(good, k=4)
    path.write_text(json.dumps(good) + "\n[1,2]\n" + json.dumps(later) + "\n")
    with ResultStore(path) as store:
        assert store.keys == {("gemm", "fp16", 1, 2, 3, 1, 1, "cublas", "", "")}
    assert rows_of(path) == [good]


# ----------------------------------------------------------------------------
# Timing helpers used by the harness
# ----------------------------------------------------------------------------

def test_copies_for():
    from gemm_costmodel.kernels.timing import copies_for

    mb = 2**20
    assert copies_for(30 * mb, 50 * mb) == 4      # ceil(100 / 30)
    assert copies_for(25 * mb, 50 * mb) == 4      # exactly 2x L2
    assert copies_for(200 * mb, 50 * mb) == 1     # operands alone exceed L2
    assert copies_for(1 * mb, 50 * mb) == 64      # capped
    assert copies_for(1 * mb, 50 * mb, max_copies=8) == 8
    assert copies_for(0, 50 * mb) == 64


def test_timing_percentiles_and_stability():
    from gemm_costmodel.kernels.timing import Timing, summarize

    assert summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]) == (3.0, 6.0, 9.0)
    t = Timing(9.8, 10.0, 10.2, n_samples=15, n_inner=4)
    assert t.spread == pytest.approx(0.04) and t.stable
    assert not Timing(9.0, 10.0, 11.0, 15, 4).stable
    assert Timing(0.0, 0.0, 0.0, 1, 1).spread == float("inf")


def test_fake_timer_runs_fn_and_counts():
    seen = []
    t = FakeTimer(lambda key: 8.0 if key == "a" else 2.0)
    r = t.measure(seen.append, 1, key="a")
    assert seen == [0] and t.calls == 1
    assert (r.p20_us, r.p50_us, r.p80_us) == pytest.approx((7.92, 8.0, 8.08))
    assert t.measure(seen.append, 1, key="b").p50_us == 2.0 and t.calls == 2


def test_time_budget_stops_between_shapes_and_resume_completes(baseline, tmp_path):
    """A zero budget stops before the first shape; a resume without budget measures everything."""
    from gemm_costmodel.benchmarks import harness

    path = tmp_path / "run.jsonl"
    with ResultStore(path) as store:
        stats = harness.run_sweep(SHAPES, store, FakeTimer(), mode=MODE, seed=SEED, device="cpu",
                                  provenance=PROVENANCE, progress=False, time_budget_s=0.0, op="gemm")
    assert stats.stopped_early and stats.measured == 0 and rows_of(path) == []
    stats, timer = sweep(path)
    assert stats.measured == TOTAL and same_rows(rows_of(path), baseline[1])


class _FakeGraph:
    def __init__(self, n_inner):
        self.n_inner = n_inner

    def replay(self):
        pass


class _ScriptedTimer(timing.GraphTimer):
    """GraphTimer whose GPU parts are scripted: a 5 us kernel whose launch estimate
    (20 us of host overhead on top) errs long, and whose replays of fewer than 20
    launches are too short to be stable."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.captures = []

    def _estimate(self, fn, n_copies):
        return 25.0

    def _capture(self, fn, n_inner, n_copies):
        self.captures.append(n_inner)
        return _FakeGraph(n_inner)

    def _replays(self, graph, reps, n_inner):
        spread = 0.01 if n_inner >= 20 else 0.2
        return timing.Timing(5.0 * (1 - spread / 2), 5.0, 5.0 * (1 + spread / 2), n_samples=reps, n_inner=n_inner)


def test_graph_timer_recaptures_when_replays_are_far_below_the_target():
    t = _ScriptedTimer(target_replay_us=250.0)
    got = t.measure(lambda i: None, n_copies=2)
    # 250 / 25 -> 10 launches first; the first set shows 5 us per launch -> 50 launches.
    assert t.captures == [10, 50]
    assert got.n_inner == 50 and got.stable and got.p50_us == 5.0


def test_graph_timer_keeps_the_first_capture_when_the_estimate_was_close():
    class Close(_ScriptedTimer):
        def _estimate(self, fn, n_copies):
            return 6.0  # 250 / 6 -> 42 launches; 250 / 5 = 50 is not more than twice that

    t = Close(target_replay_us=250.0)
    got = t.measure(lambda i: None, n_copies=2)
    assert t.captures == [42] and got.n_inner == 42 and got.stable


def test_graph_timer_paired_sizes_each_graph_and_retries_only_while_unstable():
    class Paired(timing.GraphTimer):
        def __init__(self):
            super().__init__(target_replay_us=250.0)
            self.captures, self.sets = {}, []

        def _estimate(self, fn, n_copies):
            return fn(0)  # the scripted launch time

        def _capture(self, fn, n_inner, n_copies):
            self.captures[fn(0)] = n_inner
            return _FakeGraph(n_inner)

        def _replays_paired(self, graphs, inner, reps):
            self.sets.append((list(graphs), reps))
            # "slow" is unstable in the first set only, and tighter in the second
            spread = {"fast": 0.01, "slow": 0.2 if len(self.sets) == 1 else 0.02}
            return {lb: timing.Timing(10 * (1 - spread[lb] / 2), 10.0, 10 * (1 + spread[lb] / 2), reps, inner[lb])
                    for lb in graphs}

    t = Paired()
    got = t.measure_paired({"slow": lambda i: 100.0, "fast": lambda i: 5.0}, n_copies=2)
    # 250 / 100 -> 3 launches per replay, 250 / 5 -> 50; the replay count is the larger of theirs
    assert t.captures == {100.0: 3, 5.0: 50}
    assert [order for order, _ in t.sets] == [["slow", "fast"], ["slow", "fast"]]
    assert t.sets[0][1] == max(t._reps(3, 100.0), t._reps(50, 5.0))
    assert list(got) == ["slow", "fast"] and got["slow"].stable and got["slow"].spread == pytest.approx(0.02)
    assert got["fast"].spread == pytest.approx(0.01)


# ----------------------------------------------------------------------------
# Out of memory: its own status, retried once, never permanent
# ----------------------------------------------------------------------------

OOM_TEXT = "CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 4.00 MiB is free."


def oom_on_calls(calls_to_fail):
    """latency_fn raising torch's OutOfMemoryError on the given (1-based) calls."""
    import torch

    count = {"n": 0}

    def fn(key):
        count["n"] += 1
        if count["n"] in calls_to_fail:
            raise torch.OutOfMemoryError(OOM_TEXT)
        return latency(key)

    return fn


def test_out_of_memory_is_classified_apart_from_compile_errors():
    import torch

    assert C.classify_exception(torch.OutOfMemoryError(OOM_TEXT)) == C.STATUS_OUT_OF_MEMORY
    assert C.classify_exception(RuntimeError("CUDA error: out of memory")) == C.STATUS_OUT_OF_MEMORY
    assert C.classify_exception(RuntimeError("out of resource: shared memory, Required: 262144")) \
        == C.STATUS_OUT_OF_RESOURCES
    assert C.classify_exception(ValueError("bad timer")) == C.STATUS_COMPILE_ERROR


def test_out_of_memory_once_is_retried_and_measured(baseline, tmp_path):
    path = tmp_path / "run.jsonl"
    stats, timer = sweep(path, timer=FakeTimer(oom_on_calls({4})))
    assert timer.calls == TOTAL + 1  # the 4th candidate was timed twice
    assert stats.failed == 0 and stats.statuses == {"ok": TOTAL}
    assert same_rows(rows_of(path), baseline[1])


def test_out_of_memory_twice_is_a_row_that_resume_measures_again(baseline, tmp_path):
    path = tmp_path / "run.jsonl"
    stats, timer = sweep(path, timer=FakeTimer(oom_on_calls({4, 5})))
    rows = rows_of(path)
    assert len(rows) == TOTAL and stats.statuses == {"ok": TOTAL - 1, "out_of_memory": 1}
    oom = rows[3]
    assert oom["status"] == C.STATUS_OUT_OF_MEMORY and oom["error"].startswith("timing: CUDA out of memory")
    with ResultStore(path) as store:
        assert store.retry_keys == {row_key(oom)} and not store.done(row_key(oom))
    # 4 rows per shape at most: 1 of them out of memory is above 1%: loud warning.
    shape = f"{oom['dtype']}:{oom['m']}x{oom['n']}x{oom['k']}"
    assert stats.unhealthy == [shape]
    assert "WARNING" in H.format_health(stats) and f"{shape}: ok " in H.format_health(stats)

    stats, timer = sweep(path)  # resume: only the out-of-memory candidate runs again
    assert timer.calls == 1 and stats.measured == 1 and stats.skipped == TOTAL - 1
    rows = rows_of(path)
    assert len(rows) == TOTAL + 1 and rows[-1]["status"] == C.STATUS_OK and row_key(rows[-1]) == row_key(oom)
    with ResultStore(path) as store:
        assert store.retry_keys == set() and len(store.keys) == TOTAL


def test_mislabelled_out_of_memory_rows_of_older_sweeps_are_measured_again(baseline, tmp_path):
    path = copy_of(baseline, tmp_path)
    rows = rows_of(path)
    rows[2].update(status=C.STATUS_COMPILE_ERROR, error="timing: " + OOM_TEXT, p50_us=float("nan"))
    rows[5].update(status=C.STATUS_COMPILE_ERROR, error="CompilationError: at 1:1", p50_us=float("nan"))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats, timer = sweep(path)
    assert timer.calls == 1 and stats.measured == 1  # row 2 again; the real compile error stays
    assert row_key(rows_of(path)[-1]) == row_key(rows[2])


def test_out_of_memory_building_inputs_skips_the_shape(baseline, tmp_path, monkeypatch):
    import torch

    orig = C.operand_sets

    def fail_second(problem, *a, **kw):
        if (problem.m, problem.n, problem.k) == (SHAPES[1].m, SHAPES[1].n, SHAPES[1].k):
            raise torch.OutOfMemoryError(OOM_TEXT)
        return orig(problem, *a, **kw)

    monkeypatch.setattr(C, "operand_sets", fail_second)
    path = tmp_path / "run.jsonl"
    stats, timer = sweep(path)
    skipped = f"{SHAPES[1].dtype}:{SHAPES[1].m}x{SHAPES[1].n}x{SHAPES[1].k}"
    assert stats.skipped_shapes == [skipped] and stats.shapes == len(SHAPES) - 1
    assert {row_key(r) for r in rows_of(path)} == expected_keys([s for s in SHAPES if s != SHAPES[1]])
    assert "inputs did not fit" in H.format_health(stats)

    monkeypatch.setattr(C, "operand_sets", orig)
    stats, timer = sweep(path)  # the skipped shape is measured on resume
    assert timer.calls == len(candidates(SHAPES[1]))
    assert same_rows(sorted(rows_of(path), key=row_key), sorted(baseline[1], key=row_key))


def test_other_errors_building_inputs_still_stop_the_sweep(tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("generator on the wrong device")

    monkeypatch.setattr(C, "operand_sets", broken)
    with pytest.raises(RuntimeError, match="wrong device"):
        sweep(tmp_path / "run.jsonl")


def test_health_warning_threshold():
    from collections import Counter

    assert H.health_warning("bf16:1x2x3", Counter(ok=99, wrong=1)) is None  # exactly 1%: fine
    w = H.health_warning("bf16:1x2x3", Counter(ok=98, wrong=1, out_of_memory=1, compile_error=50))
    assert w == ("WARNING: bf16:1x2x3: 2 of 150 rows failed (out_of_memory 1, wrong 1); "
                 "its oracle is not exact until they are measured again")
    # Compile errors and resource limits are properties of the config, not failures of the sweep.
    assert H.health_warning("bf16:1x2x3", Counter(ok=10, compile_error=40, out_of_resources=50)) is None


def test_shape_log_has_one_entry_per_shape_with_status_counts(tmp_path):
    stats, _ = sweep(tmp_path / "run.jsonl")
    assert [e["shape"] for e in stats.shape_log] == [f"{s.dtype}:{s.m}x{s.n}x{s.k}" for s in SHAPES]
    assert [e["rows"] for e in stats.shape_log] == [len(candidates(s)) for s in SHAPES]
    assert all(e["statuses"] == {"ok": e["rows"]} and e["memory"] is None for e in stats.shape_log)


def test_moe_sweep_rows_carry_the_problem_and_resume_by_it(tmp_path):
    """An MoE sweep (CPU interpreter, fp16): rows carry E, top_k, stage, routing and the routing's
    statistics, the op's own parameters; two shapes differing only in routing are two problems,
    and a rerun measures nothing new."""
    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.kernels.moe import routing as R
    from gemm_costmodel.kernels.moe.suites import MoeShape

    shapes = [MoeShape(5, 64, 48, "fp16", 8, 2, "gate_up", ro, ("user/x",)) for ro in ("balanced", "hot")]
    path = tmp_path / "moe.jsonl"
    with ResultStore(path) as store:
        stats = H.run_sweep(shapes, store, FakeTimer(), mode="sample:3", seed=SEED, device="cpu", op="moe",
                            provenance=PROVENANCE, progress=False)
    rows = read_rows([path])
    assert stats.statuses == {"ok": 6} and len(rows) == 6
    for r in rows:
        counts = R.expert_counts(r["routing"], 5, 8, 2)
        assert (r["op"], r["e"], r["top_k"], r["stage"]) == ("moe", 8, 2, "gate_up")
        assert r["tpe_max"] == counts.max() and r["active_experts"] == (counts > 0).sum()
        assert r["split_k"] == 1  # the op's own view (the dense one would say 0)
        assert r["rel_err"] < 2e-3
    assert {r["routing"] for r in rows} == {"balanced", "hot"}
    assert len({row_key(r) for r in rows}) == 6
    with ResultStore(path) as store:
        again = H.run_sweep(shapes, store, FakeTimer(), mode="sample:3", seed=SEED, device="cpu", op="moe",
                            provenance=PROVENANCE, progress=False)
    assert again.measured == 0 and again.skipped == 6
    df = D.read_file(str(path))
    assert set(df["stage"]) == {"gate_up"} and df["tpe_max"].min() >= 2
