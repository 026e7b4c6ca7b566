"""Learn a new GPU in minutes: model-guided measurement rounds on the card, then a retrain.

A card the data does not cover gets the shipped model's picks (its hardware features carry the
card), which are close but not right: on the H200 the MoE model that had never seen one was 1.028x
off the oracle on held-out families (issue 58). Measuring the whole training space again costs
device-hours. ``adapt`` spends a device-minute budget where a measurement is worth most: on a
seeded spread of the op's training problems (every M range, stage and routing the suite holds),
the configs the current model ranks best for this card, which are the near-ties the ranker must
order on this card, plus the vendor as the run's anchor. Each round measures them through the
harness (``costmodel bench --mode pick:CSV``: resumable, correctness-gated, provenance on every
row), turns the shard into dataset rows, retrains on the shipped data plus every row of this card
so far, and ranks the next round's picks with the new model. Rounds repeat until the budget is
spent. Evidence: docs/decisions/ (H200 adaptation) and benchmarks/results/moe/h200/.

Everything lands under one folder (``out``): ``raw/`` (the harness shards), ``datasets/`` (their
parquet, to copy under datasets/ when a card should join the shipped data), ``models/`` (ONNX and
manifest, servable with ``Dispatcher(models_dir=out/models)``), ``picks-rN.csv`` and
``adapt.json`` (rounds done, rows, device seconds). Running the same command again resumes.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from gemm_costmodel import registry

Log = Callable[[str], None]


@dataclass
class AdaptConfig:
    op: str
    gpu_name: str
    out: str
    dtypes: tuple[str, ...] = ()
    minutes: float = 10.0
    problems_per_round: int = 400
    top: int = 8
    seed: int = 0
    data_root: str = "datasets"
    models: str | None = None  # the starting model folder (default: the shipped models)
    max_rounds: int = 100
    jobs: int = 2
    train_overrides: dict = field(default_factory=dict)  # TrainConfig fields over the op's train_defaults

    def __post_init__(self):
        spec = registry.get(self.op)
        self.dtypes = tuple(self.dtypes) or tuple(spec.dtypes)
        bad = [d for d in self.dtypes if d not in spec.dtypes]
        if bad:
            raise ValueError(f"dtype {bad[0]!r} is not one of op {self.op}'s dtypes ({', '.join(spec.dtypes)})")
        if not self.gpu_name:
            raise ValueError("gpu_name: the card to adapt to is required")
        if not self.minutes > 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if self.problems_per_round < 1 or self.top < 1:
            raise ValueError("problems_per_round and top must be >= 1")


@dataclass
class AdaptState:
    rounds: list[dict] = field(default_factory=list)
    picked: list[str] = field(default_factory=list)  # problem keys picked so far (any round)

    @property
    def device_s(self) -> float:
        return sum(r.get("device_s", 0.0) for r in self.rounds)

    @classmethod
    def load(cls, path: str) -> "AdaptState":
        if not os.path.exists(path):
            return cls()
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        return cls(rounds=raw.get("rounds", []), picked=raw.get("picked", []))

    def save(self, path: str, cfg: AdaptConfig) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"config": asdict(cfg), "rounds": self.rounds, "picked": self.picked,
                       "device_s": round(self.device_s, 1)}, fh, indent=1)
        os.replace(tmp, path)


def gpu_slug(gpu_name: str) -> str:
    """A file-name part for a GPU ("NVIDIA H200" -> "nvidia-h200")."""
    return "".join(c if c.isalnum() else "-" for c in gpu_name.lower()).strip("-") or "gpu"


def training_problems(spec: registry.OpSpec, dtype: str) -> list:
    """The op's training-suite problems of a dtype (every training suite it has), one per problem key,
    in key order: the pool each round draws its spread from. Evaluation problems never enter it."""
    names = [s for s in ("train", "train_skewed") if s in spec.suites]
    seen, out = set(), []
    for name in names:
        for s in spec.suite(name, dtype):
            key = problem_key(spec, s)
            if key not in seen:
                seen.add(key)
                out.append((name, s))
    return sorted(out, key=lambda t: problem_key(spec, t[1]))


def problem_key(spec: registry.OpSpec, shape) -> str:
    return spec.problem_of({f: getattr(shape, f) for f in spec.problem_fields}).key


def choose(dispatcher, spec: registry.OpSpec, dtype: str, pool: list, picked: set[str], n: int, top: int,
           seed: int) -> list[tuple[str, str, str]]:
    """(suite, problem key, candidate) picks of one round: ``n`` problems of the pool not picked
    before, drawn by a seeded shuffle (so every M range, stage and routing of the suite appears in
    proportion), and per problem the ``top`` configs the current model ranks best for this card
    (the vendor is measured by every sweep anyway)."""
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    vendor = set(spec.vendor_ids)
    out, taken = [], 0
    for i in order:
        suite, s = pool[i]
        key = problem_key(spec, s)
        if key in picked:
            continue
        # The op's own problem fields (beyond m, n, k, dtype) as the dispatcher's keywords.
        own = {f: getattr(s, f) for f in spec.problem_fields if f not in registry.SHARED_PROBLEM}
        ranked = dispatcher.rank(s.m, s.n, s.k, dtype, count=top + len(vendor), **own)
        cands = [c.candidate for c in ranked if c.candidate not in vendor][:top]
        if not cands:
            continue
        out += [(suite, key, c) for c in cands]
        picked.add(key)
        taken += 1
        if taken == n:
            break
    return out


def write_picks(path: str, picks: list[tuple[str, str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["key", "candidate"])
        w.writerows((key, cand) for _, key, cand in picks)


def bench_measure(op: str, suite: str, dtype: str, picks_csv: str, out_dir: str, name: str,
                  budget_s: float, log: Log) -> str:
    """Measure a picks CSV on this machine's GPU through ``costmodel bench`` (a child process, so a
    crash in one kernel cannot take the adaptation down); returns the shard it wrote."""
    cmd = [sys.executable, "-m", "gemm_costmodel.cli", "bench", "--op", op, "--suite", suite, "--dtype", dtype,
           "--mode", f"pick:{picks_csv}", "--out", out_dir, "--name", name, "--time-budget", str(max(budget_s, 1.0))]
    log("measure: " + " ".join(cmd[3:]))
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"costmodel bench exited with {proc.returncode} (command: {' '.join(cmd[3:])})")
    return os.path.join(out_dir, f"{name}-shard00of01.jsonl")


def round_name(op: str, r: int, suite: str, dtype: str, slug: str) -> str:
    """The shard (and rows' suite) name of a round's measurements of one suite and dtype. The
    leave-one-card-out evaluation tells adaptation rows by it (learning.evaluate.ADAPT_SUITE)."""
    return f"{op}-adapt{r}-{suite.replace('_', '')}-{dtype}-{slug}"


def write_round(cfg: AdaptConfig, r: int, dtype: str, picks: list[tuple[str, str, str]], slug: str) -> list[tuple]:
    """A round's picks of one dtype as one ``picks-r<R>-<dtype>-<suite>.csv`` per training suite in
    ``cfg.out``; returns (suite, csv path, shard name, the suite's picks) per file."""
    by_suite: dict[str, list] = {}
    for p in picks:
        by_suite.setdefault(p[0], []).append(p)
    out = []
    for suite, sp in by_suite.items():
        path = os.path.join(cfg.out, f"picks-r{r}-{dtype}-{suite}.csv")
        write_picks(path, sp)
        out.append((suite, path, round_name(cfg.op, r, suite, dtype, slug), sp))
    return out


def base_parquet(spec: registry.OpSpec, root: str, dtypes) -> list[str]:
    out = []
    for d in dtypes:
        out += sorted(glob.glob(os.path.join(root, spec.name, d, "*.parquet")))
    return out


def adapt(cfg: AdaptConfig, measure: Callable[..., str] = bench_measure, log: Log | None = None) -> AdaptState:
    """Run measurement rounds until ``cfg.minutes`` of measuring are spent; returns the state.

    ``measure(op, suite, dtype, picks_csv, out_dir, name, budget_s, log) -> shard path`` does the
    measuring (on the GPU by default; tests pass a fake). Device time is the wall time of the
    measure calls, precompilation included: what the card was busy for."""
    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.learning import pipeline
    from gemm_costmodel.learning.model import TrainConfig
    from gemm_costmodel.serving.runtime import Dispatcher

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    spec = registry.get(cfg.op)
    raw_dir, data_dir, model_dir = (os.path.join(cfg.out, p) for p in ("raw", "datasets", "models"))
    for p in (raw_dir, data_dir, model_dir):
        os.makedirs(p, exist_ok=True)
    state_path = os.path.join(cfg.out, "adapt.json")
    state = AdaptState.load(state_path)
    picked = set(state.picked)
    base = base_parquet(spec, cfg.data_root, cfg.dtypes)
    if not base:
        raise ValueError(f"no {cfg.op} parquet under {cfg.data_root}/{cfg.op}/ for dtypes {', '.join(cfg.dtypes)}")
    models = model_dir if state.rounds else cfg.models
    slug = gpu_slug(cfg.gpu_name)
    budget_s = cfg.minutes * 60.0
    t_start = time.time()
    while state.device_s < budget_s and len(state.rounds) < cfg.max_rounds:
        r = len(state.rounds)
        disp = Dispatcher(gpu_name=cfg.gpu_name, models_dir=models, op=cfg.op)
        round_info = {"round": r, "shards": [], "rows": 0, "device_s": 0.0}
        per_dtype = max(1, cfg.problems_per_round // len(cfg.dtypes))
        for dtype in cfg.dtypes:
            remaining = budget_s - state.device_s - round_info["device_s"]
            if remaining <= 0:
                break
            picks = choose(disp, spec, dtype, training_problems(spec, dtype), picked, per_dtype, cfg.top,
                           cfg.seed + r)
            if not picks:
                log(f"round {r} {dtype}: every training problem picked already")
                continue
            for suite, csv_path, name, sp in write_round(cfg, r, dtype, picks, slug):
                log(f"round {r} {dtype} {suite}: {len({k for _, k, _ in sp})} problems, {len(sp)} configs, "
                    f"{remaining / 60:.1f} device-minutes left")
                t0 = time.time()
                shard = measure(cfg.op, suite, dtype, csv_path, raw_dir, name, remaining, log)
                dt = time.time() - t0
                round_info["device_s"] += dt
                remaining -= dt
                round_info["shards"].append(os.path.relpath(shard, cfg.out))
        for shard in round_info["shards"]:
            full = os.path.join(cfg.out, shard)
            if os.path.exists(full):
                with open(full, encoding="utf-8") as fh:
                    round_info["rows"] += sum(1 for _ in fh)
        state.rounds.append(round_info)
        state.picked = sorted(picked)
        # Train on the shipped rows and every row of this card so far.
        shards = sorted(glob.glob(os.path.join(raw_dir, "*-shard*.jsonl")))
        new = D.build_parquet(shards, data_dir, log=lambda m: None) if shards else []
        df = pipeline.load_training_frame(paths=base + list(new), op=cfg.op, dtypes=cfg.dtypes, log=log)
        tc = TrainConfig(**{**spec.train_defaults, "n_jobs": cfg.jobs, **cfg.train_overrides})
        log(f"round {r}: {round_info['rows']} new rows in {round_info['device_s']:.0f} s; retrain on {len(df)} rows")
        model = pipeline.train(df, tc, log=lambda m: None)
        pipeline.export_model(model, df, model_dir, log=log)
        models = model_dir
        state.save(state_path, cfg)
        log(f"round {r} done: {state.device_s / 60:.1f} of {cfg.minutes:g} device-minutes, "
            f"{time.time() - t_start:.0f} s wall")
    return state


def plan_round(cfg: AdaptConfig, log: Log | None = None) -> list[dict]:
    """The next round's picks without measuring (no GPU needed): what ``adapt`` would measure next
    for ``cfg.gpu_name`` with the current model (``cfg.models``, default the shipped one), skipping
    every problem a picks CSV already in ``cfg.out`` lists (copy a finished round's CSVs there).
    Writes ``picks-r<R>-<dtype>-<suite>.csv`` into ``cfg.out`` and returns, per CSV, the
    ``costmodel bench`` arguments that measure it under the round's shard name, so a GPU campaign
    can measure a round planned and retrained on another machine."""
    from gemm_costmodel.serving.runtime import Dispatcher

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    spec = registry.get(cfg.op)
    os.makedirs(cfg.out, exist_ok=True)
    done = sorted(glob.glob(os.path.join(cfg.out, "picks-r*-*.csv")))
    picked: set[str] = set()
    rounds = [-1]
    for path in done:
        rounds.append(int(os.path.basename(path)[len("picks-r"):].split("-", 1)[0]))
        with open(path, newline="", encoding="utf-8") as fh:
            picked |= {row["key"] for row in csv.DictReader(fh)}
    r = max(rounds) + 1
    disp = Dispatcher(gpu_name=cfg.gpu_name, models_dir=cfg.models, op=cfg.op)
    slug = gpu_slug(cfg.gpu_name)
    per_dtype = max(1, cfg.problems_per_round // len(cfg.dtypes))
    out = []
    for dtype in cfg.dtypes:
        picks = choose(disp, spec, dtype, training_problems(spec, dtype), picked, per_dtype, cfg.top, cfg.seed + r)
        for suite, path, name, sp in write_round(cfg, r, dtype, picks, slug):
            args = ["--op", cfg.op, "--suite", suite, "--dtype", dtype, "--mode", f"pick:{path}", "--name", name]
            log(f"round {r} {dtype} {suite}: {len({k for _, k, _ in sp})} problems, {len(sp)} configs -> {path}")
            out.append({"round": r, "dtype": dtype, "suite": suite, "csv": path, "name": name, "bench_args": args})
    return out


def heldout_on_card(op: str, gpu_name: str, paths: list[str], jobs: int = 2, log: Log | None = None):
    """Leave-one-family-out figures on one card's evaluation problems (if the data holds its oracle):
    the card's evaluation rows never train, so the figures say how the adapted model does on
    families and shapes it has not seen on that card. Returns summarize() per dtype, or {}."""
    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.learning import evaluate as E
    from gemm_costmodel.learning.model import CostModel, TrainConfig

    spec = registry.get(op)
    df = D.load_dataset(paths)
    df = df[df["op"] == op]
    on_card = (df["gpu_name"].astype(str) == gpu_name) & df["eval_shape"].astype(bool)
    if not on_card.any():
        return {}
    df = df.assign(**{c: df[c].astype(str) for c in ("dtype", "gpu_name", "variant", "family", *registry.str_columns())
                      if c in df.columns})
    frames = []
    for fold in E.family_folds(df):
        test = fold.test[fold.test["gpu_name"] == gpu_name]
        if test.empty:
            continue
        train = fold.train[~((fold.train["gpu_name"] == gpu_name) & fold.train["eval_shape"].astype(bool))]
        model = CostModel(TrainConfig(**{**spec.train_defaults, "n_jobs": jobs})).fit(train)
        test = E.eval_rows(test)
        frames.append(E.per_shape(test, model.score_frame(test)))
        if log:
            log(f"held out {fold.name}: {test['sid'].nunique()} shapes")
    import pandas as pd

    ps = pd.concat(frames, ignore_index=True)
    return {d: E.summarize(g) for d, g in ps.groupby("dtype")}
