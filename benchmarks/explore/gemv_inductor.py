"""Exploration: why Inductor's M = 1 reduction beats our GEMV on some 16-120 MB weights (issue 18).

With max-autotune Inductor decomposes an M = 1 mm into a multiply and a sum over K, and tunes
that reduction's block sizes and warps per shape by coordinate descent at compile time. This
script, per M = 1 bf16 shape and in one process:

- compiles ``x @ w.t()`` with ``torch.compile(mode="max-autotune-no-cudagraphs")`` in a fresh
  cache and records what coordinate descent kept (the ``.best_config`` files) and the head of
  the reduction kernel's source;
- times, in the peer benchmark's paired rounds (``peers.time_rounds``: every contender's graph
  replays interleaved, three rotated rounds, all times from one round), Inductor's kernel, every
  GEMV config of the committed space for the shape, and knobs outside it: the committed kernel
  at BLOCK_K 4096, 2 or 16 warps, 2-3 pipeline stages, and a persistent GEMV (below) with a grid
  of P programs per SM looping over the row blocks (no tail wave); or, with ``--set spec``, the
  space's configs compiled with N, K and the strides as constants (as Inductor's static-shape
  kernel has them), or with ``--set speck`` 14 of them so and with only K and the weight's row
  stride constant. Every contender is gated against the fp32 reference first.

    python benchmarks/explore/gemv_inductor.py --out OUT [--set wide|spec] [--shapes M,N,K ...]

Writes OUT/gemv_inductor.jsonl (one row per shape, resumed) and prints a summary per shape.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

# The default shapes: the peer suite's seven M = 1 shapes and the four the issue quoted.
DEFAULT_SHAPES = [(1, 2048, 4096), (1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096), (1, 4096, 4096),
                  (1, 14336, 4096), (1, 5120, 5120), (1, 1024, 4608), (1, 5120, 8192), (1, 27392, 4096),
                  (1, 8192, 8192)]


@triton.jit
def gemv_persistent_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    # M = 1 only. Each program takes row blocks pid, pid + P, ...: a grid of P programs per SM
    # has no partly filled last wave; the rest is the committed kernel's loop.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles = tl.cdiv(N, BLOCK_N)
    for tile in range(pid, tiles, nprog):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + (offs_n % N)[:, None] * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for _kt in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
                x = tl.load(x_ptr + offs_k)
            else:
                w = tl.load(w_ptrs, mask=offs_k[None, :] < K, other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K
            offs_k += BLOCK_K
        tl.store(y_ptr + offs_n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=offs_n < N)


def persistent_run(ops, block_n, block_k, warps, per_sm, sms):
    n, k = ops.w.shape
    grid = (min(triton.cdiv(n, block_n), per_sm * sms),)
    gemv_persistent_kernel[grid](ops.x, ops.w, ops.out, n, k, ops.w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                 EVEN_K=k % block_k == 0, num_warps=warps, num_stages=1)
    return ops.out


def extra_gemv_configs():
    """Committed-kernel configs outside the space (BLOCK_K 4096, 2/16 warps, 2-3 stages)."""
    from gemm_costmodel.kernels.gemm.space import GemvConfig

    out = [GemvConfig(1, bn, 4096, 1, w, 1) for bn in (1, 2, 4, 8) for w in (4, 8, 16)]
    out += [GemvConfig(1, bn, bk, 1, w, 1) for bn in (1, 2, 4) for bk in (1024, 2048) for w in (2, 16)]
    out += [GemvConfig(1, bn, bk, 1, 4, s) for bn, bk in ((4, 2048), (2, 1024), (1, 1024), (4, 1024), (1, 2048))
            for s in (2, 3)]
    return out


def persistent_variants():
    return [(bn, bk, w, p) for bn in (1, 4) for bk in (1024, 2048) for w in (4, 8) for p in (4, 8, 16)]


# The committed GEMV with N, K and the strides compiled as constants (M stays a run-time value),
# as Inductor's static-shape kernels have them: one compile per (N, K, config).
# (The runs in benchmarks/results/gemv/inductor/ predate the committed kernel's specialisation.)
SPEC_RUNTIME = "M, N, K, stride_xm, stride_wn, stride_ym,"
SPEC_CONST = ("M, N: tl.constexpr, K: tl.constexpr, stride_xm: tl.constexpr, stride_wn: tl.constexpr, "
              "stride_ym: tl.constexpr,")


# Only K and the weight's row stride constant (N and the token rows' strides at run time): one
# compile per (K, config), which a model's handful of hidden sizes keeps to a few.
SPECK_CONST = "M, N, K: tl.constexpr, stride_xm, stride_wn: tl.constexpr, stride_ym,"
# The competitive configs of the spec run, for the spec-vs-K-only comparison.
SPECK_IDS = ["gemv_m1n1k1024_s1_w4s1", "gemv_m1n1k2048_s1_w4s1", "gemv_m1n1k2048_s1_w8s1", "gemv_m1n1k4096_s1_w8s1",
             "gemv_m1n1k4096_s1_w16s1", "gemv_m1n2k1024_s1_w4s1", "gemv_m1n2k2048_s1_w8s1", "gemv_m1n4k2048_s1_w4s1",
             "gemv_m1n4k2048_s1_w8s1", "gemv_m1n4k1024_s1_w4s1", "gemv_m1n8k512_s1_w4s1", "gemv_m1n1k1024_s1_w8s1",
             "gemv_m1n2k1024_s1_w8s1", "gemv_m1n1k2048_s1_w16s1"]


def specialised_kernel(const: str = SPEC_CONST):
    import inspect

    from gemm_costmodel.benchmarks.kernel_variants import constexpr_copy
    from gemm_costmodel.kernels.gemm import gemv as gemm_gemv

    if const == SPEC_CONST and "N: tl.constexpr" in inspect.getsource(gemm_gemv.gemv_kernel.fn):
        # The committed kernel is itself specialised now (this script's runs measured it before).
        return gemm_gemv.gemv_kernel
    return constexpr_copy(gemm_gemv.gemv_kernel, SPEC_RUNTIME, const,
                          "from gemm_costmodel.kernels.gemm.gemv import _x_row, _store_row, _reduce_row")


def spec_configs(space):
    """The space's unsplit GEMV configs and a few of Inductor's picks (16 warps, BLOCK_K 4096)."""
    from gemm_costmodel.kernels.gemm.space import GemvConfig

    out = [c for c in space if c.split_k == 1]
    out += [GemvConfig(1, bn, bk, 1, w, 1) for bn, bk, w in ((1, 2048, 16), (1, 4096, 16), (2, 4096, 16),
                                                             (2, 1024, 16), (4, 2048, 16), (4, 4096, 4),
                                                             (1, 4096, 4), (1, 4096, 8))]
    return out


def spec_run(kernel, cfg, ops):
    m, k = ops.x.shape
    n = ops.w.shape[0]
    grid = (triton.cdiv(n, cfg.block_n), 1, triton.cdiv(m, cfg.block_m))
    kernel[grid](ops.x, ops.w, ops.out, ops.out, ops.out, ops.out, ops.out, m, n, k, ops.x.stride(0),
                 ops.w.stride(0), ops.out.stride(0), HAS_SCALE=False, ROWS=cfg.block_m, BLOCK_N=cfg.block_n,
                 BLOCK_K=cfg.block_k, SPLIT_K=1, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages)
    return ops.out


def inductor_record(cache_dir: str, since: float) -> dict:
    """What coordinate descent kept (.best_config files) and the head of each kernel source,
    of the files written since ``since`` (this shape's compile)."""
    best = []
    for f in glob.glob(os.path.join(cache_dir, "**", "*.best_config"), recursive=True):
        if os.path.getmtime(f) < since:
            continue
        try:
            best.append(json.load(open(f)))
        except (OSError, ValueError):
            pass
    srcs = []
    for f in glob.glob(os.path.join(cache_dir, "**", "*.py"), recursive=True):
        if os.path.getmtime(f) < since:
            continue
        text = open(f, errors="replace").read()
        if "@triton.jit" in text and "def triton_" in text:
            i = text.find("def triton_")
            srcs.append(text[max(0, i - 1200): i + 2400])
    return {"best_configs": best, "kernel_sources": srcs[:2]}


def measure(m, n, k, timer, l2, sms, rounds, cache, which="wide"):
    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.benchmarks.peers import time_rounds
    from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig, feasible_configs

    p = Problem(m, n, k, "bf16")
    opsets, ref = C.operand_sets(p, 0, l2)
    first = opsets[0]
    row = {"m": m, "n": n, "k": k, "dtype": "bf16", "n_copies": len(opsets), "weight_bytes": first.w.nbytes}
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: x @ w.t(), mode="max-autotune-no-cudagraphs", dynamic=False)
    since = time.time() - 1
    t0 = time.perf_counter()
    fn(first.x, first.w)
    torch.cuda.synchronize()
    row["inductor_compile_s"] = time.perf_counter() - t0
    row.update(inductor_record(cache, since))

    cands = {}  # label -> (cfg for the gate, run on the first set or None, run(i))
    cands["inductor"] = (VendorConfig(), lambda: first.out.copy_(fn(first.x, first.w)),
                         lambda i: fn(opsets[i].x, opsets[i].w))
    cands["cublas"] = (VendorConfig(), None, lambda i: opsets[i].run(VendorConfig()))
    space = [c for c in feasible_configs(p) if c.variant == "gemv"]
    for c in space + (extra_gemv_configs() if which == "wide" else []):
        cands.setdefault(c.id, (c, None, lambda i, c=c: opsets[i].run(c)))
    if which == "spec":
        kern = specialised_kernel()
        for c in spec_configs(space):
            cands["spec_" + c.id] = (c, lambda c=c: spec_run(kern, c, first),
                                     lambda i, c=c: spec_run(kern, c, opsets[i]))
    if which == "speck":
        from gemm_costmodel.kernels.gemm.space import config_from_id

        for prefix, kern in (("spec_", specialised_kernel()), ("speck_", specialised_kernel(SPECK_CONST))):
            for c in map(config_from_id, SPECK_IDS):
                cands[prefix + c.id] = (c, lambda c=c, kern=kern: spec_run(kern, c, first),
                                        lambda i, c=c, kern=kern: spec_run(kern, c, opsets[i]))
    for bn, bk, w, per in (persistent_variants() if which == "wide" else []):
        label = f"pgemv_n{bn}k{bk}_w{w}_p{per}"
        cands[label] = (VendorConfig(), lambda bn=bn, bk=bk, w=w, per=per: persistent_run(first, bn, bk, w, per, sms),
                        lambda i, bn=bn, bk=bk, w=w, per=per: persistent_run(opsets[i], bn, bk, w, per, sms))
    runs, status = {}, {}
    for label, (cfg, run_one, run_i) in cands.items():
        st, err, why = C.gate(cfg, first, ref, "bf16", run=run_one)
        status[label] = st if st == C.STATUS_OK else f"{st}: {why}"
        if st == C.STATUS_OK:
            runs[label] = run_i
    times = time_rounds(runs, timer, len(opsets), rounds)
    row["space"] = [c.id for c in space]
    row["status"] = status
    row["us"] = {label: t["us"] for label, t in times.items()}
    row["stable"] = {label: t["stable"] for label, t in times.items()}
    row["rounds_us"] = {label: t["rounds_us"] for label, t in times.items()}
    del opsets, first, ref, fn
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def report(row) -> str:
    us = row["us"]
    ind = us.get("inductor")
    space = {c: us[c] for c in row["space"] if c in us}
    best_space = min(space, key=space.get) if space else None
    others = {c: t for c, t in us.items() if c not in space and c not in ("inductor", "cublas")}
    best_other = min(others, key=others.get) if others else None
    gb = row["weight_bytes"] / 1e3
    parts = [f"{row['m']}x{row['n']}x{row['k']}: inductor {ind:.2f} us ({gb / ind:.0f} GB/s)" if ind else
             f"{row['m']}x{row['n']}x{row['k']}: inductor -"]
    if best_space:
        parts.append(f"space best {best_space} {space[best_space]:.2f}")
    if best_other:
        parts.append(f"outside best {best_other} {others[best_other]:.2f}")
    parts.append(f"cublas {us.get('cublas', float('nan')):.2f}")
    cfgs = [{k: v for k, v in b.items() if k in ("XBLOCK", "R0_BLOCK", "RBLOCK", "num_warps", "num_stages")}
            for b in row.get("best_configs", [])]
    parts.append(f"inductor configs {cfgs}")
    return "; ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="*", help="M,N,K triples (default: the peer suite's M = 1 shapes and four more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="which", default="wide", choices=["wide", "spec", "speck"],
                    help="wide: the space, knobs outside it and a persistent GEMV; spec: the space and "
                         "its configs compiled with N, K and the strides constant; speck: the space and 14 of its configs "
                         "compiled both so and with only K and the weight's stride constant")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else DEFAULT_SHAPES
    except ValueError:
        ap.error("--shapes takes M,N,K triples of integers")
    if any(len(s) != 3 or s[0] != 1 for s in shapes):
        ap.error("--shapes: M,N,K triples with M = 1 (the persistent variant is M = 1 only)")
    from gemm_costmodel.benchmarks import provenance
    from gemm_costmodel.kernels.timing import GraphTimer

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gemv_inductor.jsonl")
    done = set()
    if os.path.isfile(path):
        done = {(r["m"], r["n"], r["k"]) for r in map(json.loads, open(path)) if r}
    # A fresh Inductor cache that keeps its autotune results on disk (the peer benchmark turns
    # that cache off), so that coordinate descent's pick per kernel can be read back.
    cache = tempfile.mkdtemp(prefix="costmodel-gemv-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    import torch._inductor.config as ic

    if hasattr(ic, "fx_graph_cache"):
        ic.fx_graph_cache = False
    prov = provenance.collect(torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = prov.get("l2_bytes") or 50 * 2**20
    timer = GraphTimer()
    for s in shapes:
        if tuple(s) in done:
            continue
        row = measure(*s, timer, l2, sms, args.rounds, cache, args.which)
        row["provenance"] = prov
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        print(report(row), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
