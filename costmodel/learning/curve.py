"""Adaptation curves from rows a card already has (issue 58, deliverable 3).

An adaptation curve says how a card's held-out figures move with the device-minutes of that card's
rows a model trains with. Measured on the card, its points come from `costmodel adapt` rounds and
random sweeps cut by device time (docs/decisions/066-moe-h200-adaptation.md). Without device time
the curve can be simulated from the rows the card already has: a budget takes rows from the card's
committed training rows in the order a policy would have measured them, each charged the seconds
its sweep spent on it. This module holds the pieces that depend on no op and no data set; the
campaign scripts that run them live under benchmarks/explore/.

- ``family_groups``: a card's evaluation families in n groups of about equal problem counts (each
  group held out at once: ``evaluate.card_folds(groups=...)``).
- ``card_pool``: the card's rows a budget draws from: its training rows, never a row of one of its
  evaluation problems.
- ``outside``: the rows none of whose origins is in a group of families.
- ``row_seconds``: the device seconds of each row, from the rows' own timestamps.
- ``budget_count``: how many rows of an ordered selection a budget pays for.
- ``guided_round``: one model-guided round on measured rows (a spread of problems, the model's
  best ``top`` configs of each, plus the vendor), as ``costmodel adapt`` chooses them.
- ``space_misses``: how many of the configs a model wanted (its best over the op's whole feasible
  space) have a row in the pool: the simulation's distance from a real round.
- ``heldout``: one model trained on a row set and its held-out per-problem results.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from gemm_costmodel import registry
from gemm_costmodel.learning import evaluate as E
from gemm_costmodel.learning.model import CostModel, TrainConfig, shape_cols, shape_ids


def family_groups(df: pd.DataFrame, card: str, n: int) -> list[tuple[str, ...]]:
    """The card's evaluation families (the ``family`` of its evaluation rows) in ``n`` groups of
    about equal evaluation problem counts: families by count, largest first (ties by name), each
    to the group with the fewest problems so far (the first such group on a tie). Groups are
    returned sorted, each a sorted tuple; a group left empty (fewer families than n) is dropped."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ev = df[(df["gpu_name"].astype(str) == card) & df["eval_shape"].astype(bool)]
    if ev.empty:
        raise ValueError(f"no evaluation rows of card {card!r}")
    counts = ev.assign(pid=shape_ids(ev)).groupby(ev["family"].astype(str))["pid"].nunique()
    fams = sorted(counts.index, key=lambda f: (-int(counts[f]), f))
    load = [0] * n
    groups: list[list[str]] = [[] for _ in range(n)]
    for f in fams:
        j = min(range(n), key=lambda i: (load[i], i))
        groups[j].append(f)
        load[j] += int(counts[f])
    return sorted(tuple(sorted(g)) for g in groups if g)


def card_pool(df: pd.DataFrame, card: str) -> pd.DataFrame:
    """The card's rows a budget may draw from: its rows outside evaluation problems, less any row
    of a problem that is one of the card's evaluation problems (a problem measured by both kinds of
    sweep keeps its oracle out of training)."""
    on = df["gpu_name"].astype(str) == card
    is_eval = df["eval_shape"].astype(bool)
    cols = shape_cols(df)
    keys = pd.MultiIndex.from_frame(df[cols].astype(str))
    eval_keys = set(keys[(on & is_eval).to_numpy()])
    scored = np.array([k in eval_keys for k in keys]) if eval_keys else np.zeros(len(df), dtype=bool)
    return df[(on & ~is_eval).to_numpy() & ~scored]


def outside(df: pd.DataFrame, families: Iterable[str]) -> pd.DataFrame:
    """The rows none of whose origins is one of ``families`` (the training side of a fold that holds
    them out, as evaluate.card_folds cuts it)."""
    fams = set(map(str, families))
    return df[~df["origins"].map(E.families_of).map(lambda s: bool(s & fams)).to_numpy()]


def row_seconds(df: pd.DataFrame, keys: Sequence[str] = ("gpu_uuid", "suite"), gap_s: float = 5.0) -> pd.Series:
    """Device seconds of each row, from the rows' timestamps (what its sweep spent on it).

    The rows of one sweep on one card (``keys``) are one process's measurements, problem after
    problem. A problem's seconds run from the previous problem's last row to its own last row; a
    pause longer than ``gap_s`` before its first row (a precompile, a restart between shards or
    calls) is not the problem's and is left out. The first problem of a sweep has no previous one:
    it is charged the sweep's median seconds per row. A problem's seconds are shared evenly by its
    rows. Timestamps of a second's resolution make single problems coarse; sums over many are
    close (the campaign checks them against the per-shape logs where a sweep has them)."""
    ts = pd.to_datetime(df["timestamp"], utc=True)
    pid = pd.Series(shape_ids(df), index=df.index)
    out = pd.Series(np.nan, index=df.index, dtype=np.float64)
    for _, g in df.groupby(list(keys), observed=True, sort=False):
        t = ts.loc[g.index]
        p = pid.loc[g.index]
        span = pd.DataFrame({"first": t.groupby(p).min(), "last": t.groupby(p).max(), "rows": p.value_counts()})
        span = span.sort_values(["last", "first"], kind="stable")
        prev = span["last"].shift(1)
        secs = (span["last"] - prev).dt.total_seconds()
        pause = (span["first"] - prev).dt.total_seconds().clip(lower=0.0)
        secs = secs - pause.where(pause > gap_s, 0.0)
        per_row = secs / span["rows"]
        typical = float(np.nanmedian(per_row.to_numpy())) if per_row.notna().any() else 0.0
        per_row = per_row.fillna(typical)
        out.loc[g.index] = p.map(per_row).to_numpy()
    return out


