"""Exploration (kept as a record): can the MoE decode GEMV (impl.moe_gemv_*_kernel) be made faster
and less sensitive to its config, so the model's M = 1 pick cannot land 10-17% off? (issue 17:
the balanced worst cases are all M = 1 GEMV picks.)

Two changes, each timed beside the committed kernel with the same (block_n, block_k, warps):
- ``s<N>``: the committed kernels launched with num_stages N > 1 (Triton may pipeline the K loop's
  weight loads through shared memory: more bytes in flight per SM);
- ``unroll``: the down kernel with top_k a constexpr and the expert loop unrolled inside the K loop
  (``tl.static_range``): the committed kernel walks its token's top_k experts one after the other,
  so at M = 1 the grid is only N / block_n programs, each with one expert's tile in flight.

Problems: the M = 1 stage shapes of the evaluation and vLLM-tuned suites, and a seeded sample of the
training ones, bf16 and fp8. Every candidate is gated against the fp32 reference, then timed with
the harness's graph timer over its rotating expert-shifted copies, one problem's candidates in one
process, order rotated over ROUNDS rounds (median). Compiles are warmed first in worker processes.

    python benchmarks/explore/moe_gemv_v2.py --out DIR [--train 24] [--workers 8]

The committed kernels have since adopted ``--spec`` (N, K and the strides constant), so "committed"
in a run made now means the per-weight-shape kernels, and ``--spec`` stops with constexpr_copy's
error (the run-time signature it rewrites is gone). Results: benchmarks/results/moe/gemv_v2/, from
runs before the change. Since the fp8 quantisation in the committed GEMV multiplies by the scale's
reciprocal (moe_gemv_fp8down.py), the variants here pass _gemv_x the reciprocal too; their runs
above divided.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import time

import torch
import triton
import triton.language as tl

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import impl
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.kernels.moe import suites as SU
from gemm_costmodel.kernels.moe.impl import _gemv_w, _gemv_x

ROUNDS = 3
STAGES = (1, 3)
DOWN_KINDS = ("unroll",)
DOWN_ONLY = False
PEEL = False
SPEC = False


@triton.jit(do_not_specialize=["num_n"])
def down_unrolled_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N, K, num_n,
                         stride_xm, stride_we, stride_wn, stride_om,
                         TOP_K: tl.constexpr, HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr,
                         EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """moe_gemv_down_kernel with the top_k experts unrolled inside each K step."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_scale = 1.0
    if QUANT_X:
        a_scale = 1.0 / tl.load(a_scale_ptr)  # _gemv_x takes the reciprocal since it multiplies
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        for j in tl.static_range(TOP_K):
            p = t * TOP_K + j
            e = tl.load(ids_ptr + p).to(tl.int64)
            wt = tl.load(tw_ptr + p).to(tl.float32)
            if HAS_SCALE:
                wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
            w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
            x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_scale, QUANT_X, EVEN_K) * wt
            acc += _gemv_w(w_rows, offs_k, K, EVEN_K) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit(do_not_specialize=["num_n"])
def down_const_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N, K, num_n,
                      stride_xm, stride_we, stride_wn, stride_om,
                      TOP_K: tl.constexpr, K_OUTER: tl.constexpr, HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr,
                      EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """moe_gemv_down_kernel with top_k a constexpr (a known trip count, the loops not unrolled);
    K_OUTER: the K loop outside the expert loop."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_scale = 1.0
    if QUANT_X:
        a_scale = 1.0 / tl.load(a_scale_ptr)  # _gemv_x takes the reciprocal since it multiplies
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if K_OUTER:
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            for j in range(0, TOP_K):
                p = t * TOP_K + j
                e = tl.load(ids_ptr + p).to(tl.int64)
                wt = tl.load(tw_ptr + p).to(tl.float32)
                if HAS_SCALE:
                    wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
                w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
                x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_scale, QUANT_X, EVEN_K) * wt
                acc += _gemv_w(w_rows, offs_k, K, EVEN_K) * x[None, :]
    else:
        for j in range(0, TOP_K):
            p = t * TOP_K + j
            e = tl.load(ids_ptr + p).to(tl.int64)
            wt = tl.load(tw_ptr + p).to(tl.float32)
            if HAS_SCALE:
                wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
            w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
            for kt in range(0, tl.cdiv(K, BLOCK_K)):
                offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
                x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_scale, QUANT_X, EVEN_K) * wt
                acc += _gemv_w(w_rows, offs_k, K, EVEN_K) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def gate_up_peel_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, a_scale_ptr, w_scale_ptr, I, K, num_n, top_k,
                        stride_xm, stride_we, stride_wn, stride_om,
                        HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr, EVEN_K: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """moe_gemv_gate_up_kernel with the K loop over whole tiles unmasked and the partial last tile
    peeled off (the committed kernel masks every tile when K % BLOCK_K != 0)."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    p = (pid // num_n).to(tl.int64)
    e = tl.load(ids_ptr + p).to(tl.int64)
    t = p // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < I, offs_n, 0)
    g_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
    u_rows = g_rows + I * stride_wn
    a_scale = 1.0
    if QUANT_X:
        a_scale = 1.0 / tl.load(a_scale_ptr)  # _gemv_x takes the reciprocal since it multiplies
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(0, K // BLOCK_K):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _gemv_x(x_ptr, t, stride_xm, offs_k, K, a_scale, QUANT_X, True)[None, :]
        acc_g += _gemv_w(g_rows, offs_k, K, True) * x
        acc_u += _gemv_w(u_rows, offs_k, K, True) * x
    if not EVEN_K:
        offs_k = (K // BLOCK_K) * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _gemv_x(x_ptr, t, stride_xm, offs_k, K, a_scale, QUANT_X, False)[None, :]
        acc_g += _gemv_w(g_rows, offs_k, K, False) * x
        acc_u += _gemv_w(u_rows, offs_k, K, False) * x
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    if HAS_SCALE:
        s = tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e)
        g = g * s
        u = u * s
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + p * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < I)


