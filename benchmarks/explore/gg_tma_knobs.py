"""Issue 60: the grouped GEMM's TMA kernels (impl.py, ``persistent_tma``) against the pointer kernel of
the same tile and the vendor, with the TMA kernels' loop knobs that are not config fields:

- ``flatten`` (impl.TMA_FLATTEN, on in the space): the tile loop and the K loop fused, so the
  software pipeline can prefetch the next tile's loads during a tile's epilogue;
- ``warp_specialize`` (impl.TMA_WARP_SPEC, off in the space): Triton's producer/consumer warp
  specialisation of the tile loop. Compiled for sm90 without a GPU (Triton 3.6, the H200 host's):
  the wgrad kernel comes out warp-specialised (4 + 8 warps); fwd/dgrad fail to compile without
  flatten and come out unspecialised with it. This run says whether either pays.

Per held-out problem (those of gg_vector_loads_check.py) and pass, every contender is checked against
the fp32 reference, then all are timed side by side (GraphTimer.measure_paired: interleaved replays,
one clock state). A contender that does not compile or run is written with its error.

    python benchmarks/explore/gg_tma_knobs.py OUT.jsonl
"""
from __future__ import annotations

import json
import sys

import torch

from gemm_costmodel.kernels.grouped_gemm import impl as I
from gemm_costmodel.kernels.grouped_gemm import space as S
from gemm_costmodel.kernels.timing import GraphTimer

PROBLEMS = [(32768, 5760, 2880, 16), (8192, 3072, 5120, 8), (16384, 2048, 1536, 40)]
# (pointer twin, TMA config): the large tiles the first sweep's oracle and the check script favoured.
TILES = [("ggpers_m128n256k64_g8_w8s3", "ggptma_m128n256k64_g8_w8s3"),
         ("ggpers_m128n128k64_g8_w8s4", "ggptma_m128n128k64_g8_w8s4")]
KNOBS = [(True, False), (False, False), (False, True), (True, True)]  # (flatten, warp_specialize)


def _tma_fn(cfg, ops, flatten: bool, ws: bool):
    I.ensure_tma_allocator()
    grid, kw = I.tma_launch_args(cfg, ops.stage, ops.a, ops.b, ops.offs, I.num_sms(torch.cuda.current_device()))
    kw.update(FLATTEN=flatten, WARP_SPEC=ws)
    kernel = I._gg_wgrad_tma_kernel if ops.stage == "wgrad" else I._gg_rows_tma_kernel

    def run(i):
        kernel[grid](ops.a, ops.b, ops.out, ops.offs, **kw)
        return ops.out
    return run


def main() -> None:
    timer = GraphTimer()
    gen = torch.Generator(device="cuda").manual_seed(60)
    out = open(sys.argv[1], "w")

    def emit(row):
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    for m, n, k, e in PROBLEMS:
        for stage in S.STAGES:
            p = S.Problem(m, n, k, "bf16", e, stage, "balanced")
            ops = I.make_operands(p, "cuda", gen)
            ref = I.reference(ops)
            fns = {"grouped_mm": lambda i: I.launch(S.VENDOR, stage, ops.a, ops.b, ops.offs)}
            for ptr, tma in TILES:
                pc = S.config_from_id(ptr)
                fns[ptr] = (lambda c: lambda i: I.launch(c, stage, ops.a, ops.b, ops.offs, ops.out))(pc)
                for flatten, ws in KNOBS:
                    fns[f"{tma}/flatten{int(flatten)}/ws{int(ws)}"] = _tma_fn(S.config_from_id(tma), ops, flatten, ws)
            base = dict(m=m, n=n, k=k, e=e, stage=stage)
            good = {}
            for label, fn in fns.items():
                try:
                    ops.out.fill_(float("nan"))
                    y = fn(0)
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                except Exception as exc:  # noqa: BLE001 - a knob that does not compile is a result
                    emit({**base, "contender": label, "error": f"{type(exc).__name__}: {str(exc)[-300:]}"})
                    continue
                if not err <= I.ERROR_BOUNDS["bf16"]:
                    emit({**base, "contender": label, "error": f"rel_err {err}"})
                    continue
                good[label] = (fn, err)
            times = timer.measure_paired({label: fn for label, (fn, _) in good.items()}, 1)
            for label, t in times.items():
                emit({**base, "contender": label, "us": t.p50_us, "spread": t.spread, "rel_err": good[label][1],
                      "tflops": 2 * m * n * k / t.p50_us / 1e6})
            del ops, ref, fns, good
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
