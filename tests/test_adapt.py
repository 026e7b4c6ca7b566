"""`costmodel adapt` (issue 58): rounds of model-guided picks, measured, turned into rows, retrained.

No GPU here: the measuring is a fake that answers from committed H100 rows of the same problem and
config, relabelled as another card and 20% faster, so the loop's bookkeeping (budget, resume,
rows, the exported model) is checked against known answers.
"""
from __future__ import annotations

import csv
import json
import os
import shutil

import pandas as pd
import pytest

from gemm_costmodel import adapt as A
from gemm_costmodel import registry

SHARD = "datasets/moe/bf16/moe-train-h100-shard00of08.parquet"
CARD = "NVIDIA H200"
FEW_TREES = {"n_estimators": 8}  # the loop's bookkeeping is under test, not the fit


@pytest.fixture(scope="module")
def h100_rows():
    df = pd.read_parquet(SHARD)
    spec = registry.get("moe")
    df["key"] = [spec.problem_of(r).key for r in df[list(spec.problem_fields)].to_dict("records")]
    return df


@pytest.fixture()
def small_root(tmp_path, h100_rows):
    """A data root holding 60 training problems of the H100 shard (the shipped rows the retrain keeps)."""
    keys = sorted(h100_rows["key"].unique())[:60]
    root = tmp_path / "datasets"
    (root / "moe" / "bf16").mkdir(parents=True)
    h100_rows[h100_rows["key"].isin(keys)].drop(columns="key").to_parquet(root / "moe" / "bf16" / "small.parquet")
    return str(root)


def fake_measure(h100_rows, seconds_per_call=30.0, calls=None):
    """A measure() that writes, for every pick with an H100 row, that row as the card's, 0.8x the time."""
    by = h100_rows.set_index(["key", "candidate"], drop=False)

    def measure(op, suite, dtype, picks_csv, out_dir, name, budget_s, log):
        with open(picks_csv, newline="") as fh:
            picks = [(r["key"], r["candidate"]) for r in csv.DictReader(fh)]
        path = os.path.join(out_dir, f"{name}-shard00of01.jsonl")
        with open(path, "w") as out:
            for key, cand in picks:
                if (key, cand) not in by.index:
                    continue
                row = by.loc[[(key, cand)]].iloc[0].to_dict()
                row.update(key=None, gpu_name=CARD, suite=name)
                row.pop("key")
                for c in ("p20_us", "p50_us", "p80_us"):
                    row[c] = float(row[c]) * 0.8
                out.write(json.dumps({k: (v.isoformat() if hasattr(v, "isoformat") else v)
                                      for k, v in row.items()}, default=str) + "\n")
        if calls is not None:
            calls.append((suite, dtype, len(picks), budget_s))
        # The loop reads the wall time of this call as device time: pretend it took a while.
        measure.clock += seconds_per_call
        return path

    measure.clock = 0.0
    return measure


@pytest.fixture()
def fast_clock(monkeypatch):
    """time.time() advanced by the fake measure's pretend seconds."""
    import time as _time

    state = {"extra": 0.0}
    real = _time.time
    monkeypatch.setattr(A.time, "time", lambda: real() + state["extra"])
    return state


def test_adapt_rounds_until_budget_then_resumes(tmp_path, small_root, h100_rows, monkeypatch, fast_clock):
    keys = set(pd.read_parquet(os.path.join(small_root, "moe", "bf16", "small.parquet")).pipe(
        lambda d: [registry.get("moe").problem_of(r).key for r in d[list(registry.get("moe").problem_fields)]
                   .to_dict("records")]))
    pool_all = A.training_problems(registry.get("moe"), "bf16")
    pool = [t for t in pool_all if A.problem_key(registry.get("moe"), t[1]) in keys]
    assert len(pool) >= 20
    monkeypatch.setattr(A, "training_problems", lambda spec, dtype: pool)
    calls = []
    inner = fake_measure(h100_rows, calls=calls)

    def measure(*a):
        out = inner(*a)
        fast_clock["extra"] += 30.0  # each call "takes" 30 s of device time
        return out

    out = str(tmp_path / "adapt")
    cfg = A.AdaptConfig(op="moe", gpu_name=CARD, out=out, dtypes=("bf16",), minutes=1.0,
                        problems_per_round=8, top=4, data_root=small_root,
                        train_overrides=FEW_TREES)
    state = A.adapt(cfg, measure=measure, log=lambda m: None)
    # 1 minute at 30 s a call: two rounds, each of one sweep per training suite in its picks.
    assert state.device_s >= 60.0
    assert len(state.rounds) == 2
    assert len(state.picked) == 16  # 8 problems a round, never the same one twice
    assert all(c[2] <= 8 * 4 for c in calls)
    # The budget each call gets shrinks with what was spent.
    assert calls[0][3] == pytest.approx(60.0) and calls[-1][3] < 60.0
    manifest = json.load(open(os.path.join(out, "models", "moe-sm90.json")))
    assert CARD in manifest["training_gpus"]
    rows = sum(r["rows"] for r in state.rounds)
    assert rows > 0
    assert glob_count(os.path.join(out, "datasets", "moe", "bf16", "*.parquet")) >= 1
    # Resume: the same command with a larger budget continues from round 2 and keeps the picks.
    cfg2 = A.AdaptConfig(op="moe", gpu_name=CARD, out=out, dtypes=("bf16",), minutes=1.5,
                         problems_per_round=8, top=4, data_root=small_root,
                        train_overrides=FEW_TREES)
    state2 = A.adapt(cfg2, measure=measure, log=lambda m: None)
    assert len(state2.rounds) == 3
    assert len(set(state2.picked)) == 24
    # The adapted model serves the card.
    from gemm_costmodel.serving.runtime import Dispatcher

    d = Dispatcher(gpu_name=CARD, models_dir=os.path.join(out, "models"), op="moe")
    s = pool[0][1]
    choice = d.select(s.m, s.n, s.k, "bf16", e=s.e, top_k=s.top_k, stage=s.stage, routing=s.routing)
    assert choice.source == "model"