@triton.jit(do_not_specialize=["num_n", "top_k"])
def down_peel_kernel(x_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, a_scale_ptr, w_scale_ptr, N, K, num_n, top_k,
                     stride_xm, stride_we, stride_wn, stride_om,
                     HAS_SCALE: tl.constexpr, QUANT_X: tl.constexpr, EVEN_K: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """moe_gemv_down_kernel with the partial last K tile peeled off, as gate_up_peel_kernel."""
    pid = tl.program_id(0)
    pid_n = pid % num_n
    t = (pid // num_n).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    a_scale = 1.0
    if QUANT_X:
        a_scale = 1.0 / tl.load(a_scale_ptr)  # _gemv_x takes the reciprocal since it multiplies
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        if HAS_SCALE:
            wt = wt * (tl.load(a_scale_ptr) * tl.load(w_scale_ptr + e))
        w_rows = w_ptr + e * stride_we + rn[:, None] * stride_wn
        for kt in range(0, K // BLOCK_K):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_scale, QUANT_X, True) * wt
            acc += _gemv_w(w_rows, offs_k, K, True) * x[None, :]
        if not EVEN_K:
            offs_k = (K // BLOCK_K) * BLOCK_K + tl.arange(0, BLOCK_K)
            x = _gemv_x(x_ptr, p, stride_xm, offs_k, K, a_scale, QUANT_X, False) * wt
            acc += _gemv_w(w_rows, offs_k, K, False) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


_GU_RT = ("I, K, num_n, top_k,\n                            stride_xm, stride_we, stride_wn, stride_om,")
_GU_CONST = ("I: tl.constexpr, K: tl.constexpr, num_n, top_k,\n                            stride_xm: tl.constexpr, "
             "stride_we: tl.constexpr, stride_wn: tl.constexpr, stride_om: tl.constexpr,")
_DN_RT = ("N, K, num_n, top_k,\n                         stride_xm, stride_we, stride_wn, stride_om,")
_DN_CONST = ("N: tl.constexpr, K: tl.constexpr, num_n, top_k,\n                         stride_xm: tl.constexpr, "
             "stride_we: tl.constexpr, stride_wn: tl.constexpr, stride_om: tl.constexpr,")
_SPEC = {}


def spec_kernel(stage: str):
    """The committed GEMV kernel of ``stage`` compiled with N (gate_up: I), K and the strides as
    constants, as the dense GEMV is (kernels/gemm_gemv.py): one compile per weight shape."""
    if stage not in _SPEC:
        from gemm_costmodel.benchmarks.kernel_variants import constexpr_copy
        imports = "from gemm_costmodel.kernels.moe.impl import _gemv_w, _gemv_x"
        if stage == "gate_up":
            _SPEC[stage] = constexpr_copy(impl.moe_gemv_gate_up_kernel, _GU_RT, _GU_CONST, imports)
        else:
            _SPEC[stage] = constexpr_copy(impl.moe_gemv_down_kernel, _DN_RT, _DN_CONST, imports)
    return _SPEC[stage]


def launch(kind: str, cfg: S.MoeGemvConfig, stages: int, ops: impl.Operands):
    """One stage of ``ops`` with the committed kernels at ``stages`` (kind 'cur') or the unrolled
    down kernel ('unroll')."""
    x, w, ids2, tw, out = ops.x, ops.w, ops.topk_ids, ops.topk_weights, ops.out
    E, N, K = w.shape
    top_k = ids2.shape[1]
    ids = ids2.reshape(-1)
    fp8 = impl.dtype_name(w) == "fp8"
    quant = fp8 and x.dtype != torch.float8_e4m3fn
    scales = (ops.a_scale if fp8 else x, ops.w_scale if fp8 else x)
    common = dict(HAS_SCALE=fp8, QUANT_X=quant, EVEN_K=K % cfg.block_k == 0, BLOCK_N=cfg.block_n,
                  BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=stages)
    if ops.stage == "gate_up":
        assert kind in ("cur", "peel", "spec")
        i = N // 2
        num_n = triton.cdiv(i, cfg.block_n)
        kernel = {"peel": gate_up_peel_kernel, "spec": spec_kernel("gate_up") if kind == "spec" else None
                  }.get(kind, impl.moe_gemv_gate_up_kernel)
        kernel[(num_n * ids.numel(),)](
            x, w, out, ids, *scales, i, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
            **common)
        return out
    num_n = triton.cdiv(N, cfg.block_n)
    grid = (num_n * ids2.shape[0],)
    if kind == "cur":
        impl.moe_gemv_down_kernel[grid](
            x, w, out, ids, tw, *scales, N, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), **common)
    elif kind == "spec":
        spec_kernel("down")[grid](
            x, w, out, ids, tw, *scales, N, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), **common)
    elif kind == "peel":
        down_peel_kernel[grid](
            x, w, out, ids, tw, *scales, N, K, num_n, top_k, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), **common)
    elif kind in ("const", "kouter"):
        down_const_kernel[grid](
            x, w, out, ids, tw, *scales, N, K, num_n, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), TOP_K=top_k, K_OUTER=kind == "kouter", **common)
    else:
        down_unrolled_kernel[grid](
            x, w, out, ids, tw, *scales, N, K, num_n, x.stride(0), w.stride(0), w.stride(1),
            out.stride(0), TOP_K=top_k, **common)
    return out


