"""Fill Triton's on-disk kernel cache from parallel worker processes.

Compiling one config takes ~0.4 s; a sweep over hundreds of configs and a few
specialisations would spend most of its time compiling in the measuring
process. Workers launch each (config, specialisation) once on a tiny probe
problem with the same divisibility properties, which compiles it into the
shared cache; the sweep then only loads cubins. Errors are ignored here: the
sweep meets them again and records them as rows.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Iterable

from gemm_costmodel import registry

from ..kernels.gemm.space import Problem, VendorConfig


def _space_hook(p, name: str):
    """The op's own ``name`` function if its space module has one (by the problem's module)."""
    import sys

    return getattr(sys.modules.get(type(p).__module__), name, None)


def specialisation(p: Problem) -> tuple:
    """What Triton specialises on (besides constexprs): divisibility of N, K and strides,
    including the row stride ceil(K/128) of the block-scaled op's scale tensors (K = 7168 and
    K = 18432 agree on everything else, but 56 and 144 differ in divisibility by 16). An op's
    space module may define its own ``specialisation``."""
    hook = _space_hook(p, "specialisation")
    if hook is not None:
        return hook(p)
    return (p.dtype, p.n % 16 == 0, p.n % 8, p.k % 16 == 0, p.k % 8,
            p.k % 64 == 0, p.k % 128 == 0, p.k % 256 == 0, -(-p.k // 128) % 16 == 0)


def probe(p: Problem) -> Problem:
    """Tiny problem compiling to the same kernels as p (M is never specialised on; a launch
    does not check feasibility, so a config tied to another M compiles here too). An op's space
    module may define its own ``probe_problem``."""
    hook = _space_hook(p, "probe_problem")
    if hook is not None:
        return hook(p)
    return type(p)(3, 16 + p.n % 16, p.k, p.dtype)


def _fields(p) -> dict:
    from dataclasses import fields

    return {f.name: getattr(p, f.name) for f in fields(p)}


def _worker(args: tuple[str, list[tuple[str, dict]]]) -> int:
    import torch

    op, tasks = args
    spec = registry.get(op)
    impl = spec.impl_module()
    done = 0
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    prob, ops = None, None
    for cid, fields in tasks:
        if spec.problem_of(fields) != prob:
            # One probe's operands at a time (the tasks come grouped by probe), their memory
            # handed back before the next: 14 workers each caching the largest weight probe they
            # had met (up to 3.25 GiB) ran the GPU out of memory in the M = 1 GEMV sweep.
            prob, ops = spec.problem_of(fields), None
            torch.cuda.empty_cache()
            try:
                ops = impl.make_operands(prob, "cuda", gen)
            except torch.OutOfMemoryError:
                pass  # the sweep compiles these configs itself
        if ops is None:
            continue
        try:
            ops.run(spec.config_from_id(cid))
            done += 1
        except Exception:  # noqa: BLE001 - the sweep records the failure
            pass
    torch.cuda.synchronize()
    return done


def shape_probe(p: Problem) -> Problem:
    """The probe of a config compiled per weight shape (``shape_specialised``, the GEMV): the
    problem's own N and K at M = 1 (M is never specialised on). An op's space module may define
    its own ``shape_probe``."""
    hook = _space_hook(p, "shape_probe")
    if hook is not None:
        return hook(p)
    return type(p)(1, p.n, p.k, p.dtype)


def _probe_key(task: tuple) -> tuple:
    """A hashable key of a task's probe problem (its fields)."""
    return tuple(sorted(task[1].items()))


def plan(problems_and_configs: Iterable[tuple[Problem, list]]) -> list[tuple]:
    """Distinct (config id, probe problem) tasks for the given problems, those of one probe
    problem next to each other."""
    seen = set()
    groups: dict[tuple, list] = {}
    for prob, cfgs in problems_and_configs:
        sig = specialisation(prob)
        pr = probe(prob)
        for c in cfgs:
            if isinstance(c, VendorConfig):
                continue
            if getattr(c, "shape_specialised", False):
                key, fields = (c.id, sig, prob.n, prob.k), _fields(shape_probe(prob))
            else:
                key, fields = (c.id, sig), _fields(pr)
            if key in seen:
                continue
            seen.add(key)
            task = (c.id, fields)
            # Grouped by probe: a worker holds one probe's operands at a time, and a
            # weight-shaped probe can be hundreds of MB.
            groups.setdefault(_probe_key(task), []).append(task)
    return [t for g in groups.values() for t in g]


def chunks_for(tasks: list[tuple], workers: int) -> list[list[tuple]]:
    """Tasks split over workers, the chunks balanced by task count (largest probe groups first).
    A probe's tasks stay in one chunk (one set of its operands), unless the probe has more than a
    worker's fair share (ceil(tasks / workers)): then it is cut into pieces of at most that size.
    An evaluation sweep of vLLM's fused MoE over one problem's whole space is one or two probes
    of 1,248 tasks; kept whole they ran on 2 of 14 workers (about 9 s a task: hours). Cutting adds
    no memory: a worker still holds one probe's operands at a time."""
    workers = max(1, workers)
    share = max(1, -(-len(tasks) // workers))
    groups: dict = {}
    for t in tasks:
        groups.setdefault(_probe_key(t), []).append(t)
    pieces = [g[i:i + share] for g in groups.values() for i in range(0, len(g), share)]
    chunks = [[] for _ in range(workers)]
    for g in sorted(pieces, key=len, reverse=True):
        min(chunks, key=len).extend(g)
    return [c for c in chunks if c]


def precompile(problems_and_configs, workers: int | None = None, log=print, *, op: str) -> int:
    """Compile every needed (config, specialisation) in parallel; returns how many compiled."""
    tasks = plan(problems_and_configs)
    if not tasks:
        return 0
    workers = workers or max(1, min(14, (os.cpu_count() or 2) - 2))
    chunks = chunks_for(tasks, workers)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        n = sum(pool.map(_worker, [(op, c) for c in chunks]))
    log(f"precompile: {n}/{len(tasks)} kernels ready in {time.perf_counter() - t0:.1f}s with {workers} workers")
    return n
