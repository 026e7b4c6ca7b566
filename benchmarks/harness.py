"""Sweep runner: every (shape, candidate) of a shard, gated, timed, stored.

- Long format: one row per (shape, candidate), failures included with a status.
- Resumable: rows already in the shard file are skipped; see store.py.
- Shardable: ``--shard i/n`` takes the shapes whose stable hash is i mod n, so
  all candidates of a shape are measured in the same process, on one card.
- Candidate selection per shape: ``all`` (evaluation shapes, exact oracle) or
  a seeded random sample of Triton candidates plus the vendor library.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from gemm_costmodel import registry

from ..kernels.gemm.space import VARIANTS, GemmConfig, Problem, VendorConfig, config_params
from . import correctness as C
from .provenance import now
from .store import MAX_DEATHS, ResultStore
# The sweep frees device memory as serving's unsure mode does: one definition, with the timer.
from ..kernels.timing import FREE_SLACK_BYTES, free_device_memory  # noqa: F401

L2_POLICY = "rotate"


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 0 <= i < n."""
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must look like i/n, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {text!r}: need 0 <= i < n")
    return i, n


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def in_shard(shape, shard: tuple[int, int]) -> bool:
    """Whether a shape belongs to shard (i, n); by (M, N, K, dtype), never by row."""
    i, n = shard
    return stable_hash(shape.key) % n == i


# The variants of the space when the training shards were first sampled.
SAMPLE_BASE_VARIANTS = ("tiled", "splitk", "persistent")


def select_candidates(problem: Problem, mode: str, seed: int, arch: str = "sm90", *, op: str
                      ) -> list[GemmConfig]:
    """Candidates to measure for a problem: 'all', 'sample:K' (K Triton configs + vendor),
    'variant:A[,B...]' (every feasible config of those variants, the op's pending ones included,
    + vendor) or 'pick:CSV' (the feasible configs a CSV lists for the problem's key + vendor;
    ``picked_candidates``).

    'sample:K' draws K configs of SAMPLE_BASE_VARIANTS and, from each later variant,
    the same fraction of its feasible configs."""
    if mode.startswith("pick:") and problem.key not in picked_candidates(mode.split(":", 1)[1]):
        # Most of a suite's problems are not in a pick list (an adaptation round lists 400 of the
        # dense op's 11,270): skip them before the feasibility work, which on the GPU host cost
        # about 1,000 s of one 3,600-row round that measured for 45 s.
        return []
    feas = registry.get(op).feasible_configs(problem, arch)
    if mode == "all":
        return feas
    if mode.startswith("variant:"):
        # Adds a new kernel variant's rows to shapes measured before it existed; the
        # vendor row, measured again in the same run, anchors them to the earlier run.
        space = registry.get(op).space_module()
        known = set(getattr(space, "VARIANTS", VARIANTS))
        names = set(mode.split(":", 1)[1].split(","))
        unknown = names - known
        if unknown or not names:
            raise ValueError(f"candidate mode {mode!r}: unknown variant(s) {sorted(unknown)}; known: {sorted(known)}")
        # The op's pending grids (its space module's pending_configs: defined, out of the served
        # space until a card has measured them) are measured by naming their variant, under the
        # same feasibility rules; training skips their rows until they join (dataset.out_of_space).
        pending = [c for c in getattr(space, "pending_configs", lambda a, d: [])(arch, problem.dtype)
                   if c.variant in names and space.check_feasible(c, problem, arch)[0]]
        # Where none of the variants runs (e.g. a decode-only variant at large M) there is
        # nothing to add: the vendor alone would only repeat an earlier row.
        return _with_vendor_anchor([c for c in feas if c.variant in names] + pending, feas)
    if mode.startswith("pick:"):
        # Chosen configs per problem (e.g. a model's top predictions on training shapes, so the
        # ranker sees the near-ties among good configs that random samples rarely hold): a CSV
        # with columns key (Problem.key) and candidate (config id). The vendor, measured again in
        # the same run, anchors them to the earlier run, as in 'variant:'.
        ids = picked_candidates(mode.split(":", 1)[1]).get(problem.key, frozenset())
        return _with_vendor_anchor([c for c in feas if c.id in ids and not isinstance(c, VendorConfig)], feas)
    if mode.startswith("sample:"):
        k = int(mode.split(":", 1)[1])
        # A config's generation: "" for its variant's first grid, else the tag of the grid that
        # a later change added to the variant (the op's space module's config_generation).
        gen = getattr(registry.get(op).space_module(), "config_generation", lambda c: "")
        base = [c for c in feas if c.variant in SAMPLE_BASE_VARIANTS and not gen(c)]
        vendor = [c for c in feas if isinstance(c, VendorConfig)]
        rng = random.Random(stable_hash(f"{problem.key}/{seed}"))
        picked = rng.sample(base, min(k, len(base)))
        # Variants, and grids of a variant, added later are sampled at the same rate on their own
        # streams, so the base sample, and with it every committed training shard's resume, is
        # unchanged.
        rate = k / max(len(base), 1)
        groups = sorted({(c.variant, gen(c)) for c in feas if not isinstance(c, VendorConfig)}
                        - {(v, "") for v in SAMPLE_BASE_VARIANTS})
        for variant, tag in groups:
            group = [c for c in feas if c.variant == variant and gen(c) == tag]
            rng_v = random.Random(stable_hash(f"{problem.key}/{seed}/{variant}" + (f"/{tag}" if tag else "")))
            picked += rng_v.sample(group, min(len(group), round(rate * len(group))))
        order = {c: i for i, c in enumerate(feas)}
        return sorted(picked, key=order.__getitem__) + vendor
    raise ValueError(f"candidate mode must be 'all', 'sample:K', 'variant:NAMES' or 'pick:CSV', got {mode!r}")


