"""Acceptance run of the foundation issue, on one GPU. Writes everything under --out.

Parts (``--parts``):
- ceilings: measured device-to-device copy bandwidth and bf16 matmul rate.
- gate: every feasible candidate of every variant, bf16/fp16/fp8, on weird
  shapes (M in {1, 7, 33, 4097}; N, K not multiples of 64) through the
  correctness gate. One row per (shape, candidate) in gate.jsonl.
- memory_ab: the same throughput, the flat-memory harness against the one before it,
  alternating rounds in one process.
- throughput: harness measurements per second on mid-size shapes against a
  plain do_bench loop over the same candidates.
- bench: the foundation suite, every candidate plus cuBLAS, timed.

    python -m gemm_costmodel.benchmarks.foundation_acceptance --out OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from gemm_costmodel.kernels import shapes as S
from gemm_costmodel.kernels.gemm import suites as GS
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import harness, precompile, provenance
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.store import ResultStore
from gemm_costmodel.kernels.gemm.space import Problem, config_params, feasible_configs

WEIRD_M = (1, 7, 33, 4097)
WEIRD_NK = ((1000, 1048), (333, 517), (1040, 1104))  # 333/517 break TMA alignment; 1040/1104 allow fp8 TMA and cuBLAS
DTYPES = ("bf16", "fp16", "fp8")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ceilings(out_dir, prov):
    from triton.testing import do_bench

    n = 1 << 30
    a = torch.randn(n // 4, device="cuda")
    b = torch.empty_like(a)
    t_ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    copy_gbps = 2 * n / (t_ms * 1e-3) / 1e9
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = do_bench(lambda: x @ y, warmup=25, rep=200, return_mode="median")
    res = {"copy_gbps": copy_gbps, "bf16_mm_tflops": 2 * 8192**3 / (t_mm * 1e-3) / 1e12, **prov}
    json.dump(res, open(os.path.join(out_dir, "ceilings.json"), "w"), indent=1)
    log(f"ceilings: copy {copy_gbps:.0f} GB/s (read+write), bf16 mm {res['bf16_mm_tflops']:.0f} TFLOP/s")
    del a, b, x, y
    return res


def gate_all(out_dir, prov, workers):
    problems = [Problem(m, n, k, d) for d in DTYPES for (n, k) in WEIRD_NK for m in WEIRD_M]
    plan = [(p, feasible_configs(p)) for p in problems]
    precompile.precompile(plan, workers=workers, log=log, op="gemm")
    path = os.path.join(out_dir, "gate.jsonl")
    counts = {}
    t0 = time.perf_counter()
    with ResultStore(path) as store:
        for p, cfgs in plan:
            gen = torch.Generator(device="cuda")
            gen.manual_seed(C.seed_for(p, 0))
            ops = C.make_operands(p, "cuda", gen)
            ref = C.reference(ops)
            for cfg in cfgs:
                status, err, detail = C.gate(cfg, ops, ref, p.dtype)
                store.append({"m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype, "candidate": cfg.id,
                              "variant": cfg.variant, **config_params(cfg), "status": status,
                              "rel_err": err, "error": detail, "timestamp": provenance.now(), **prov})
                c = counts.setdefault((p.dtype, cfg.variant), {})
                c[status] = c.get(status, 0) + 1
                if status == C.STATUS_CRASH:
                    raise RuntimeError(f"CUDA context lost: {cfg.id} {p.key}: {detail}")
    log(f"gate: {sum(sum(v.values()) for v in counts.values())} checks in {time.perf_counter() - t0:.0f}s")
    for (d, v), c in sorted(counts.items()):
        log(f"  gate {d:5s} {v:11s} {c}")
    return counts


THROUGHPUT_SHAPES = (S.Shape(1024, 4096, 4096, "bf16"), S.Shape(512, 8192, 2048, "bf16"),
                     S.Shape(256, 5120, 5120, "bf16"), S.Shape(2048, 2048, 2048, "bf16"))


def capture_ab(out_dir, prov, workers, rounds=2, n_cands=48):
    """Same host, one process: the harness's throughput with torch.cuda.graph() capture
    (sync + gc.collect + empty_cache per graph) against the light capture, alternating."""
    import tempfile

    probs = [Problem(s.m, s.n, s.k, s.dtype) for s in THROUGHPUT_SHAPES]
    cands = {p: harness.select_candidates(p, f"sample:{n_cands}", 1, op="gemm") for p in probs}
    precompile.precompile(list(cands.items()), workers=workers, log=log, op="gemm")
    res = {"torch_capture": [], "light_capture": [], "timer_stats": {}}
    for r in range(2 * rounds + 1):  # the first round warms the kernels and is not counted
        light = r % 2 == 0
        timer = timing.GraphTimer(light_capture=light)
        with tempfile.TemporaryDirectory() as tmp, ResultStore(os.path.join(tmp, "t.jsonl")) as store:
            stats = harness.run_sweep(THROUGHPUT_SHAPES, store, timer, mode=f"sample:{n_cands}", seed=1,
                                      provenance=prov, suite="throughput", progress=False, op="gemm")
        if r == 0:
            continue
        name = "light_capture" if light else "torch_capture"
        res[name].append(stats.rate)
        res["timer_stats"].setdefault(name, []).append(dict(timer.stats))
        log(f"capture A/B round {r}: {name} {stats.rate:.0f}/s")
    res["provenance"] = prov
    json.dump(res, open(os.path.join(out_dir, "capture_ab.json"), "w"), indent=1)
    return res


class _BeforeMemoryFix:
    """Context: the harness as it was before memory was kept flat (for the A/B below): a new
    side stream for every warm-up and capture, a split-K workspace allocated per launch (so
    inside every capture), nothing freed between shapes."""

    def __enter__(self):
        from gemm_costmodel.kernels.gemm import kernel as K

        self._saved = (timing.GraphTimer.side_stream, harness.free_device_memory, K.splitk_workspace)
        timing.GraphTimer.side_stream = lambda self: torch.cuda.Stream()
        harness.free_device_memory = lambda timer, device, force=True: None
        fresh = (lambda device, split_k, m, n:
                 torch.empty((split_k, m, n), dtype=torch.float32, device=device))
        K.splitk_workspace = fresh
        # gemm_swapab imported the name: patch it there too.
        import gemm_costmodel.kernels.gemm.swapab as SW
        self._sw = getattr(SW, "splitk_workspace", None)
        if self._sw is not None:
            SW.splitk_workspace = fresh
        return self

    def __exit__(self, *exc):
        from gemm_costmodel.kernels.gemm import kernel as K
        import gemm_costmodel.kernels.gemm.swapab as SW

        timing.GraphTimer.side_stream, harness.free_device_memory, K.splitk_workspace = self._saved
        if self._sw is not None:
            SW.splitk_workspace = self._sw


def memory_ab(out_dir, prov, workers, rounds=3, n_cands=48):
    """Same host, one process: harness throughput (gate + graph timing, measurements/s) on the
    throughput shapes with the flat-memory harness against the one before it, alternating."""
    import tempfile

    probs = [Problem(s.m, s.n, s.k, s.dtype) for s in THROUGHPUT_SHAPES]
    cands = {p: harness.select_candidates(p, f"sample:{n_cands}", 1, op="gemm") for p in probs}
    precompile.precompile(list(cands.items()), workers=workers, log=log, op="gemm")
    arms = ("flat_memory", "before", "free_every_shape")
    res = {a: [] for a in arms}
    res["reserved_mb"] = {a: [] for a in arms}
    real_free = harness.free_device_memory
    for r in range(len(arms) * rounds + 1):  # the first round warms the kernels and is not counted
        name = arms[r % len(arms)]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        with tempfile.TemporaryDirectory() as tmp, ResultStore(os.path.join(tmp, "t.jsonl")) as store:
            if name == "before":
                with _BeforeMemoryFix():
                    stats = harness.run_sweep(THROUGHPUT_SHAPES, store, timing.GraphTimer(), mode=f"sample:{n_cands}",
                                              seed=1, provenance=prov, suite="throughput", progress=False, op="gemm")
            else:
                if name == "free_every_shape":
                    harness.free_device_memory = lambda timer, device, force=True: real_free(timer, device, True)
                try:
                    stats = harness.run_sweep(THROUGHPUT_SHAPES, store, timing.GraphTimer(),
                                              mode=f"sample:{n_cands}", seed=1, provenance=prov,
                                              suite="throughput", progress=False, op="gemm")
                finally:
                    harness.free_device_memory = real_free
        if r == 0:
            continue
        res[name].append(stats.rate)
        res["reserved_mb"][name].append(round(torch.cuda.memory_reserved() / 2**20, 1))
        log(f"memory A/B round {r}: {name} {stats.rate:.0f}/s, {stats.measured} measurements, "
            f"reserved after {res['reserved_mb'][name][-1]:.0f} MiB")
    res["provenance"] = prov
    json.dump(res, open(os.path.join(out_dir, "memory_ab.json"), "w"), indent=1)
    return res


def throughput(out_dir, prov, workers, n_cands=48):
    from triton.testing import do_bench

    probs = [Problem(s.m, s.n, s.k, s.dtype) for s in THROUGHPUT_SHAPES]
    cands = {p: harness.select_candidates(p, f"sample:{n_cands}", 1, op="gemm") for p in probs}
    precompile.precompile(list(cands.items()), workers=workers, log=log, op="gemm")
    path = os.path.join(out_dir, "throughput_harness.jsonl")
    with ResultStore(path) as store:
        # Warm the in-process kernel cache so both methods exclude compile/load.
        for p, cs in cands.items():
            ops = C.make_operands(p, "cuda", torch.Generator(device="cuda"))
            for c in cs:
                try:
                    ops.run(c)
                except Exception:  # noqa: BLE001
                    pass
        torch.cuda.synchronize()
        timer = timing.GraphTimer()
        stats = harness.run_sweep(THROUGHPUT_SHAPES, store, timer, mode=f"sample:{n_cands}",
                                  seed=1, provenance=prov, suite="throughput", progress=False, op="gemm")
    t0 = time.perf_counter()
    n = 0
    db = {}
    for p, cs in cands.items():
        ops = C.make_operands(p, "cuda", torch.Generator(device="cuda"))
        for c in cs:
            db[(p.key, c.id)] = do_bench(lambda: ops.run(c), warmup=3, rep=15, return_mode="median") * 1e3
            n += 1
    t_db = time.perf_counter() - t0
    res = {"harness_measurements": stats.measured, "harness_seconds": stats.seconds,
           "harness_per_s": stats.rate, "do_bench_measurements": n, "do_bench_seconds": t_db,
           "do_bench_per_s": n / t_db, "shapes": [s.key for s in THROUGHPUT_SHAPES],
           "harness_phase_seconds": stats.phase_seconds, "timer_stats": dict(timer.stats)}
    json.dump(res, open(os.path.join(out_dir, "throughput.json"), "w"), indent=1)
    log(f"throughput: harness {res['harness_per_s']:.0f}/s (gate + graph timing), do_bench loop "
        f"{res['do_bench_per_s']:.0f}/s")
    return res


def bench(out_dir, prov, workers, dtypes=("bf16",)):
    shapes = [s for d in dtypes for s in GS.foundation_suite(d)]
    probs = [(Problem(s.m, s.n, s.k, s.dtype), None) for s in shapes]
    precompile.precompile([(p, feasible_configs(p)) for p, _ in probs], workers=workers, log=log, op="gemm")
    path = os.path.join(out_dir, "foundation.jsonl")
    with ResultStore(path) as store:
        stats = harness.run_sweep(shapes, store, timing.GraphTimer(), mode="all", provenance=prov,
                                  suite="foundation", progress=True, op="gemm")
    log(f"bench: {stats}")
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", nargs="+", default=["ceilings", "gate", "throughput", "bench"])
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--bench-dtypes", nargs="+", default=["bf16"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prov = provenance.collect(torch.cuda.current_device())
    log(json.dumps(prov))
    if "ceilings" in args.parts:
        ceilings(args.out, prov)
    if "gate" in args.parts:
        gate_all(args.out, prov, args.workers)
    if "throughput" in args.parts:
        throughput(args.out, prov, args.workers)
    if "capture_ab" in args.parts:
        capture_ab(args.out, prov, args.workers)
    if "memory_ab" in args.parts:
        memory_ab(args.out, prov, args.workers)
    if "bench" in args.parts:
        bench(args.out, prov, args.workers, tuple(args.bench_dtypes))


if __name__ == "__main__":
    main()
