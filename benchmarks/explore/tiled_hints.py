"""Exploration (kept as a record; issue 18's peer benchmark): why is our tiled kernel slower than
Inductor's mm template with the same config? In the deep-stages run (benchmarks/results/peers/
deep_stages/) `tiled_m64n128k128_g8_w4s4` took 19.7 us on 512x2048x4096, Inductor's template with
BLOCK 64x128x128, 4 stages, 4 warps, GROUP_M 8 took 15.9. The two differ in three ways, each a
variant here, timed side by side (GraphTimer.measure_paired) with ours and Inductor:

- ``hint``: Inductor's indexing: rows and columns wrapped with ``% M`` / ``% N`` and marked
  ``max_contiguous(multiple_of(..))``, pointers formed from indices each K step, B loaded as a
  (BLOCK_K, BLOCK_N) tile (``tl.dot(a, b)`` rather than ``tl.dot(a, tl.trans(b))``);
- ``static``: ``hint`` with M, N, K and the strides as compile-time constants (Inductor compiles
  for static shapes);
- ``staticnk``: ``static`` with M a runtime argument again (a serving engine knows N, K and the
  strides of every weight ahead of time, not M);
- ``oursnk``: our kernel's body with N, K and the strides constant, M runtime and never
  specialised;
- ours: the committed ``gemm_tiled_kernel`` (rows clamped with ``tl.where``, pointers advanced by
  BLOCK_K, M a runtime argument never specialised).

    python benchmarks/explore/tiled_hints.py --out DIR [--prefill | --persistent]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.benchmarks import peers
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.kernel_variants import constexpr_copy
from gemm_costmodel.kernels.gemm import kernel as gemm
from gemm_costmodel.kernels.common import _grouped_tile
from gemm_costmodel.kernels.gemm.space import Problem, TiledConfig

IMPORTS = "from gemm_costmodel.kernels.common import _grouped_tile, _mainloop"
# (M, N, K) and the configs (block_m, block_n, block_k, warps, stages): Inductor's picks there.
PLAN = [((512, 2048, 4096), [(64, 128, 128, 4, 4)]), ((128, 4096, 14336), [(64, 64, 128, 4, 5), (64, 64, 128, 4, 4)]),
        ((128, 2048, 4096), [(64, 64, 128, 4, 5)]), ((2048, 2048, 4096), [(128, 128, 64, 4, 3)]),
        ((256, 6144, 4096), [(64, 128, 128, 4, 4)]), ((512, 5120, 5120), [(128, 128, 64, 4, 3)])]
# --persistent: the persistent (TMA) kernel, the space's best at M >= 2048, and the same with N, K constant
PERSISTENT = [((4096, 4096, 4096), [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]),
              ((8192, 28672, 4096), [(128, 256, 64, 8, 3)]), ((16384, 4096, 14336), [(128, 256, 64, 8, 3)]),
              ((2048, 6144, 4096), [(128, 256, 64, 8, 3)]), ((512, 2048, 4096), [(64, 128, 128, 4, 4)]),
              ((512, 5120, 5120), [(128, 128, 64, 4, 4)])]
# --prefill: large-M shapes against cuBLAS, where the space's Triton configs lost to it
PREFILL = [((4096, 4096, 4096), [(128, 256, 64, 8, 3), (128, 128, 64, 4, 3)]),
           ((8192, 28672, 4096), [(128, 256, 64, 8, 3)]), ((16384, 4096, 14336), [(128, 256, 64, 8, 3)]),
           ((2048, 6144, 4096), [(128, 256, 64, 8, 3), (128, 128, 64, 4, 3)])]


@triton.jit
def _hint_body(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        ka = rk[None, :] + kt * BLOCK_K
        kb = rk[:, None] + kt * BLOCK_K
        a = tl.load(x_ptr + am[:, None] * stride_xm + ka)
        b = tl.load(w_ptr + bn[None, :] * stride_wn + kb)
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tiled_hint_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _hint_body(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit
def tiled_static_kernel(x_ptr, w_ptr, y_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                        stride_xm: tl.constexpr, stride_wn: tl.constexpr, stride_ym: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _hint_body(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit
def tiled_static_nk_kernel(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr,
                           stride_xm: tl.constexpr, stride_wn: tl.constexpr, stride_ym: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr):
    _hint_body(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


def ours_nk_launcher(cfg):
    """Our tiled kernel, N, K and the strides constant (M stays a runtime argument)."""
    # (The committed runs 1-2 and persistent run 1 used hand copies of this and the persistent
    # kernel, equal to them but for dropping the unused scale and K-tail branches.)
    kern = constexpr_copy(gemm.gemm_tiled_kernel, "M, N, K, stride_xm, stride_wn, stride_ym,",
                          "M, N: tl.constexpr, K: tl.constexpr, stride_xm: tl.constexpr, "
                          "stride_wn: tl.constexpr, stride_ym: tl.constexpr,", IMPORTS)
    bm, bn, bk, w, s = cfg

    def run(ops):
        M, N, K, out, has_scale, sa, sb = gemm.launch_args(ops.x, ops.w, ops.out, None, None)
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        kern[grid](ops.x, ops.w, out, sa, sb, M, N, K, ops.x.stride(0), ops.w.stride(0), out.stride(0),
                   HAS_SCALE=has_scale, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=K % bk == 0,
                   num_warps=w, num_stages=s)
        return out
    return run


def persistent_nk_launcher(cfg):
    """Our persistent (TMA) kernel, N and K constant, launched as gemm.launch_persistent does."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    kern = constexpr_copy(gemm.gemm_persistent_kernel, "M, N, K, NUM_PROGRAMS,",
                          "M, N: tl.constexpr, K: tl.constexpr, NUM_PROGRAMS,", IMPORTS)
    bm, bn, bk, w, s = cfg

    def run(ops):
        M, N, K, out, has_scale, sa, sb = gemm.launch_args(ops.x, ops.w, ops.out, None, None)
        programs = min(gemm.num_sms(ops.x.device.index or 0), triton.cdiv(M, bm) * triton.cdiv(N, bn))
        kern[(programs,)](
            TensorDescriptor.from_tensor(ops.x, [bm, bk]), TensorDescriptor.from_tensor(ops.w, [bn, bk]),
            TensorDescriptor.from_tensor(out, [bm, bn]), sa, sb, M, N, K, programs, HAS_SCALE=has_scale,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, FLATTEN=gemm.PERSISTENT_FLATTEN,
            num_warps=w, num_stages=s)
        return out
    return run


