"""Exploration (kept as a record): is the fp8 decode GEMV bound by converting its weights?

Every fp8 GEMV of the space (dense ``gemv``, fp8_blockscale's, the MoE one) reads its weights with
``w.to(tl.float32)``; Triton lowers an e4m3 -> fp32 conversion to a packed e4m3x2 -> f16x2 convert and
two f16 -> f32 converts, and conversions issue at a fraction of the fp32 rate. At M = 1 the best fp8
GEMV of the data moves 1.9-3.0 TB/s (fp8_blockscale, weights >= 16 MB; median 2.4) against 2.3-3.1
(median 3.05) for the bf16 GEMV, which reads twice the bytes per element. Three minimal GEMVs
(y = w @ x, M = 1, x given in fp32 so only the weight's handling differs), each over the same grid of
(rows per program, K elements per step, warps):

- ``cvt``: fp8 weights converted with ``.to(tl.float32)`` (what the space's kernels do);
- ``bits``: the same bytes read as 32-bit words, each e4m3 byte moved into an fp32's exponent and
  mantissa bits with integer shifts and masks (the value times 2^-120, exact for normal and
  subnormal e4m3; the factor is taken out of the sum once), no conversion instruction;
- ``bf16``: bf16 weights converted with ``.to(tl.float32)`` (twice the bytes; the memory-bound
  reference).

Each candidate is checked against an fp32 reference (relative error < 1e-3), then timed with the
harness's graph timer over rotating weight copies (>= 2x L2), 3 rounds, all candidates of a shape in
one process.

    python benchmarks/explore/fp8_gemv_decode.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.timing import GraphTimer

SHAPES = ((4096, 14336), (14336, 4096), (8192, 8192), (28672, 4096), (4096, 4096), (7168, 2048), (2048, 7168))
CONFIGS = tuple((n, k, w) for n in (1, 2, 4, 8) for k in (512, 1024, 2048) for w in (4, 8) if n * k <= 8192)
ROUNDS = 3


@triton.jit
def gemv_cvt_kernel(w_ptr, x_ptr, y_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + (offs_n % N)[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(0, K // BLOCK_K):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(rows + offs_k[None, :], eviction_policy="evict_first")
        acc += w.to(tl.float32) * tl.load(x_ptr + offs_k)[None, :]
    tl.store(y_ptr + offs_n, tl.sum(acc, axis=1), mask=offs_n < N)


@triton.jit
def _e4m3_bits(w, J: tl.constexpr):
    # Byte J of each word as an fp32 equal to its e4m3 value times 2^-120: the 4 exponent and 3
    # mantissa bits land in the fp32's exponent's low bits and its mantissa's top bits (e4m3 bias 7,
    # fp32 bias 127), the sign in the sign bit; an e4m3 subnormal becomes the fp32 subnormal of the
    # same scaled value.
    mag = ((w >> (8 * J)) & 0x7F) << 20
    sgn = ((w >> (8 * J + 7)) & 1) << 31
    return (mag | sgn).to(tl.float32, bitcast=True)


@triton.jit
def gemv_bits_kernel(w_ptr, x_ptr, y_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """w_ptr: the fp8 weight viewed as uint32 words (N, K // 4); x_ptr: x de-interleaved, (4, K // 4)
    (x4[j, c] = x[4c + j])."""
    KW: tl.constexpr = K // 4
    BW: tl.constexpr = BLOCK_K // 4
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + (offs_n % N)[:, None].to(tl.int64) * KW
    acc = tl.zeros((BLOCK_N, BW), dtype=tl.float32)
    for kt in range(0, KW // BW):
        offs = kt * BW + tl.arange(0, BW)
        w = tl.load(rows + offs[None, :], eviction_policy="evict_first")
        acc += _e4m3_bits(w, 0) * tl.load(x_ptr + offs)[None, :]
        acc += _e4m3_bits(w, 1) * tl.load(x_ptr + KW + offs)[None, :]
        acc += _e4m3_bits(w, 2) * tl.load(x_ptr + 2 * KW + offs)[None, :]
        acc += _e4m3_bits(w, 3) * tl.load(x_ptr + 3 * KW + offs)[None, :]
    # 2^120 in two steps (2^120 alone is a finite fp32, but a sum times it in one step is not safer).
    y = tl.sum(acc, axis=1) * 1.152921504606847e18 * 1.152921504606847e18
    tl.store(y_ptr + offs_n, y, mask=offs_n < N)


def launch(kind, cfg, w, x, y):
    n, k = w.shape[0], w.shape[1] * (4 if kind == "bits" else 1)
    bn, bk, warps = cfg
    kernel = gemv_bits_kernel if kind == "bits" else gemv_cvt_kernel
    kernel[(triton.cdiv(n, bn),)](w, x, y, n, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=1)
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fp8_gemv_decode.jsonl")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gpu = torch.cuda.get_device_name(0)
    timer = GraphTimer()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    for n, k in SHAPES:
        wf = torch.randn((n, k), device="cuda", generator=gen) * 64
        x = torch.randn(k, device="cuda", generator=gen)
        w8 = wf.clamp(-448, 448).to(torch.float8_e4m3fn)
        ref = w8.float() @ x
        ops = {}
        for kind, w in (("cvt", w8), ("bits", w8.view(torch.uint8).view(n, k).view(torch.int32)),
                        ("bf16", w8.float().to(torch.bfloat16))):
            copies = max(2, -(-2 * l2 // w.nbytes) + 1)
            ws = [w] + [w.clone() for _ in range(copies - 1)]
            xin = x.reshape(k // 4, 4).t().contiguous().reshape(-1) if kind == "bits" else x
            ops[kind] = (ws, xin)
        y = torch.empty(n, device="cuda")
        status, times = {}, {}
        for kind, (ws, xin) in ops.items():
            for cfg in CONFIGS:
                if k % cfg[1]:
                    continue
                label = f"{kind}:n{cfg[0]}k{cfg[1]}w{cfg[2]}"
                try:
                    y.fill_(float("nan"))
                    launch(kind, cfg, ws[0], xin, y)
                    torch.cuda.synchronize()
                    err = ((y - ref).norm() / ref.norm()).item()
                    status[label] = "ok" if err < 1e-3 else f"wrong {err:.2e}"
                except Exception as exc:  # noqa: BLE001 - a failed candidate stays as a row
                    status[label] = f"error {type(exc).__name__}: {str(exc)[:200]}"
                if status[label] == "ok":
                    times[label] = []
        labels = list(times)
        for r in range(ROUNDS):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                kind, c = label.split(":")
                bn, rest = c[1:].split("k")
                bk, warps = rest.split("w")
                ws, xin = ops[kind]
                t = timer.measure(lambda i, kd=kind, cf=(int(bn), int(bk), int(warps)), ww=ws, xx=xin:
                                  launch(kd, cf, ww[i], xx, y), len(ws), key=label)
                times[label].append(t.p50_us)
        p50 = {k_: statistics.median(v) for k_, v in times.items()}
        row = {"gpu": gpu, "n": n, "k": k, "status": status, "p50_us": p50, "rounds_us": times}
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        best = {kd: min((v for lb, v in p50.items() if lb.startswith(kd + ":")), default=float("nan"))
                for kd in ("cvt", "bits", "bf16")}
        tbs = {kd: (n * k * (2 if kd == "bf16" else 1)) / v / 1e6 for kd, v in best.items()}
        print(f"1x{n}x{k}: " + ", ".join(f"{kd} {best[kd]:.2f} us ({tbs[kd]:.2f} TB/s)" for kd in best)
              + f"; {sum(s != 'ok' for s in status.values())} failed", flush=True)
        del ops, ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
