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
