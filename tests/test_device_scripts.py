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
# The stand-in waits before its shard, as a real driver does (it writes after its first shape):
# written at once, the shard could share the pid file's mtime tick and not be "newer" than it.
(echo started >&2; sleep 0.5; printf '{{"b": 1}}\\n{{"b": 2}}\\n' > $run/new-shard00of02.jsonl; sleep 1) \\
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



def test_sweep_driver_marks_done_only_on_success_and_collects_its_shards(tmp_path):
    # The single-sweep drivers (device_fp8bs_gemv3.sh, ...) start their script through sweep_driver:
    # a committed shard is resumed into the run folder, $run names it inside the script, the shard
    # the script writes comes back in shards.tar, and only a script that succeeds leaves "done"
    # (a failed sweep is resumed by the next call). Both run at once: each watch waits 20 s.
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    raw = tmp_path / "raw"
    raw.mkdir()
    with gzip.open(raw / "old-shard00of01.jsonl.gz", "wt") as fh:
        fh.write('{"a": 1}\n')
    script = f"""
set -uo pipefail
. {HELPER}
sweep_driver {tmp_path}/ok {tmp_path}/out_ok 60 'sleep 1.1; echo "{{\\"b\\": 1}}" > $run/new-shard00of01.jsonl' \\
    {raw}/*.jsonl.gz >/dev/null &
sweep_driver {tmp_path}/bad {tmp_path}/out_bad 60 'sleep 1.1; echo partial > $run/bad-shard00of01.jsonl; exit 1' >/dev/null &
wait
"""
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    assert (ok / "done").exists() and not (bad / "done").exists()
    assert (ok / "old-shard00of01.jsonl").read_text() == '{"a": 1}\n'
    with tarfile.open(tmp_path / "out_ok" / "shards.tar") as tar:
        assert sorted(os.path.basename(n) for n in tar.getnames() if n.endswith(".gz")) == ["new-shard00of01.jsonl.gz"]
        got = tar.extractfile([m for m in tar.getmembers() if m.name.endswith(".gz")][0]).read()
    assert gzip.decompress(got).decode() == '{"b": 1}\n'
    with tarfile.open(tmp_path / "out_bad" / "shards.tar") as tar:
        assert any(n.endswith("bad-shard00of01.jsonl.gz") for n in tar.getnames())


def test_collect_tar_splits_a_tar_over_15_mib_into_parts_that_join_back(tmp_path):
    # A returned file over 16 MiB does not come back at all (four H200s' 17 training shards,
    # about 20 MB in one tar, were lost that way): collect_tar splits a tar over 15 MiB into
    # shards.tar.part-aa, -ab, ... whose concatenation is the tar; a small tar stays whole.
    if shutil.which("bash") is None or shutil.which("split") is None:
        pytest.skip("needs bash and split")
    big = os.urandom(20 * 1024 * 1024)  # random bytes: gzip cannot shrink them under the limit
    for name, payload in (("big", big), ("small", b"x" * 1000)):
        run, out = tmp_path / name / "run", tmp_path / name / "out"
        run.mkdir(parents=True)
        out.mkdir()
        (run / "s-shard00of01.jsonl").write_bytes(payload)
        script = f"""
set -uo pipefail
. {HELPER}
# A stand-in watch: the shard as it is, plus a logs file, as watch_and_collect leaves them.
watch_and_collect() {{ gzip -c "$1/s-shard00of01.jsonl" > "$2/s-shard00of01.jsonl.gz"; echo l > "$2/logs.tar.gz"; }}
collect_tar {run} {out} 0 1
"""
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        files = sorted(os.listdir(out))
        if name == "small":
            assert files == ["logs.tar.gz", "shards.tar"]
            continue
        assert files == ["logs.tar.gz", "shards.tar.part-aa", "shards.tar.part-ab"]
        assert all(os.path.getsize(out / f) <= 15 * 1024 * 1024 for f in files)
        joined = tmp_path / "joined.tar"
        joined.write_bytes(b"".join((out / f).read_bytes() for f in files[1:]))
        with tarfile.open(joined) as tar:
            got = tar.extractfile([m for m in tar.getmembers() if m.name.endswith(".gz")][0]).read()
        assert gzip.decompress(got) == big


