"""Does a persistent / TMA variant pay for the fp8 block-scale GEMM at large M on Hopper? (issue 16)

On the 37 evaluation shapes with M >= 2048 the space's best Triton config (vLLM's kernel:
pointer loads, one tile per program) reaches at most ~780 TFLOP/s and is 1.10-1.82x slower than
blockwise ``torch._scaled_mm`` where that runs; where it does not (K % 512 != 0, M % 4 != 0) the
Triton kernel is all there is. This times, in one process on one GPU, per shape: the 4 best
tiled configs of the committed evaluation run, vLLM's default, the vendor where it runs, and a
TMA kernel (descriptors for A, B and y; the scales through pointers, applied per K tile as vLLM
does) launched persistent (one program per SM striding over the tiles) or one tile per program.
Every candidate is correctness-gated against the fp32 reference first.

    python benchmarks/explore/fp8bs_persistent.py --out DIR
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.common import _grouped_tile


@triton.jit(do_not_specialize=["M", "NUM_PROGRAMS"])
def bs_tma_kernel(a_desc, b_desc, y_desc, as_ptr, bs_ptr, M, N, K, stride_asm, stride_bsn, NUM_PROGRAMS,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.where(offs_m < M, offs_m, 0)
        rn = tl.where(offs_n < N, offs_n, 0)
        as_rows = as_ptr + rm * stride_asm
        bs_rows = bs_ptr + (rn // GROUP_N) * stride_bsn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # TMA zero-fills out-of-bounds boxes: the K tail adds zeros.
        for kt in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            kg = kt * BLOCK_K // GROUP_K
            a_s = tl.load(as_rows + kg)
            b_s = tl.load(bs_rows + kg)
            acc += tl.dot(a, b.T) * a_s[:, None] * b_s[None, :]
        y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y_desc.dtype))


TMA_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
    (128, 128, 128, 8, 8, 3), (128, 128, 128, 8, 8, 4), (128, 128, 128, 8, 4, 3), (64, 128, 128, 8, 4, 4),
    (128, 256, 64, 8, 8, 4), (128, 256, 128, 8, 8, 3), (256, 128, 64, 8, 8, 4), (128, 128, 64, 8, 8, 5),
]


def launch_tma(cfg, a, b, as_, bs, out, persistent: bool, flatten: bool = True):
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, gm, w, s = cfg
    M, K = a.shape
    N = b.shape[0]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(torch.cuda.get_device_properties(a.device).multi_processor_count, tiles) if persistent else tiles
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    b_d = TensorDescriptor.from_tensor(b, [bn, bk])
    y_d = TensorDescriptor.from_tensor(out, [bm, bn])
    bs_tma_kernel[(programs,)](a_d, b_d, y_d, as_, bs, M, N, K, as_.stride(0), bs.stride(0), programs,
                               BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, GROUP_N=128, GROUP_K=128,
                               FLATTEN=flatten and persistent, num_warps=w, num_stages=s)
    return out


SHAPES = [(4096, 7168, 2304), (4096, 7168, 1152), (2048, 4608, 2304), (2048, 5120, 8960), (4096, 7168, 128),
          (4096, 7168, 2048), (4096, 4096, 7168), (2048, 7168, 10240), (4096, 24576, 1536), (8192, 7168, 2304)]


def main() -> int:
    import pandas as pd

    from gemm_costmodel.kernels.timing import GraphTimer, copies_for
    from gemm_costmodel.kernels.fp8_blockscale import impl, space

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    df = pd.concat(pd.read_parquet(f, columns=["m", "n", "k", "candidate", "status", "p50_us"])
                   for f in glob.glob("datasets/fp8_blockscale/fp8/*eval*.parquet"))
    df = df[(df.status == "ok") & (df.candidate != "cublas")]
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    timer = GraphTimer()
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    fh = open(os.path.join(args.out, "fp8bs_persistent.jsonl"), "w", encoding="utf-8")
    for m, n, k in SHAPES:
        prob = space.Problem(m, n, k, "fp8")
        probe = impl.make_operands(prob, dev, gen)
        ncop = copies_for(probe.nbytes, l2)
        copies = [probe] + [impl.make_operands(prob, dev, gen) for _ in range(ncop - 1)]
        ref = impl.reference(probe)
        known = df[(df.m == m) & (df.n == n) & (df.k == k)].groupby("candidate").p50_us.median().sort_values()
        cands = [("space", c) for c in list(known.index[:4])]
        if space.vllm_default().id not in [c for _, c in cands]:
            cands.append(("space", space.vllm_default().id))
        if m % 4 == 0 and k % 512 == 0 and n % 16 == 0:
            cands.append(("space", "cublas"))
        cands += [("tma_persistent", c) for c in TMA_CONFIGS] + [("tma_tile", c) for c in TMA_CONFIGS[:4]]
        for kind, c in cands:
            rec = {"m": m, "n": n, "k": k, "kind": kind, "config": c if isinstance(c, str) else "_".join(map(str, c)),
                   "gpu": props.name, "prev_run_p50_us": float(known.get(c, float("nan"))) if kind == "space" else None}
            try:
                if kind == "space":
                    cfg = space.config_from_id(c) if hasattr(space, "config_from_id") else None
                    fn = (lambda cfg: lambda i: impl.launch(cfg, copies[i].a, copies[i].b, copies[i].as_, copies[i].bs,
                                                            copies[i].out))(cfg)
                else:
                    fn = (lambda c, p: lambda i: launch_tma(c, copies[i].a, copies[i].b, copies[i].as_, copies[i].bs,
                                                            copies[i].out, p))(c, kind == "tma_persistent")
                probe.out.zero_()
                y = fn(0)
                torch.cuda.synchronize()
                err = float((y.float() - ref).norm() / ref.norm())
                rec["rel_err"] = err
                if not err <= impl.ERROR_BOUNDS["fp8"]:
                    rec["status"] = "wrong"
                else:
                    t = timer.measure(fn, len(copies))
                    rec.update(status="ok", p20_us=t.p20_us, p50_us=t.p50_us, p80_us=t.p80_us, stable=t.stable,
                               tflops=2 * m * n * k / t.p50_us / 1e6)
            except Exception as exc:  # noqa: BLE001 - recorded as the row's status
                rec.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:200]}")
            rows.append(rec)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(json.dumps({k_: rec.get(k_) for k_ in ("m", "n", "k", "kind", "config", "status", "p50_us", "tflops")}),
                  flush=True)
        del copies, probe, ref
        torch.cuda.empty_cache()
    # Summary per shape: best of the space (tiled, default, vendor) vs best TMA.
    out = []
    for (m, n, k) in SHAPES:
        r = [x for x in rows if (x["m"], x["n"], x["k"]) == (m, n, k) and x.get("status") == "ok"]
        tiled = [x["p50_us"] for x in r if x["kind"] == "space" and x["config"] != "cublas"]
        vendor = [x["p50_us"] for x in r if x["config"] == "cublas"]
        tma = [x for x in r if x["kind"].startswith("tma")]
        best_tma = min(tma, key=lambda x: x["p50_us"]) if tma else None
        out.append({"shape": f"{m}x{n}x{k}", "best_tiled_us": min(tiled) if tiled else None,
                    "vendor_us": vendor[0] if vendor else None,
                    "best_tma_us": best_tma["p50_us"] if best_tma else None,
                    "best_tma": f"{best_tma['kind']}:{best_tma['config']}" if best_tma else None})
        print(json.dumps(out[-1]), flush=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as s:
        json.dump(out, s, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
