"""Sweep runner: every (shape, candidate) of a shard, gated, timed, stored.

- Long format: one row per (shape, candidate), failures included with a status.
- Resumable: rows already in the shard file are skipped; see store.py.
- Shardable: ``--shard i/n`` takes the shapes whose stable hash is i mod n, so
  all candidates of a shape are measured in the same process, on one card.
- Candidate selection per shape: ``all`` (evaluation shapes, exact oracle) or
  a seeded random sample of Triton candidates plus the vendor library.
"""
from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..kernels.gemm_configs import (VARIANTS, GemmConfig, Problem, VendorConfig, config_params,
                                    feasible_configs)
from . import correctness as C
from .provenance import now
from .store import ResultStore

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


def select_candidates(problem: Problem, mode: str, seed: int, arch: str = "sm90") -> list[GemmConfig]:
    """Candidates to measure for a problem: 'all', 'sample:K' (K Triton configs + vendor) or
    'variant:A[,B...]' (every feasible config of those variants + vendor).

    'sample:K' draws K configs of SAMPLE_BASE_VARIANTS and, from each later variant,
    the same fraction of its feasible configs."""
    feas = feasible_configs(problem, arch)
    if mode == "all":
        return feas
    if mode.startswith("variant:"):
        # Adds a new kernel variant's rows to shapes measured before it existed; the
        # vendor row, measured again in the same run, anchors them to the earlier run.
        names = set(mode.split(":", 1)[1].split(","))
        unknown = names - set(VARIANTS)
        if unknown or not names:
            raise ValueError(f"candidate mode {mode!r}: unknown variant(s) {sorted(unknown)}; known: {sorted(VARIANTS)}")
        return [c for c in feas if c.variant in names or isinstance(c, VendorConfig)]
    if mode.startswith("sample:"):
        k = int(mode.split(":", 1)[1])
        base = [c for c in feas if c.variant in SAMPLE_BASE_VARIANTS]
        vendor = [c for c in feas if isinstance(c, VendorConfig)]
        rng = random.Random(stable_hash(f"{problem.key}/{seed}"))
        picked = rng.sample(base, min(k, len(base)))
        # Variants added later are sampled at the same rate on their own streams, so the
        # base sample, and with it every committed training shard's resume, is unchanged.
        rate = k / max(len(base), 1)
        for variant in sorted({c.variant for c in feas} - set(SAMPLE_BASE_VARIANTS) - {"vendor"}):
            group = [c for c in feas if c.variant == variant]
            rng_v = random.Random(stable_hash(f"{problem.key}/{seed}/{variant}"))
            picked += rng_v.sample(group, min(len(group), round(rate * len(group))))
        order = {c: i for i, c in enumerate(feas)}
        return sorted(picked, key=order.__getitem__) + vendor
    raise ValueError(f"candidate mode must be 'all', 'sample:K' or 'variant:NAMES', got {mode!r}")


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

    @property
    def rate(self) -> float:
        return self.measured / self.seconds if self.seconds > 0 else 0.0


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        return None
    return tqdm(total=total, desc=desc, unit="cand", disable=not enabled, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.05)