def budget_count(seconds_in_order, budget_s: float) -> int:
    """How many leading rows of an ordered selection (their seconds, in order) fit ``budget_s``."""
    c = np.cumsum(np.asarray(seconds_in_order, dtype=np.float64))
    return int(np.searchsorted(c, budget_s + 1e-9, side="right"))


def guided_round(pool: pd.DataFrame, scores, seconds, taken, budget_s: float, seed: int, top: int,
                 vendor_ids: Sequence[str] = ()) -> tuple[np.ndarray, float, dict]:
    """One model-guided round on measured rows, as `costmodel adapt` chooses on the card.

    ``pool``: the rows that exist (one problem id per row in column ``pid``, and ``candidate``);
    ``scores``: the current model's score of each row (lower first); ``seconds``: each row's device
    seconds; ``taken``: rows already measured in earlier rounds (bool). Problems are visited in a
    seeded shuffle, those with no row taken yet first (adapt draws problems not picked before), and
    each gives its vendor rows and its ``top`` best-scored rows not taken yet (a problem visited
    before gives its next-best rows: a pool of few problems runs out of fresh ones); when every
    problem has been visited and budget is left, another pass takes each one's next-best rows. The
    round ends where its seconds pass ``budget_s`` (or the pool has no row left): the problem in flight keeps the rows that fit (vendor
    first, then by score), as a sweep cut by its time budget keeps the rows it measured.

    Returns (positions of the rows taken in this round, their seconds, facts: problems visited,
    of them new)."""
    pid = pool["pid"].to_numpy()
    cand = pool["candidate"].astype(str).to_numpy()
    scores = np.asarray(scores, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    taken = np.asarray(taken, dtype=bool)
    is_vendor = np.isin(cand, list(vendor_ids))
    order = np.lexsort((np.arange(len(pool)), scores, pid))  # by problem, then score, then position
    starts = np.flatnonzero(np.r_[True, pid[order][1:] != pid[order][:-1]])
    bounds = dict(zip(pid[order][starts], zip(starts, np.r_[starts[1:], len(order)])))
    seen = pd.Series(taken).groupby(pid).any()
    problems = np.array(sorted(bounds))
    rank = np.random.default_rng(seed).permutation(len(problems))
    visit = problems[np.lexsort((rank, seen.reindex(problems).to_numpy(dtype=bool)))]
    taken = taken.copy()
    picked, spent, visited, n_new = [], 0.0, set(), 0
    cut = False
    while not cut:
        took = False
        for p in visit:
            lo, hi = bounds[p]
            rows = order[lo:hi]
            free = rows[~taken[rows]]
            new = np.r_[free[is_vendor[free]], free[~is_vendor[free]][:top]].astype(int)
            if not len(new):
                continue
            cost = float(seconds[new].sum())
            cut = spent + cost > budget_s + 1e-9
            if cut:  # the budget ends inside this problem: the rows measured until then are kept
                new = new[:budget_count(seconds[new], budget_s - spent)]
                cost = float(seconds[new].sum())
            if len(new):
                picked.append(new)
                taken[new] = True
                spent += cost
                took = True
                if p not in visited:
                    visited.add(p)
                    n_new += int(not seen.get(p, False))
            if cut:
                break
        if not took:  # every row of the pool taken
            break
    rows = np.concatenate(picked) if picked else np.zeros(0, dtype=int)
    return rows, spent, {"problems": len(visited), "new_problems": n_new}


def space_misses(model, pool: pd.DataFrame, pids, top: int, op: str, arch: str = "sm90") -> tuple[int, int]:
    """(wanted, missing): over the problems ``pids`` of the pool, the ``top`` configs the model ranks
    best among every feasible config of the op's space (no vendor), and how many of them have no
    row in the pool. A real round measures the wanted ones; the simulation can only take rows that
    exist (``guided_round`` takes the model's best of those)."""
    spec = registry.get(op)
    space = spec.space_module()
    vendor = set(spec.vendor_ids)
    wanted = missing = 0
    by_pid = pool.groupby("pid", sort=False)
    frames, have = [], []
    for p in pids:
        g = by_pid.get_group(p)
        tmpl = g.iloc[0]
        problem = spec.problem_of(tmpl)
        cfgs = [c for c in spec.feasible_configs(problem, arch, include_vendor=False) if c.id not in vendor]
        if not cfgs:
            continue
        rows = pd.DataFrame([{"candidate": c.id, "variant": c.variant, **space.config_params(c)} for c in cfgs])
        for col in pool.columns:
            if col not in rows.columns:
                rows[col] = tmpl[col]
        frames.append(rows.assign(pid=p))
        have.append(set(g["candidate"].astype(str)))
    if not frames:
        return 0, 0
    allc = pd.concat(frames, ignore_index=True)
    for col in pool.columns:
        if isinstance(pool[col].dtype, pd.CategoricalDtype):
            allc[col] = allc[col].astype(str)
    allc["score"] = model.score_frame(allc)
    for (p, g), h in zip(allc.groupby("pid", sort=False), have):
        best = g.sort_values(["score", "candidate"], kind="stable")["candidate"].head(top)
        wanted += len(best)
        missing += int(sum(c not in h for c in best))
    return wanted, missing


def heldout(train: pd.DataFrame, test: pd.DataFrame, config: TrainConfig) -> tuple[CostModel, pd.DataFrame]:
    """A model trained on ``train`` and its per-problem held-out results on ``test`` (evaluation
    rows: evaluate.eval_rows), ranked as the held-out evaluation ranks (evaluate.model_scores)."""
    model = CostModel(config).fit(train)
    _, ranked = E.model_scores(model, test)
    return model, E.per_shape(test, ranked)