def _with_vendor_anchor(new: list, feas: list) -> list:
    """``new`` plus the feasible vendor configs, timed again as the anchor of rows added to shapes
    measured before; [] when nothing is new (the vendor alone would only repeat an earlier row)."""
    return new + [c for c in feas if isinstance(c, VendorConfig)] if new else []


@functools.lru_cache(maxsize=8)
def picked_candidates(path: str) -> dict[str, frozenset]:
    """{problem key: candidate ids} of a 'pick:' CSV (columns key, candidate). ValueError naming the
    file and the missing column, or the line of an empty field."""
    import csv

    if not os.path.isfile(path):
        raise ValueError(f"candidate mode 'pick:{path}': no such file")
    out: dict[str, set] = {}
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        for col in ("key", "candidate"):
            if col not in (reader.fieldnames or []):
                raise ValueError(f"{path}: no {col!r} column (columns: key, candidate)")
        for line, row in enumerate(reader, start=2):
            key, cid = (row["key"] or "").strip(), (row["candidate"] or "").strip()
            if not key or not cid:
                raise ValueError(f"{path}, line {line}: empty key or candidate")
            out.setdefault(key, set()).add(cid)
    return {k: frozenset(v) for k, v in out.items()}


@dataclass
class SweepStats:
    shapes: int = 0
    measured: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0
    stopped_early: bool = False
    # Where the seconds went (inputs + reference, correctness gate, timing, store
    # writes): tells what to speed up next without a profiler on the GPU machine.
    phase_seconds: dict = field(default_factory=lambda: {"setup": 0.0, "gate": 0.0, "timing": 0.0, "store": 0.0})
    # Rows written by this run, per status; shapes skipped because their inputs did not fit.
    statuses: Counter = field(default_factory=Counter)
    skipped_shapes: list = field(default_factory=list)
    # One entry per shape: its status counts, seconds and device memory (see shape_memory).
    shape_log: list = field(default_factory=list)
    # Shapes with more than HEALTH_THRESHOLD of their rows failed for a reason other
    # than the config itself (see health_warning).
    unhealthy: list = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.measured / self.seconds if self.seconds > 0 else 0.0

    def memory_summary(self) -> dict:
        """Largest per-shape peaks of reserved and allocated device memory, MiB."""
        logs = [s["memory"] for s in self.shape_log if s.get("memory")]
        if not logs:
            return {}
        return {"shapes": len(logs),
                "max_reserved_peak_mb": max(m["reserved_peak_mb"] for m in logs),
                "max_allocated_peak_mb": max(m["allocated_peak_mb"] for m in logs),
                "max_reserved_after_mb": max(m["reserved_after_mb"] for m in logs)}


