"""Does torch._scaled_mm's blockwise fp8 scaling (cuBLASLt, 1x128 x 128x128) run on this stack,
for which shapes, and with which scale layout? One JSON line per (shape, layout) attempt.

    python benchmarks/explore/fp8bs_vendor_probe.py > OUT.jsonl

Layouts of Bs tried (the checks in PyTorch's ScaledBlas.cpp changed between versions):
'view' = Bs (ceil(N/128), ceil(K/128)) row-major passed as Bs.t(); 'pad4' = Bs padded to a
multiple of 4 groups along K, then .t(). As is always (M, ceil(K/128)) with strides (1, M).
"""
from __future__ import annotations

import json
import sys

import torch

from gemm_costmodel.kernels.fp8_blockscale import impl, space

SHAPES = [(1, 7168, 2048), (7, 4096, 7168), (16, 2112, 7168), (64, 576, 7168), (100, 1536, 1536),
          (128, 7168, 128), (4096, 7168, 18432), (4097, 24576, 1536), (1, 1000, 1024), (32, 1024, 1000),
          (33, 7168, 2304), (512, 36864, 7168)]


def layout(bs: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "view":
        return bs.t()
    kg = bs.shape[1]
    pad = -kg % 4
    if pad:
        bs = torch.cat([bs, bs.new_ones(bs.shape[0], pad)], dim=1)
    return bs.contiguous().t()


def main() -> int:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    for m, n, k in SHAPES:
        p = space.Problem(m, n, k, "fp8")
        ops = impl.make_operands(p, "cuda", gen)
        ref = impl.reference(ops)
        for kind in ("view", "pad4"):
            rec = {"m": m, "n": n, "k": k, "layout": kind}
            try:
                sa = ops.as_.t().contiguous().t()
                y = torch._scaled_mm(ops.a, ops.b.t(), scale_a=sa, scale_b=layout(ops.bs, kind),
                                     out_dtype=torch.bfloat16)
                torch.cuda.synchronize()
                rec["rel_err"] = float((y.float() - ref).norm() / ref.norm())
                rec["ok"] = rec["rel_err"] < impl.ERROR_BOUNDS["fp8"]
            except Exception as exc:  # noqa: BLE001 - the probe records what the stack says
                rec["ok"] = False
                rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(json.dumps(rec), flush=True)
        # The op's own vendor launch (impl._vendor), as the harness runs it.
        try:
            y = impl.launch(space.VendorConfig(), ops.a, ops.b, ops.as_, ops.bs, ops.out)
            torch.cuda.synchronize()
            err = float((y.float() - ref).norm() / ref.norm())
            print(json.dumps({"m": m, "n": n, "k": k, "layout": "impl", "rel_err": err,
                              "ok": err < impl.ERROR_BOUNDS["fp8"]}), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"m": m, "n": n, "k": k, "layout": "impl", "ok": False,
                              "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
