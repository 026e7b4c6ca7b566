"""The device drivers' shared tail (benchmarks/device_watch.sh), run with a stand-in driver."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPER = os.path.join(ROOT, "benchmarks", "device_watch.sh")


def _run(tmp_path, only_new: str, wait_s: int = 30):
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    out.mkdir()
    (run / "old-shard00of01.jsonl").write_text('{"a": 1}\n')
    (run / "x.shapes.log").write_text("{}\n")
    script = f"""
set -uo pipefail
. {HELPER}
run={run}; out={out}
sleep 1.1  # the stand-in driver starts after the old shard was written
(echo started >&2; printf '{{"b": 1}}\\n{{"b": 2}}\\n' > $run/new-shard00of02.jsonl; sleep 1) \\
    >$run/driver.out 2>$run/driver.err &
echo $! > $run/pid
watch_and_collect "$run" "$out" {wait_s} "{only_new}" 0.2
"""
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res, out


def test_collects_every_shard_and_the_logs(tmp_path):
    res, out = _run(tmp_path, "")
    assert sorted(os.listdir(out)) == ["logs.tar.gz", "new-shard00of02.jsonl.gz", "old-shard00of01.jsonl.gz"]
    assert gzip.open(out / "new-shard00of02.jsonl.gz", "rt").read() == '{"b": 1}\n{"b": 2}\n'
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["driver.err", "driver.out", "x.shapes.log"]
    # the watch line names each shard's rows; the driver's stderr ends the output
    assert "new-shard00of02=2" in res.stdout and res.stdout.rstrip().endswith("started")


def test_new_only_skips_shards_older_than_the_driver(tmp_path):
    _, out = _run(tmp_path, "new")
    assert sorted(os.listdir(out)) == ["logs.tar.gz", "new-shard00of02.jsonl.gz"]


def test_resume_and_driver_needed(tmp_path):
    # resume_shards unzips committed shards the run folder lacks and keeps the ones it has;
    # driver_needed is false while the driver lives or once its done marker exists.
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    run, raw = tmp_path / "run", tmp_path / "raw"
    run.mkdir()
    raw.mkdir()
    with gzip.open(raw / "a-shard00of02.jsonl.gz", "wt") as fh:
        fh.write('{"a": 1}\n')
    with gzip.open(raw / "b-shard01of02.jsonl.gz", "wt") as fh:
        fh.write('{"b": 1}\n')
    (run / "b-shard01of02.jsonl").write_text('{"b": 1}\n{"b": 2}\n')  # resumed here already: kept
    script = f"""
. {HELPER}
run={run}
resume_shards "$run" {raw}/*.jsonl.gz {raw}/missing-*.jsonl.gz
driver_needed "$run" "$run/done" && echo needed-no-pid
sleep 5 & echo $! > $run/pid
driver_needed "$run" "$run/done" || echo not-needed-alive
kill %1; wait 2>/dev/null
driver_needed "$run" "$run/done" && echo needed-dead
touch $run/done
driver_needed "$run" "$run/done" || echo not-needed-done
"""
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["needed-no-pid", "not-needed-alive", "needed-dead", "not-needed-done"]
    assert (run / "a-shard00of02.jsonl").read_text() == '{"a": 1}\n'
    assert (run / "b-shard01of02.jsonl").read_text() == '{"b": 1}\n{"b": 2}\n'
    assert sorted(os.listdir(run)) == ["a-shard00of02.jsonl", "b-shard01of02.jsonl", "done", "pid"]