def candidates(prob: S.Problem) -> list[tuple[str, S.MoeGemvConfig, int]]:
    """(label, config, stages) of every variant to time on ``prob`` (the space's feasibility rules
    for the GEMV apply to all of them)."""
    out = []
    for cfg in S.feasible_configs(prob, include_vendor=False):
        if not isinstance(cfg, S.MoeGemvConfig):
            continue
        for st in STAGES:
            if prob.stage == "down" or not DOWN_ONLY:
                out.append((f"{cfg.id}:s{st}", cfg, st))
            if prob.stage == "down":
                for kind in DOWN_KINDS:
                    out.append((f"{cfg.id}:{kind}:s{st}", cfg, st))
            if PEEL and (prob.stage == "down" or not DOWN_ONLY) and "peel" not in DOWN_KINDS:
                out.append((f"{cfg.id}:peel:s{st}", cfg, st))
            if SPEC and (prob.stage == "down" or not DOWN_ONLY) and "spec" not in DOWN_KINDS:
                out.append((f"{cfg.id}:spec:s{st}", cfg, st))
    return out


def problems(n_train: int, seed: int = 0) -> list[S.Problem]:
    out = []
    for dt in ("bf16", "fp8"):
        seen = set()
        for s in SU.eval_suite(dt) + SU.vllm_suite(dt):
            if s.m == 1:
                p = S.Problem(s.m, s.n, s.k, dt, s.e, s.top_k, s.stage, s.routing)
                if p not in seen:
                    seen.add(p)
                    out.append(("eval", p))
        train = [s for s in SU.training_suite(dt) if s.m == 1]
        random.Random(seed).shuffle(train)
        for s in train[:n_train]:
            out.append(("train", S.Problem(s.m, s.n, s.k, dt, s.e, s.top_k, s.stage, s.routing)))
    return out


def _label_kind(label: str) -> str:
    parts = label.split(":")
    return parts[1] if len(parts) == 3 else "cur"


def _init(stages, kinds, down_only, peel, spec):
    global STAGES, DOWN_KINDS, DOWN_ONLY, PEEL, SPEC
    STAGES, DOWN_KINDS, DOWN_ONLY, PEEL, SPEC = stages, kinds, down_only, peel, spec