def launcher(kernel, cfg):
    bm, bn, bk, w, s = cfg

    def run(ops):
        M, K = ops.x.shape
        N = ops.w.shape[0]
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        kernel[grid](ops.x, ops.w, ops.out, M, N, K, ops.x.stride(0), ops.w.stride(0), ops.out.stride(0),
                     BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s)
        return ops.out
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill", action="store_true", help="the large-M shapes, cuBLAS timed beside")
    ap.add_argument("--persistent", action="store_true", help="the persistent kernel with and without N, K constant")
    args = ap.parse_args()
    plan = PERSISTENT if args.persistent else PREFILL if args.prefill else PLAN
    args.prefill = args.prefill or args.persistent
    os.makedirs(args.out, exist_ok=True)
    peers._inductor_setup(tempfile.mkdtemp(prefix="costmodel-tiled-hints-"))
    timer = timing.GraphTimer()
    rows = []
    for (m, n, k), cfgs in plan:
        p = Problem(m, n, k, "bf16")
        ops, ref = C.operand_sets(p, 11, 50 << 20)
        first = ops[0]
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w: x @ w.t(), mode="max-autotune-no-cudagraphs", dynamic=False)
        t0 = time.perf_counter()
        _, text = peers.capture_stderr(lambda: (fn(first.x, first.w), torch.cuda.synchronize()))
        pick = (peers.parse_autotune(text) or [{}])[0]
        runs = {"inductor": (lambda: first.out.copy_(fn(first.x, first.w)), lambda i: fn(ops[i].x, ops[i].w))}
        if args.prefill:
            from gemm_costmodel.kernels.gemm.space import VendorConfig
            runs["cublas"] = (lambda: first.run(VendorConfig()), lambda i: ops[i].run(VendorConfig()))
        for cfg in cfgs:
            tag = "m{}n{}k{}_w{}s{}".format(*cfg)
            if args.persistent:
                from gemm_costmodel.kernels.gemm.space import PersistentConfig
                pc = PersistentConfig(cfg[0], cfg[1], cfg[2], 8, cfg[3], cfg[4])
                go = persistent_nk_launcher(cfg)
                runs[f"pers_{tag}"] = (lambda o=pc: first.run(o), lambda i, o=pc: ops[i].run(o))
                runs[f"persnk_{tag}"] = (lambda go=go: go(first), lambda i, go=go: go(ops[i]))
                continue
            ours = TiledConfig(cfg[0], cfg[1], cfg[2], 8, cfg[3], cfg[4])
            runs[f"ours_{tag}"] = (lambda o=ours: first.run(o), lambda i, o=ours: ops[i].run(o))
            for name, go in (("hint", launcher(tiled_hint_kernel, cfg)), ("static", launcher(tiled_static_kernel, cfg)),
                             ("staticnk", launcher(tiled_static_nk_kernel, cfg)), ("oursnk", ours_nk_launcher(cfg))):
                runs[f"{name}_{tag}"] = (lambda go=go: go(first), lambda i, go=go: go(ops[i]))
        ok = {}
        for label, (one, each) in runs.items():
            st, err, detail = C.gate(TiledConfig(64, 64, 64, 8, 4, 3), first, ref, "bf16", run=one)
            rows.append({"m": m, "n": n, "k": k, "label": label, "status": st, "rel_err": err,
                         **({"error": detail[:200]} if st != "ok" else {})})
            if st == "ok":
                ok[label] = each
        got = peers.time_rounds(ok, timer, len(ops), rounds=3)
        for r in rows:
            if (r["m"], r["n"], r["k"]) == (m, n, k) and r["label"] in got:
                t = got[r["label"]]
                r.update(us=t["us"], rounds_us=t["rounds_us"], stable=t["stable"])
                if r["label"] == "inductor":
                    r.update(inductor_choice=pick.get("choice"), description=pick.get("description"),
                             compile_s=time.perf_counter() - t0)
        line = " | ".join(f"{lb} {got[lb]['us']:.1f}" for lb in got)
        print(f"{m}x{n}x{k}: {line}  (Inductor: {pick.get('description', '?')[:90]})", flush=True)
        del ops, first, ref, fn
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    name = "persistent" if args.persistent else "tiled_hints_prefill" if args.prefill else "tiled_hints"
    with open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows)} rows, {len(bad)} not ok", file=sys.stderr)


if __name__ == "__main__":
    main()