def run_sweep(shapes: Sequence, store: ResultStore, timer, *, mode: str = "all", seed: int = 0,
              device: str = "cuda", arch: str = "sm90", provenance: dict | None = None,
              suite: str = "user", progress: bool = True, time_budget_s: float | None = None,
              on_shape: Callable[[object, dict], None] | None = None) -> SweepStats:
    """Measure every selected candidate of every shape not yet in ``store``.

    With ``time_budget_s``, stops cleanly between shapes once the budget is
    spent (a later run resumes), instead of being killed mid-candidate.
    """
    prov = dict(provenance or {})
    l2 = int(prov.get("l2_bytes") or 50 * 2**20)
    stats = SweepStats()
    plan = []
    for sh in shapes:
        prob = Problem(sh.m, sh.n, sh.k, sh.dtype)
        cands = select_candidates(prob, mode, seed, arch)
        todo = [c for c in cands if not store.done((sh.dtype, sh.m, sh.n, sh.k, c.id))]
        stats.skipped += len(cands) - len(todo)
        if todo:
            plan.append((sh, prob, todo, len(cands)))

    crashed = store.crashed_key()
    bar = _progress(sum(len(p[2]) for p in plan), f"sweep {suite}", progress)
    t_start = time.perf_counter()
    try:
        for sh, prob, todo, n_cands in plan:
            t_shape = time.perf_counter()
            if time_budget_s is not None and t_shape - t_start > time_budget_s:
                stats.stopped_early = True
                break
            phase = stats.phase_seconds
            ops, ref = C.operand_sets(prob, seed, l2, device)
            first, n_copies = ops[0], len(ops)
            phase["setup"] += time.perf_counter() - t_shape
            base = {
                "suite": suite, "m": sh.m, "n": sh.n, "k": sh.k, "dtype": sh.dtype,
                "family": sh.family, "origins": ";".join(sh.origins[:8]),
                "eval_shape": mode == "all", "n_candidates": n_cands, "seed": seed,
                "l2_policy": L2_POLICY, "n_copies": n_copies, "timer": timer.name, **prov,
            }
            measured_here = 0
            for cfg in todo:
                key = (sh.dtype, sh.m, sh.n, sh.k, cfg.id)
                row = {**base, "candidate": cfg.id, "variant": cfg.variant, **config_params(cfg),
                       "status": C.STATUS_OK, "rel_err": float("nan"), "p20_us": float("nan"),
                       "p50_us": float("nan"), "p80_us": float("nan"), "n_samples": 0, "n_inner": 0,
                       "stable": False, "error": ""}
                if crashed == key:
                    # The previous process died inside this candidate: record, don't rerun.
                    row.update(status=C.STATUS_CRASH, error="process died while running this candidate",
                               timestamp=now())
                    store.append(row)
                    store.end()
                    stats.failed += 1
                    bar and bar.update(1)
                    continue
                t0 = time.perf_counter()
                store.begin(key)
                status, err, detail = C.gate(cfg, first, ref, sh.dtype)
                row.update(status=status, rel_err=err, error=detail)
                t1 = time.perf_counter()
                phase["gate"] += t1 - t0
                if status == C.STATUS_OK:
                    try:
                        t = timer.measure(lambda i, c=cfg: ops[i].run(c), n_copies, key="|".join(map(str, key)))
                        row.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us,
                                   n_samples=t.n_samples, n_inner=t.n_inner, stable=t.stable)
                        measured_here += 1
                    except Exception as exc:  # noqa: BLE001 - a failure is a row, not a lost shape
                        row.update(status=C.classify_exception(exc), error=f"timing: {str(exc)[:300]}")
                if row["status"] != C.STATUS_OK:
                    stats.failed += 1
                t2 = time.perf_counter()
                phase["timing"] += t2 - t1
                row["timestamp"] = now()
                store.append(row)
                store.end()
                phase["store"] += time.perf_counter() - t2
                bar and bar.update(1)
                if row["status"] == C.STATUS_CRASH:
                    raise RuntimeError(f"CUDA context lost at {cfg.id} on {sh.key}; rerun to resume")
            stats.shapes += 1
            stats.measured += measured_here
            if on_shape is not None:
                on_shape(sh, {"measured": measured_here, "seconds": time.perf_counter() - t_shape})
            del ops, first, ref
    except KeyboardInterrupt:
        # A user interrupt is not a crash of the candidate: let the resume re-measure it.
        store.end()
        raise
    finally:
        stats.seconds = time.perf_counter() - t_start
        bar and bar.close()
    return stats


def shard_shapes(shapes: Iterable, shard: tuple[int, int]) -> list:
    """The shapes of one shard, in input order."""
    return [s for s in shapes if in_shard(s, shard)]