# A shape whose rows failed for reasons other than the config itself (out of memory,
# wrong results, crashes) above this fraction has no trustworthy oracle.
HEALTH_THRESHOLD = 0.01


def health_warning(shape_key: str, counts: Counter) -> str | None:
    """A loud one-line warning when more than HEALTH_THRESHOLD of a shape's rows failed
    for a reason other than a compile error or a resource limit of the config."""
    total = sum(counts.values())
    bad = {s: n for s, n in counts.items() if s != C.STATUS_OK and s not in C.CONFIG_FAILURES}
    if total == 0 or sum(bad.values()) <= HEALTH_THRESHOLD * total:
        return None
    detail = ", ".join(f"{s} {n}" for s, n in sorted(bad.items()))
    return (f"WARNING: {shape_key}: {sum(bad.values())} of {total} rows failed ({detail}); "
            "its oracle is not exact until they are measured again")


def shape_memory(device: str) -> dict | None:
    """Reserved and allocated device memory (MiB) now and at their peaks since the last
    call; resets the peaks. None off the GPU."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    mib = 2.0 ** 20
    out = {"reserved_peak_mb": round(torch.cuda.max_memory_reserved() / mib, 1),
           "allocated_peak_mb": round(torch.cuda.max_memory_allocated() / mib, 1),
           "reserved_after_mb": round(torch.cuda.memory_reserved() / mib, 1),
           "allocated_after_mb": round(torch.cuda.memory_allocated() / mib, 1)}
    torch.cuda.reset_peak_memory_stats()
    return out


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        return None
    return tqdm(total=total, desc=desc, unit="cand", disable=not enabled, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.05)


def _say(bar, msg: str) -> None:
    """A line on stderr that does not tear the progress bar."""
    if bar is not None:
        bar.write(msg, file=sys.stderr)
    else:
        print(msg, file=sys.stderr)


def key_of(op: str, shape, candidate: str) -> tuple:
    """The store key of a (shape, candidate) of an op (see store.row_key)."""
    spec = registry.get(op)
    ints, strs = registry.key_layout()

    def value(c):
        return getattr(shape, c, spec.fixed.get(c, registry.column_default(c)))

    return (op, shape.dtype, shape.m, shape.n, shape.k, *(value(c) for c in ints), candidate, *(value(c) for c in strs))


def shape_problem(spec, shape):
    """The op's Problem of a suite shape (its ``problem_fields``, read off the shape)."""
    return spec.problem_of({f: getattr(shape, f) for f in spec.problem_fields})


def problem_row_fields(spec, problem) -> dict:
    """The row columns of a problem beyond (m, n, k, dtype): the op's pinned fields, its own problem
    fields, and the statistics its Problem reports (``row_stats()``, e.g. an MoE routing's)."""
    out = dict(spec.fixed)
    for f in spec.problem_fields:
        if f not in registry.SHARED_PROBLEM:
            out[f] = getattr(problem, f)
    stats = getattr(problem, "row_stats", None)
    if callable(stats):
        out.update(stats())
    return out


def measure_candidate(cfg: GemmConfig, ops, ref, dtype: str, timer, key: tuple, phase: dict,
                      bounds: dict | None = None) -> dict:
    """Gate then time one candidate: the row's status, error and timing fields."""
    t0 = time.perf_counter()
    status, err, detail = C.gate(cfg, ops[0], ref, dtype, bounds=bounds)
    out = {"status": status, "rel_err": err, "error": detail}
    t1 = time.perf_counter()
    phase["gate"] += t1 - t0
    if status == C.STATUS_OK:
        try:
            t = timer.measure(lambda i, c=cfg: ops[i].run(c), len(ops), key="|".join(map(str, key)))
            out.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us,
                       n_samples=t.n_samples, n_inner=t.n_inner, stable=t.stable)
        except Exception as exc:  # noqa: BLE001 - a failure is a row, not a lost shape
            out.update(status=C.classify_exception(exc), error=f"timing: {str(exc)[:300]}")
    phase["timing"] += time.perf_counter() - t1
    return out


