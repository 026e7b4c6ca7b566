"""Issue 63: why Inductor's max-autotune of ``torch._scaled_mm`` gave no time in the fp8 peer run.

Compiles the peer benchmark's fp8 call on one shape in several scale layouts (0-dim, (1,), (1, 1),
row/column-wise) and prints each attempt's outcome and the full traceback of a failure.

    python -m gemm_costmodel.benchmarks.explore.inductor_fp8_probe
"""
from __future__ import annotations

import traceback

import torch


def attempt(label, m, n, k, sa_shape, sb_shape, mode="max-autotune-no-cudagraphs"):
    torch._dynamo.reset()
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.full(sa_shape, 0.5, device="cuda", dtype=torch.float32)
    sb = torch.full(sb_shape, 0.25, device="cuda", dtype=torch.float32)

    def mm(x, w, sa, sb):
        return torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    try:
        ref = mm(x, w, sa, sb)
        out = torch.compile(mm, mode=mode, dynamic=False)(x, w, sa, sb)
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        print(f"OK   {label} {m}x{n}x{k} sa{tuple(sa_shape)} sb{tuple(sb_shape)} mode={mode}: max err {err:.3g}",
              flush=True)
    except Exception:  # noqa: BLE001 - the point is the traceback
        print(f"FAIL {label} {m}x{n}x{k} sa{tuple(sa_shape)} sb{tuple(sb_shape)} mode={mode}", flush=True)
        traceback.print_exc()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    attempt("scalar", 16, 4096, 4096, (), ())
    attempt("one", 16, 4096, 4096, (1,), (1,))
    attempt("oneone", 16, 4096, 4096, (1, 1), (1, 1))
    attempt("rowwise", 16, 4096, 4096, (16, 1), (1, 4096))
    attempt("scalar-m1", 1, 8192, 5376, (), ())
    attempt("scalar-default", 16, 4096, 4096, (), (), mode="default")