# -- benchmarks/device_tree.sh: the work tree under the device tool's size limit -----------------

TREE = os.path.join(ROOT, "benchmarks", "device_tree.sh")


def _git_repo(tmp_path):
    if shutil.which("bash") is None or shutil.which("git") is None:
        pytest.skip("needs bash and git")
    repo = tmp_path / "repo"
    files = {"big.bin": 200_000, "models/gemm-sm90.onnx": 200_000, "models/report/plot.png": 150_000,
             "datasets/raw/moe-train-shard00of01.jsonl.gz": 300_000, "small.txt": 10, "dir/edge.bin": 100_000}
    for name, size in files.items():
        p = repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    (repo / "untracked.bin").write_bytes(os.urandom(5_000))
    return repo, {n: (repo / n).read_bytes() for n in files}


def _tree(repo, stash, *args):
    env = {**os.environ, "COSTMODEL_STASH_DIR": str(stash)}
    return subprocess.run(["bash", TREE, *args], cwd=repo, capture_output=True, text=True, timeout=60, env=env)


def test_device_tree_stash_keeps_models_and_patterns_and_restores_bytes(tmp_path):
    repo, content = _git_repo(tmp_path)
    stash = tmp_path / "stash"
    before = int(_tree(repo, stash, "size").stdout)
    assert before == sum(map(len, content.values())) + 5_000  # tracked + untracked, not ignored
    res = _tree(repo, stash, "stash", "datasets/raw/moe-")
    assert res.returncode == 0, res.stderr
    # Larger than 100,000 bytes and neither a shipped model nor kept: moved (100,000 exactly stays).
    moved = {"big.bin", "models/report/plot.png"}
    for name in content:
        assert (repo / name).exists() == (name not in moved), name
        assert (stash / name).exists() == (name in moved), name
    assert int(_tree(repo, stash, "size").stdout) == before - 350_000
    # A second stash would lose track of the first: refused.
    again = _tree(repo, stash, "stash")
    assert again.returncode == 1 and "restore first" in again.stderr
    res = _tree(repo, stash, "restore")
    assert res.returncode == 0 and "restored 2 of 2" in res.stdout, res.stderr
    assert {n: (repo / n).read_bytes() for n in content} == content
    assert _tree(repo, stash, "restore").returncode == 0  # nothing stashed: a no-op


def test_device_tree_restore_reports_a_missing_file(tmp_path):
    repo, _ = _git_repo(tmp_path)
    stash = tmp_path / "stash"
    assert _tree(repo, stash, "stash").returncode == 0
    (stash / "big.bin").unlink()
    res = _tree(repo, stash, "restore")
    assert res.returncode == 1 and "big.bin is not in the stash" in res.stderr
    assert (repo / "models/report/plot.png").exists()
    assert _tree(repo, stash, "bogus").returncode == 2


@pytest.mark.parametrize("script", ["device_picks.sh", "device_moe_redo2.sh", "device_fp8bs_gemv3.sh",
                                    "device_fp8bs_train2.sh", "device_gemv_more.sh",
                                    "device_gemv_m2.sh", "device_fp8bs_redo3.sh", "device_fp8bs_redo4.sh"])
def test_h100_drivers_measure_nothing_on_another_card(tmp_path, script):
    # Picks timed on H200s made the H100 models worse (benchmarks/results/picks/README.md), and a
    # call for H100s can be given H200s: the driver must stop before it starts any sweep (the MoE
    # decode rerun too: it is a second run of H100 problems).
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$1" = -L ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"; '
                   'else echo "NVIDIA H200"; fi\n')
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", script), str(out), "1"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert "h200, not h100" in res.stderr
    assert not out.exists()  # nothing started, nothing collected