def run_sweep(shapes: Sequence, store: ResultStore, timer, *, mode: str = "all", seed: int = 0,
              device: str = "cuda", arch: str = "sm90", provenance: dict | None = None,
              suite: str = "user", progress: bool = True, time_budget_s: float | None = None,
              on_shape: Callable[[object, dict], None] | None = None, op: str) -> SweepStats:
    """Measure every selected candidate of every shape of ``op`` not yet in ``store``.

    With ``time_budget_s``, stops cleanly between shapes once the budget is
    spent (a later run resumes), instead of being killed mid-candidate.

    Device memory: finished graphs' private pools and the allocator's cache are freed after
    every shape, and ``stats.shape_log`` records each shape's reserved and allocated
    memory. A candidate that runs out of memory is retried once after freeing; if it
    fails again its row has status ``out_of_memory``, which a resume measures again.
    A shape whose inputs do not fit is skipped with a message.
    """
    spec = registry.get(op)
    bounds = spec.impl_module().ERROR_BOUNDS
    # The op's own L2 policy where it sizes its timing copies itself (correctness.operand_sets).
    l2_policy = getattr(spec.impl_module(), "L2_POLICY", L2_POLICY)
    op_params = spec.space_module().config_params
    prov = dict(provenance or {})
    l2 = int(prov.get("l2_bytes") or 50 * 2**20)
    stats = SweepStats()
    plan = []
    for sh in shapes:
        prob = shape_problem(spec, sh)
        cands = select_candidates(prob, mode, seed, arch, op=op)
        todo = [c for c in cands if not store.done(key_of(op, sh, c.id))]
        stats.skipped += len(cands) - len(todo)
        if todo:
            plan.append((sh, prob, todo, len(cands)))

    died = store.died_in()
    bar = _progress(sum(len(p[2]) for p in plan), f"sweep {suite}", progress)
    t_start = time.perf_counter()
    shape_memory(device)  # peaks count from here
    try:
        for sh, prob, todo, n_cands in plan:
            t_shape = time.perf_counter()
            if time_budget_s is not None and t_shape - t_start > time_budget_s:
                stats.stopped_early = True
                break
            phase = stats.phase_seconds
            phase0 = dict(phase)
            try:
                ops, ref = C.operand_sets(prob, seed, l2, device, op=op)
            except Exception as exc:  # noqa: BLE001 - only running out of memory skips a shape
                if not C.is_out_of_memory(exc):
                    raise
                ops = ref = None
                free_device_memory(timer, device)
                stats.skipped_shapes.append(prob.key)
                _say(bar, f"skipping {prob.key}: its inputs do not fit in device memory ({str(exc)[:160]})")
                bar and bar.update(len(todo))
                continue
            n_copies = len(ops)
            phase["setup"] += time.perf_counter() - t_shape
            base = {
                "suite": suite, "op": op, **problem_row_fields(spec, prob), "m": sh.m, "n": sh.n, "k": sh.k, "dtype": sh.dtype,
                "family": sh.family, "origins": ";".join(sh.origins[:8]),
                "eval_shape": mode == "all", "n_candidates": n_cands, "seed": seed,
                "l2_policy": l2_policy, "n_copies": n_copies, "timer": timer.name, **prov,
            }
            measured_here = 0
            counts: Counter = Counter()
            for cfg in todo:
                key = key_of(op, sh, cfg.id)
                # The op's own parameter view (what its runtime candidate table computes features from).
                row = {**base, "candidate": cfg.id, "variant": cfg.variant, **op_params(cfg),
                       "status": C.STATUS_OK, "rel_err": float("nan"), "p20_us": float("nan"),
                       "p50_us": float("nan"), "p80_us": float("nan"), "n_samples": 0, "n_inner": 0,
                       "stable": False, "error": ""}
                deaths = died[1] if died is not None and died[0] == key else 0
                if deaths >= MAX_DEATHS:
                    # Processes died inside this candidate twice: a crash of its own, not a kill
                    # from outside. Record it, don't run it a third time.
                    row.update(status=C.STATUS_CRASH, timestamp=now(),
                               error=f"the process died while running this candidate ({deaths} times)")
                    store.append(row)
                    store.end()
                    stats.failed += 1
                    stats.statuses[row["status"]] += 1
                    counts[row["status"]] += 1
                    bar and bar.update(1)
                    continue
                store.begin(key, deaths)
                row.update(measure_candidate(cfg, ops, ref, sh.dtype, timer, key, phase, bounds))
                if row["status"] == C.STATUS_OUT_OF_MEMORY:
                    # What earlier candidates left reserved, not this config: free and retry once.
                    free_device_memory(timer, device)
                    row.update(measure_candidate(cfg, ops, ref, sh.dtype, timer, key, phase, bounds))
                if row["status"] == C.STATUS_OK:
                    measured_here += 1
                else:
                    stats.failed += 1
                t2 = time.perf_counter()
                row["timestamp"] = now()
                store.append(row)
                store.end()
                phase["store"] += time.perf_counter() - t2
                stats.statuses[row["status"]] += 1
                counts[row["status"]] += 1
                bar and bar.update(1)
                if row["status"] == C.STATUS_CRASH:
                    raise RuntimeError(f"CUDA context lost at {cfg.id} on {sh.key}; rerun to resume")
                # Each timed candidate's CUDA graph keeps its private pool (its scratch: an MoE stage
                # holds a (M * top_k, N) buffer, 470 MB at M = 4096 x top-8 x 7168): within one shape of
                # 200 candidates the H100's reserved memory reached 80 GB. Free them once more than
                # FREE_SLACK_BYTES sit cached; a no-op (no sync) below that.
                free_device_memory(timer, device, force=False)
            stats.shapes += 1
            stats.measured += measured_here
            del ops, ref
            free_device_memory(timer, device, force=False)
            entry = {"shape": prob.key, "rows": sum(counts.values()), "statuses": dict(counts),
                     "seconds": round(time.perf_counter() - t_shape, 2),
                     # Where this shape's seconds went (a slow shape: compiling? timing?).
                     "phase_seconds": {k: round(phase[k] - phase0.get(k, 0.0), 2) for k in phase},
                     "memory": shape_memory(device)}
            stats.shape_log.append(entry)
            warn = health_warning(prob.key, counts)
            if warn:
                stats.unhealthy.append(prob.key)
                _say(bar, warn)
            if on_shape is not None:
                on_shape(sh, {"measured": measured_here, "seconds": time.perf_counter() - t_shape,
                              "log": entry})
    except KeyboardInterrupt:
        # A user interrupt (or SIGTERM, see cli.stop_on_sigterm) is not a crash of the
        # candidate: clear the marker, so the resume measures it again.
        store.end()
        raise
    finally:
        stats.seconds = time.perf_counter() - t_start
        bar and bar.close()
    return stats


def format_health(stats: SweepStats) -> str:
    """Status counts of a sweep, overall and for every shape with a failed row."""
    lines = ["rows by status: " + (", ".join(f"{s} {n}" for s, n in stats.statuses.most_common()) or "none")]
    for entry in stats.shape_log:
        st = entry["statuses"]
        if any(s != C.STATUS_OK for s in st):
            lines.append(f"  {entry['shape']}: " + ", ".join(f"{s} {n}" for s, n in sorted(st.items())))
    if stats.skipped_shapes:
        lines.append(f"shapes skipped (inputs did not fit in device memory): {', '.join(stats.skipped_shapes)}")
    if stats.unhealthy:
        lines.append(f"WARNING: {len(stats.unhealthy)} shape(s) with more than {HEALTH_THRESHOLD:.0%} of rows "
                     f"failed for reasons other than the config: {', '.join(stats.unhealthy[:10])}")
    return "\n".join(lines)


def shard_shapes(shapes: Iterable, shard: tuple[int, int]) -> list:
    """The shapes of one shard, in input order."""
    return [s for s in shapes if in_shard(s, shard)]