def glob_count(pattern):
    import glob

    return len(glob.glob(pattern))


def test_adapt_config_rejects_bad_fields(tmp_path):
    with pytest.raises(ValueError, match="dtype 'fp16'"):
        A.AdaptConfig(op="moe", gpu_name=CARD, out=str(tmp_path), dtypes=("fp16",))
    with pytest.raises(ValueError, match="minutes"):
        A.AdaptConfig(op="moe", gpu_name=CARD, out=str(tmp_path), minutes=0)
    with pytest.raises(ValueError, match="unknown op"):
        A.AdaptConfig(op="nope", gpu_name=CARD, out=str(tmp_path))


def test_choose_spreads_and_skips_picked():
    from gemm_costmodel.serving.runtime import Dispatcher

    spec = registry.get("moe")
    pool = A.training_problems(spec, "bf16")
    keys = [A.problem_key(spec, s) for _, s in pool]
    assert len(keys) == len(set(keys))  # one entry per problem
    d = Dispatcher(gpu_name=CARD, op="moe")
    picked = set()
    first = A.choose(d, spec, "bf16", pool, picked, n=10, top=3, seed=0)
    assert len({k for _, k, _ in first}) == 10 and len(first) == 30
    assert not any(c in spec.vendor_ids for _, _, c in first)
    second = A.choose(d, spec, "bf16", pool, picked, n=10, top=3, seed=0)
    assert not ({k for _, k, _ in first} & {k for _, k, _ in second})
    ms = sorted({int(k.split(":")[1].split("x")[0]) for _, k, _ in first + second})
    assert len(ms) > 3  # a spread over M, not one corner


def test_cli_adapt_needs_a_gpu(tmp_path, capsys):
    from gemm_costmodel import cli

    rc = cli.main(["adapt", "--op", "moe", "--out", str(tmp_path / "a")])
    assert rc != 0
    assert "CUDA" in capsys.readouterr().err


def test_cli_adapt_plan_writes_the_next_round_without_a_gpu(tmp_path, capsys):
    """--plan: round 0's picks, then round 1 skipping every problem round 0 listed; the printed bench
    lines measure each CSV under the round's shard name (the name the card-adaptation schemes read)."""
    from gemm_costmodel import cli

    out = tmp_path / "plan"
    base = ["adapt", "--op", "gemm", "--dtype", "fp8", "--out", str(out), "--problems", "12", "--top", "2"]
    assert cli.main(base + ["--plan"]) != 0 and "--gpu" in capsys.readouterr().err
    assert cli.main(base + ["--plan", "--gpu", CARD]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    r0 = out / "picks-r0-fp8-train.csv"
    assert lines == [f"costmodel bench --op gemm --suite train --dtype fp8 --mode pick:{r0} "
                     "--name gemm-adapt0-train-fp8-nvidia-h200"]
    rows0 = list(csv.DictReader(open(r0)))
    keys0 = {r["key"] for r in rows0}
    assert len(keys0) == 12 and len(rows0) == 24 and not any(r["candidate"] == "cublas" for r in rows0)
    assert cli.main(base + ["--plan", "--gpu", CARD]) == 0
    assert "gemm-adapt1-train-fp8-nvidia-h200" in capsys.readouterr().out
    keys1 = {r["key"] for r in csv.DictReader(open(out / "picks-r1-fp8-train.csv"))}
    assert len(keys1) == 12 and not keys0 & keys1
