"""Exploration (kept as a record; not in the package): can the fp8_blockscale M = 1 GEMV's best
config be made less sensitive to the weight's shape? (issue 16)

Why. Issue 16's match within 2% is missed on the M = 1 picks: the shipped GEMV's 24 configs
(`impl.fp8_blockscale_gemv_kernel`) near-tie in a shape-dependent order that a model fitted on the
training families does not carry to a held-out family (docs/decisions/046-fp8-blockscale-on-an-h200-a-gemv.md, "fp8_blockscale on an
H200"). Its order is real, not noise (the same in every run), and wide: on the 37 M = 1 evaluation
weights no single config is within 2% of the best GEMV on more than a third of them, and the best
single config is 1.10-1.15x off per-shape tuning (geomean). A kernel whose configs reach the
bandwidth floor more uniformly would be faster for every user at batch-1 decode and easier to rank.

Two changes to the shipped kernel, as constexpr switches of one kernel here (M = 1 only):

- ``PREFETCH``: the next K tile's weight load is issued before the current tile's products, so
  each thread keeps two tiles in flight (the shipped kernel runs num_stages 1: a warp waits on
  every tile's load before issuing the next, so its bytes in flight are one tile and the
  occupancy that a config's registers allow decides how close it gets to the floor).
- ``NPROG`` (persistent, > 0): a fixed grid of NPROG programs walks the row blocks (rb = pid,
  pid + NPROG, ...), so the grid's last partial wave, which depends on N / BLOCK_N against the
  SM count and occupancy, is replaced by at most one row block of imbalance per program.

Per weight, in one process: the shipped kernel's 24 configs (as `impl.launch` runs them), the same
24 with PREFETCH, and 24 persistent PREFETCH configs (BLOCK_N 1-8, BLOCK_K 512-2048, 4 warps, 4
or 8 programs per SM), each correctness-gated against the fp32 reference, then timed by the
harness's CUDA-graph timer over rotating buffers (>= 2x L2). Weights: the 37 M = 1 evaluation
weights and every third training weight of the GEMV training lists.

Results (benchmarks/results/fp8_blockscale/gemv_v2/, three H200 leases, every row ok): against the
shipped GEMV's best, PREFETCH 0.93x, persistent 0.83x, ``bits`` (e4m3 decoded by integer bit
moves) 0.73x, ``half`` (fp16 products of the raw quantised values, summed per 16 bytes, scaled per
128-wide group in fp32) 1.12-1.13x and best on all 103 weights. The kernel was bound by its
instructions per weight byte; ``half`` became the GEMV on branch gemv-f16 (docs/decisions/047-the-fp8-blockscale-gemv-s-arithmetic.md, "The
fp8_blockscale GEMV's arithmetic").

    python benchmarks/explore/fp8bs_gemv_v2.py --out DIR [--limit N] [--kinds old,half]
    python benchmarks/explore/fp8bs_gemv_v2.py --interpret-check     # CPU, TRITON_INTERPRET=1
    python benchmarks/explore/fp8bs_gemv_v2.py --summary DIR/gemv_v2.jsonl[.gz]   # CPU, one run's rows
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.fp8_blockscale.impl import _gemv_x_scaled

RES = "benchmarks/results/fp8_blockscale"


@triton.jit
def _w_tile(rows, k, K: tl.constexpr, EVEN_K: tl.constexpr):
    # The (BLOCK_N, G, 128) weight tile at K offsets k; read once, so evict-first.
    if EVEN_K:
        return tl.load(rows + k[None, :, :], eviction_policy="evict_first")
    return tl.load(rows + k[None, :, :], mask=(k < K)[None, :, :], other=0.0, eviction_policy="evict_first")


@triton.jit(do_not_specialize=["M"])
def bs_gemv2_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                    PREFETCH: tl.constexpr, NPROG: tl.constexpr, BITS: tl.constexpr, HALF: tl.constexpr):
    KG: tl.constexpr = (K + 127) // 128
    G: tl.constexpr = BLOCK_K // 128
    R: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    T: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    STEP: tl.constexpr = NPROG if NPROG > 0 else R
    pid = tl.program_id(0)
    offs_g = tl.arange(0, G)
    offs_j = tl.arange(0, 128)
    kk = offs_g[:, None] * 128 + offs_j[None, :]
    for rb in range(pid, R, STEP):
        offs_n = rb * BLOCK_N + tl.arange(0, BLOCK_N)
        # BLOCK_N divides 128: the block's rows share one row of Bs (rows past N wrap, never stored).
        bs_row = bs_ptr + (rb * BLOCK_N // 128) * KG
        w_rows = b_ptr + (offs_n % N)[:, None, None] * K
        acc = tl.zeros((BLOCK_N, G, 128), dtype=tl.float32)
        if PREFETCH:
            w_next = _w_tile(w_rows, kk, K, EVEN_K)
            for kt in range(0, T):
                w = w_next
                k1 = (kt + 1) * BLOCK_K + kk
                # The last iteration's prefetch is masked off entirely (no bytes move).
                w_next = tl.load(w_rows + k1[None, :, :], mask=((k1 < K) & (kt + 1 < T))[None, :, :], other=0.0,
                                 eviction_policy="evict_first")
                x = _gemv_x_scaled(a_ptr, as_ptr, bs_row, 0, K, KG, offs_g, offs_j, kt, BLOCK_K, EVEN_K, 128)
                acc += w.to(tl.float32) * x[None, :, :]
        elif HALF:
            # fp16 products of the raw quantised values, summed in fp16 over each thread's 16
            # contiguous bytes, then scaled per 128-wide group in fp32: about one instruction per
            # weight element (a packed e4m3x2 -> f16x2 conversion and a packed multiply-add)
            # against two and a half (conversion to fp32, then an fp32 FMA). Exactness: e4m3 has
            # 4 significant bits, so w * (a / 64) is exact in fp16; |w| <= 448 and |a / 64| <= 7
            # keep a product under 3,136 and a sum of 16 under fp16's 65,504.
            acc16 = tl.zeros((BLOCK_N, G, 8), dtype=tl.float32)
            for kt in range(0, T):
                k = kt * BLOCK_K + kk
                g = kt * G + offs_g
                w = _w_tile(w_rows, k, K, EVEN_K)
                if EVEN_K:
                    av = tl.load(a_ptr + k)
                    s = tl.load(as_ptr + g) * tl.load(bs_row + g)
                else:
                    av = tl.load(a_ptr + k, mask=k < K, other=0.0)
                    s = tl.load(as_ptr + g, mask=g < KG, other=0.0) * tl.load(bs_row + g, mask=g < KG, other=0.0)
                p = w.to(tl.float16) * (av.to(tl.float16) * 0.015625)[None, :, :]
                q = tl.sum(tl.reshape(p, (BLOCK_N, G, 8, 16)), axis=3)
                acc16 += q.to(tl.float32) * (s * 64.0)[None, :, None]
        elif BITS:
            # e4m3 -> fp32 by moving the bits: sign to bit 31, exponent and mantissa shifted into
            # fp32's fields (the fp32 value is then the e4m3 value times 2^-120, subnormals
            # included; code 0x7F, NaN in e4m3, never occurs in quantised data). Integer ops
            # instead of the two conversions per element (e4m3x2 -> f16x2 -> f32). The 2^120 is
            # applied as 2^64 on the token row and 2^56 on the sum, so nothing leaves fp32's range.
            wb_rows = w_rows.to(tl.pointer_type(tl.uint8))
            for kt in range(0, T):
                k = kt * BLOCK_K + kk
                if EVEN_K:  # a byte tile: other=0, not _w_tile's float 0.0
                    wi = tl.load(wb_rows + k[None, :, :], eviction_policy="evict_first")
                else:
                    wi = tl.load(wb_rows + k[None, :, :], mask=(k < K)[None, :, :], other=0,
                                 eviction_policy="evict_first")
                wi = wi.to(tl.uint32)
                wf = (((wi & 0x7F) << 20) | ((wi & 0x80) << 24)).to(tl.float32, bitcast=True)
                x = _gemv_x_scaled(a_ptr, as_ptr, bs_row, 0, K, KG, offs_g, offs_j, kt, BLOCK_K, EVEN_K, 128)
                acc += wf * (x * 18446744073709551616.0)[None, :, :]
        else:
            for kt in range(0, T):
                w = _w_tile(w_rows, kt * BLOCK_K + kk, K, EVEN_K)
                x = _gemv_x_scaled(a_ptr, as_ptr, bs_row, 0, K, KG, offs_g, offs_j, kt, BLOCK_K, EVEN_K, 128)
                acc += w.to(tl.float32) * x[None, :, :]
        if HALF:
            y = tl.sum(tl.sum(acc16, axis=2), axis=1)
        else:
            y = tl.sum(tl.sum(acc, axis=2), axis=1)
        if BITS:
            y = y * 72057594037927936.0
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


# (kind, BLOCK_N, BLOCK_K, num_warps, programs per SM); kind "old" is the shipped kernel.
_BN, _BK = (1, 2, 4, 8), (512, 1024, 2048)
_GRIDS = {"old": [(bn, bk, w, 0) for bn, bk, w in itertools.product(_BN, _BK, (4, 8))],
          "pf": [(bn, bk, w, 0) for bn, bk, w in itertools.product(_BN, _BK, (4, 8))],
          "persist": [(bn, bk, 4, p) for bn, bk, p in itertools.product(_BN, _BK, (4, 8))],
          "bits": [(bn, bk, w, 0) for bn, bk, w in itertools.product(_BN, _BK, (4, 8))],
          "half": [(bn, bk, w, 0) for bn, bk, w in itertools.product(_BN, _BK, (4, 8))]}


def configs(kinds) -> list[tuple]:
    return [(kind, *c) for kind in kinds for c in _GRIDS[kind]]


def config_id(c) -> str:
    kind, bn, bk, w, p = c
    if kind == "old":
        return f"bsgemv_n{bn}k{bk}_w{w}"
    return f"{kind}_n{bn}k{bk}_w{w}" + (f"_p{p}" if p else "")


def feasible(c, k: int) -> bool:
    # The shipped space's K-tile rule (space.GEMV_K_TILE_SLACK): a tile at most twice K.
    return c[2] <= 2 * k


def launch(c, a, b, as_, bs, out, sms: int):
    from gemm_costmodel.kernels.fp8_blockscale import impl, space

    kind, bn, bk, w, p = c
    if kind == "old":
        return impl.launch(space.BsGemvConfig(bn, bk, w), a, b, as_, bs, out)
    n, k = b.shape
    r = triton.cdiv(n, bn)
    grid = (min(r, p * sms),) if p else (r,)
    bs_gemv2_kernel[grid](a, b, as_, bs, out, a.shape[0], n, k, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0,
                          PREFETCH=kind in ("pf", "persist"), NPROG=grid[0] if p else 0, BITS=kind == "bits",
                          HALF=kind == "half",
                          num_warps=w, num_stages=1)
    return out


def _warm(tasks) -> int:
    # Compile without launching (N, K and the grid are constexprs: tiny operands carry the dtypes).
    from gemm_costmodel.kernels.fp8_blockscale import impl

    t = torch.zeros(64, dtype=torch.float8_e4m3fn, device="cuda")
    f = torch.zeros(64, dtype=torch.float32, device="cuda")
    y = torch.zeros(64, dtype=torch.bfloat16, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k, (kind, bn, bk, w, p) in tasks:
        try:
            if kind == "old":
                impl.fp8_blockscale_gemv_kernel.warmup(t, t, f, f, y, 1, n, k, BLOCK_N=bn, BLOCK_K=bk,
                                                       EVEN_K=k % bk == 0, GROUP_N=128, GROUP_K=128,
                                                       num_warps=w, num_stages=1, grid=(1,))
            else:
                r = -(-n // bn)
                bs_gemv2_kernel.warmup(t, t, f, f, y, 1, n, k, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0,
                                       PREFETCH=kind in ("pf", "persist"), NPROG=min(r, p * sms) if p else 0,
                                       BITS=kind == "bits", HALF=kind == "half", num_warps=w, num_stages=1,
                                       grid=(1,))
        except Exception as exc:  # noqa: BLE001 - the timing loop meets it again and records it
            print("warmup failed", n, k, kind, bn, bk, w, p, type(exc).__name__, str(exc)[:200], flush=True)
    return len(tasks)


def precompile(tasks, workers: int) -> None:
    import multiprocessing as mp

    t0 = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_warm, [tasks[i::workers] for i in range(workers)]))
    print(f"precompiled {done} kernels in {time.time() - t0:.0f} s", flush=True)


def weights(limit: int | None) -> list[tuple[int, int, str]]:
    import pandas as pd

    ev = pd.read_csv(f"{RES}/gemv_eval_shapes.csv")
    tr = pd.concat([pd.read_csv(f"{RES}/gemv_train_shapes.csv"), pd.read_csv(f"{RES}/gemv_train_shapes2.csv")])
    tr = tr.drop_duplicates(["N", "K"]).sort_values(["K", "N"]).iloc[::3]
    out = [(int(r.N), int(r.K), "eval") for r in ev.itertuples()] + [(int(r.N), int(r.K), "train") for r in tr.itertuples()]
    return out[:limit] if limit else out


def interpret_check() -> int:
    """CPU (TRITON_INTERPRET=1) check of the new kernel on fp16 operands: odd N and K tails."""
    from gemm_costmodel.kernels.fp8_blockscale import impl, space

    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for (n, k), c in itertools.product([(200, 640), (130, 1000), (64, 384), (257, 2048)],
                                       [("pf", 1, 512, 4, 0), ("pf", 4, 1024, 4, 0), ("persist", 2, 512, 4, 1),
                                        ("persist", 8, 512, 4, 1), ("bits", 2, 512, 4, 0), ("bits", 8, 1024, 4, 0),
                                        ("half", 1, 512, 4, 0), ("half", 4, 1024, 8, 0)]):
        # The bit decode reads e4m3 bytes: fp8 operands (no tl.dot here, so the interpreter is exact).
        dt = "fp8" if c[0] in ("bits", "half") else "fp16"
        ops = impl.make_operands(space.Problem(1, n, k, dt), "cpu", gen)
        # sms = 3 on the CPU: a persistent grid of 3 programs walks several row blocks each.
        y = launch(c, ops.a, ops.b, ops.as_, ops.bs, ops.out, sms=3)
        ref = impl.reference(ops)
        err = float((y.float() - ref).norm() / ref.norm())
        # As a share of the dtype's bound (fp8's output is bf16, fp16's is fp16).
        worst = max(worst, err / impl.ERROR_BOUNDS[dt])
        print(n, k, config_id(c), f"{err:.2e}")
    print("worst, as a share of the bound:", worst)
    return 0 if worst < 1 else 1


def measure(out_dir: str, limit: int | None, workers: int, kinds) -> int:
    from gemm_costmodel.benchmarks import correctness
    from gemm_costmodel.kernels.timing import GraphTimer, copies_for
    from gemm_costmodel.kernels.fp8_blockscale import impl, space

    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    prov = {"gpu": props.name, "gpu_uuid": str(getattr(props, "uuid", "")), "sm_count": sms,
            "torch": torch.__version__, "triton": triton.__version__}
    ws = weights(limit)
    CONFIGS = configs(kinds)
    precompile([(n, k, c) for n, k, _ in ws for c in CONFIGS if feasible(c, k)], workers)
    timer = GraphTimer()
    gen = torch.Generator(device=dev).manual_seed(0)
    fh = open(os.path.join(out_dir, "gemv_v2.jsonl"), "w", encoding="utf-8")
    for i, (n, k, role) in enumerate(ws):
        t0 = time.time()
        prob = space.Problem(1, n, k, "fp8")
        probe = impl.make_operands(prob, dev, gen)
        copies = [probe] + [impl.make_operands(prob, dev, gen) for _ in range(copies_for(probe.nbytes, l2) - 1)]
        ref = impl.reference(probe)
        for c in CONFIGS:
            if not feasible(c, k):
                continue
            rec = {"n": n, "k": k, "role": role, "config": config_id(c), "kind": c[0], "block_n": c[1],
                   "block_k": c[2], "num_warps": c[3], "per_sm": c[4], **prov}
            fn = (lambda c: lambda j: launch(c, copies[j].a, copies[j].b, copies[j].as_, copies[j].bs,
                                             copies[j].out, sms))(c)
            status, err, why = correctness.gate(None, probe, ref, "fp8", run=lambda: fn(0))
            rec.update(status=status, rel_err=err, error=why)
            if status == correctness.STATUS_OK:
                t = timer.measure(fn, len(copies))
                rec.update(p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable,
                           tb_s=n * k / t.p50_us / 1e6)
            fh.write(json.dumps(rec) + "\n")
        fh.flush()
        del copies, probe, ref
        torch.cuda.empty_cache()
        print(f"{i + 1}/{len(ws)} 1x{n}x{k} {time.time() - t0:.1f} s, reserved "
              f"{torch.cuda.memory_reserved() / 2**20:.0f} MB", flush=True)
    fh.close()
    return 0


def summary(path: str) -> int:
    import numpy as np
    import pandas as pd

    # One run's rows (compare within one run only).
    d = pd.read_json(path, lines=True)
    print("statuses:", d.status.value_counts().to_dict())
    d = d[d.status == "ok"]
    t = d.pivot_table(index=["role", "n", "k"], columns="config", values="p50_us")
    kinds = {c: ("old" if c.startswith("bsgemv") else c.split("_")[0]) for c in t.columns}
    have = sorted(set(kinds.values()))
    fams = {**{k: [k] for k in have}, "all": have}
    allbest = t.min(axis=1)
    for role in ("eval", "train"):
        tr = t.loc[role]
        print(f"\n{role}: {len(tr)} weights")
        print("family | best vs old best (geomean) | best static: config, geomean off family best, "
              "within 2% | configs within 2% per weight (median)")
        for name, ks in fams.items():
            cols = [c for c in tr.columns if kinds[c] in ks]
            fb = tr[cols].min(axis=1)
            oldb = tr[[c for c in tr.columns if kinds[c] == "old"]].min(axis=1)
            r = tr[cols].div(fb, axis=0)
            geo = np.exp(np.log(r).mean()).sort_values()
            within = (r <= 1.02).mean()
            print(f"{name} | {np.exp(np.log(oldb / fb).mean()):.4f} | {geo.index[0]} {geo.iloc[0]:.4f} "
                  f"{within[geo.index[0]]:.2f} (most within 2%: {within.idxmax()} {within.max():.2f}) | "
                  f"{(r <= 1.02).sum(axis=1).median():.0f}")
        print("best config per weight (all):", tr.idxmin(axis=1).map(kinds).value_counts().to_dict())
    del allbest
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--kinds", default="old,pf,persist", help="of " + ",".join(_GRIDS))
    ap.add_argument("--interpret-check", action="store_true")
    ap.add_argument("--summary")
    args = ap.parse_args()
    if args.interpret_check:
        return interpret_check()
    if args.summary:
        return summary(args.summary)
    return measure(args.out, args.limit, args.workers, args.kinds.split(","))


if __name__ == "__main__":
    raise SystemExit(main())