def _warm(prob: S.Problem) -> int:
    """Worker: compile every candidate of ``prob`` into Triton's disk cache (errors ignored: the
    measuring process meets them again and records them)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ops = impl.make_operands(prob, "cuda", gen)
    n = 0
    for label, cfg, st in candidates(prob):
        try:
            launch(_label_kind(label), cfg, st, ops)
            n += 1
        except Exception:  # noqa: BLE001
            pass
    torch.cuda.synchronize()
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=24, help="training M = 1 stage shapes per dtype")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--stages", default="1,3", help="num_stages values, comma-separated")
    ap.add_argument("--down-kinds", default="unroll", help="down-kernel variants: unroll, const, kouter")
    ap.add_argument("--down-only", action="store_true", help="time only the down stage")
    ap.add_argument("--peel", action="store_true", help="also time both stages with the partial last K tile peeled")
    ap.add_argument("--spec", action="store_true", help="also time both stages compiled per weight shape")
    ap.add_argument("--uneven-first", action="store_true",
                    help="problems whose K some GEMV K tile does not divide first")
    args = ap.parse_args()
    global STAGES, DOWN_KINDS, DOWN_ONLY, PEEL, SPEC
    PEEL, SPEC = args.peel, args.spec
    STAGES = tuple(int(v) for v in args.stages.split(","))
    DOWN_KINDS = tuple(args.down_kinds.split(",")) if args.down_kinds else ()
    DOWN_ONLY = args.down_only
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_gemv_v2.jsonl")
    done = set()
    if os.path.exists(path):
        with open(path) as fh:
            done = {json.loads(line)["problem"] for line in fh if line.strip()}
    probs = [(s, p) for s, p in problems(args.train) if repr(p) not in done and (p.stage == "down" or not DOWN_ONLY)]
    if args.uneven_first:
        probs.sort(key=lambda sp: sp[1].k % S.GEMV_MIN_BLOCK_K == 0)
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=_init, initargs=(STAGES, DOWN_KINDS, DOWN_ONLY, PEEL, SPEC)) as pool:
        compiled = sum(pool.map(_warm, [p for _, p in probs], chunksize=1))
    print(f"warmed {compiled} launches over {len(probs)} problems in {time.perf_counter() - t0:.0f}s", flush=True)
    timer = GraphTimer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gpu = torch.cuda.get_device_name(0)
    for suite, prob in probs:
        t1 = time.perf_counter()
        sets, ref = C.operand_sets(prob, 0, l2, "cuda", "moe")
        cands = candidates(prob)
        status, times = {}, {}
        for label, cfg, st in cands:
            s, err, why = C.gate(cfg, sets[0], ref, prob.dtype, run=lambda: launch(_label_kind(label), cfg, st, sets[0]),
                                 bounds=impl.ERROR_BOUNDS)
            status[label] = s if s == "ok" else f"{s}: {why}"
            if s == "ok":
                times[label] = []
        ok = list(times)
        for r in range(ROUNDS):
            for label in ok[r % len(ok):] + ok[:r % len(ok)]:
                _, cfg, st = next(c for c in cands if c[0] == label)
                t = timer.measure(lambda i, c=cfg, s_=st, lb=label: launch(_label_kind(lb), c, s_, sets[i]),
                                  len(sets), key=label)
                times[label].append(t.p50_us)
        p50 = {k: statistics.median(v) for k, v in times.items()}
        row = {"problem": repr(prob), "suite": suite, "gpu": gpu, "m": prob.m, "n": prob.n, "k": prob.k,
               "dtype": prob.dtype, "e": prob.e, "top_k": prob.top_k, "stage": prob.stage,
               "routing": prob.routing, "n_copies": len(sets), "status": status, "rounds_us": times, "p50_us": p50,
               "mem_gb": torch.cuda.max_memory_allocated() / 2**30, "seconds": time.perf_counter() - t1}
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        sets = ref = None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cur = {k: v for k, v in p50.items() if k.count(":") == 1 and k.endswith(":s1")}
        best_cur, best = min(cur.values()), min(p50.values())
        print(f"{suite} {prob.dtype} {prob.stage} {prob.n}x{prob.k} e{prob.e}k{prob.top_k}: committed best "
              f"{best_cur:.2f} us, all best {best:.2f} ({min(p50, key=p50.get)}) gain {best_cur / best:.3f}; "
              f"{sum(1 for s in status.values() if s != 'ok')} failed; {time.perf_counter() - t1:.1f}s", flush=True)


if __name__ == "__main__":
    main()
