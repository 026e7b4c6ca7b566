"""The device drivers' shared tail (benchmarks/device_watch.sh), run with a stand-in driver."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tarfile
import time

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



@pytest.mark.slow  # two 20 s watch intervals of wall time
def test_sweep_driver_marks_done_only_on_success_and_collects_its_shards(tmp_path):
    # A single-sweep driver starts its script through sweep_driver:
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


def test_require_card_stops_on_another_card(tmp_path):
    # Picks timed on H200s made the H100 models worse (benchmarks/results/picks/README.md), and a
    # call for H100s can be given H200s: an H100-only driver calls require_card h100 first and must
    # stop (exit 2) before it starts any sweep.
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$1" = -L ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"; '
                   'else echo "NVIDIA H200"; fi\n')
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    for want, rc in (("h100", 2), ("h200", 0), ("any", 0)):
        res = subprocess.run(["bash", "-c", f". {HELPER}; require_card {want}; echo measured"],
                             capture_output=True, text=True, timeout=30, env=env)
        assert res.returncode == rc, (want, res.stderr)
        assert ("measured" in res.stdout) == (rc == 0)
    assert "h200, not h100" in subprocess.run(
        ["bash", "-c", f". {HELPER}; require_card h100"], capture_output=True, text=True,
        timeout=30, env=env).stderr


# -- benchmarks/device_campaign.sh: the generic driver reads its sweeps from a campaign file -----

CAMPAIGN = os.path.join(ROOT, "benchmarks", "device_campaign.sh")


def test_device_campaign_runs_each_listed_sweep_and_resumes_failed_ones(tmp_path):
    # A fake python3 on PATH logs each `costmodel bench` call and fails the sweep named "bad": the
    # driver skips blank and comment lines, passes the rest of a line to bench as is, marks only
    # the sweeps that succeeded done, and a resumed driver runs only the ones not done.
    if shutil.which("bash") is None or shutil.which("setsid") is None:
        pytest.skip("needs bash and setsid")
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    py = fake / "python3"
    py.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *"--name bad "*) exit 1;; esac\n')
    py.chmod(0o755)
    name = f"test{os.getpid()}-{tmp_path.name}"
    campaign = tmp_path / f"{name}.txt"
    campaign.write_text("# a comment\n\nfirst --op moe --suite eval --dtype bf16 --mode all\n"
                        "bad --op gemm --shard 0/8\n  \nlast --op fp8_blockscale --mode sample:8\n"
                        "twin --op moe --shard 1/8\ntwin --op moe --shard 2/8\n")
    run = f"/tmp/campaign-{name}"  # the driver's run folder, named by the campaign file
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")

    def call_and_wait(phase):
        res = subprocess.run(["bash", CAMPAIGN, str(campaign), str(tmp_path / "out"), "0"],
                             capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        for _ in range(1200):  # the driver runs detached; its "done" marker ends the campaign
            if os.path.exists(f"{run}/done"):
                return
            time.sleep(0.05)
        logs = {f: open(os.path.join(run, f)).read()[-500:] for f in ("driver.out", "driver.err", "pid")
                if os.path.exists(os.path.join(run, f))}
        raise AssertionError(f"the campaign driver did not finish (call {phase}): {res.stdout[-500:]} "
                             f"{res.stderr[-500:]} {sorted(os.listdir(run)) if os.path.isdir(run) else ''} {logs}")

    try:
        call_and_wait(1)
        calls = log.read_text().splitlines()
        assert calls == [
            f"-m gemm_costmodel.cli bench --out {run} --name first --quiet --op moe --suite eval --dtype bf16 --mode all",
            f"-m gemm_costmodel.cli bench --out {run} --name bad --quiet --op gemm --shard 0/8",
            f"-m gemm_costmodel.cli bench --out {run} --name last --quiet --op fp8_blockscale --mode sample:8",
            # two shards of one sweep share a name: the second is not skipped as done
            f"-m gemm_costmodel.cli bench --out {run} --name twin --quiet --op moe --shard 1/8",
            f"-m gemm_costmodel.cli bench --out {run} --name twin --quiet --op moe --shard 2/8"]
        assert sorted(f.split(".")[0] for f in os.listdir(run) if f.endswith(".done")) == ["first", "last", "twin", "twin"]
        assert "FAILED bad" in open(f"{run}/driver.err").read()
        # a finished campaign starts nothing; with its marker gone, only the failed sweep reruns
        log.unlink()
        call_and_wait(2)
        assert not log.exists()
        os.remove(f"{run}/done")
        # The first driver may still be an unreaped zombie here: it must not count as alive.
        call_and_wait(3)
        assert [c.split("--name ")[1].split()[0] for c in log.read_text().splitlines()] == ["bad"]
    finally:
        shutil.rmtree(run, ignore_errors=True)
