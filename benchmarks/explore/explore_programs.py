"""A/B: the persistent kernel's program count as a constexpr (before) or a runtime argument (now).

As a constexpr, NUM_PROGRAMS = min(SMs, tiles) differs between shapes with fewer
tiles than SMs, so each such shape compiled every persistent config again inside
the measuring process. Run the same evaluation sweep (every candidate of each
shape) in two fresh processes on one GPU, one with the old kernel (a verbatim
copy below, patched in) and one with the committed kernel, then compare the
gate seconds and the persistent rows' latencies (the other variants' rows,
identical code in both runs, give the noise level):

    python benchmarks/explore/explore_programs.py --shapes SHAPES.csv --out OUT --which old
    python benchmarks/explore/explore_programs.py --shapes SHAPES.csv --out OUT --which new
    python benchmarks/explore/explore_programs.py --shapes SHAPES.csv --out OUT --which compare
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch
import triton
import triton.language as tl

from gemm_costmodel.kernels.gemm import suites as S
from gemm_costmodel.kernels.shapes import read_shape_csv
from gemm_costmodel.benchmarks import harness, precompile, provenance
from gemm_costmodel.kernels import timing
from gemm_costmodel.benchmarks.store import ResultStore, read_rows
from gemm_costmodel.kernels.gemm import kernel as gemm
from gemm_costmodel.kernels.common import _device_index, _grouped_tile, num_sms
from gemm_costmodel.kernels.gemm.space import Problem


@triton.jit(do_not_specialize=["M"])
def _old_persistent_kernel(x_desc, w_desc, y_desc, sa_ptr, sb_ptr, M, N, K,
                           HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                           FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = x_desc.load([off_m, kt * BLOCK_K])
            b = w_desc.load([off_n, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if HAS_SCALE:
            acc = acc * scale
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


def _old_launch(cfg, x, w, out, sa, sb, has_scale, **_):
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    N = w.shape[0]
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = min(num_sms(_device_index(x)), tiles)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    y_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.block_n])
    _old_persistent_kernel[(programs,)](
        x_desc, w_desc, y_desc, sa, sb, M, N, K, HAS_SCALE=has_scale, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_PROGRAMS=programs,
        FLATTEN=gemm.PERSISTENT_FLATTEN, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--which", required=True, choices=("old", "new", "compare"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.which == "compare":
        return compare(args.out)
    shapes = read_shape_csv(args.shapes)
    prov = provenance.collect(torch.cuda.current_device())
    todo = [(p, harness.select_candidates(p, "all", 0)) for p in (Problem(s.m, s.n, s.k, s.dtype) for s in shapes)]
    # As `costmodel bench` does (its spawned workers compile the committed kernels only).
    if args.which == "old":
        gemm.launch_persistent = _old_launch
    precompile.precompile(todo)
    with ResultStore(os.path.join(args.out, f"{args.which}.jsonl")) as store:
        st = harness.run_sweep(shapes, store, timing.GraphTimer(), mode="all", provenance=prov,
                               suite=args.which, progress=False)
    out = {"seconds": st.seconds, "phase_seconds": st.phase_seconds, "measured": st.measured,
           "failed": st.failed, "provenance": prov}
    json.dump(out, open(os.path.join(args.out, f"{args.which}_stats.json"), "w"), indent=1)
    print(args.which, json.dumps({k: v for k, v in out.items() if k != "provenance"}), flush=True)


def compare(out_dir):
    """new / old p50 per (shape, candidate), persistent rows vs the rest; gate seconds."""
    rows = {n: {(r["m"], r["n"], r["k"], r["candidate"]): r for r in read_rows([os.path.join(out_dir, f"{n}.jsonl")])}
            for n in ("old", "new")}
    summary = {n: json.load(open(os.path.join(out_dir, f"{n}_stats.json")))["phase_seconds"] for n in ("old", "new")}
    for variant in ("persistent", "other"):
        ratios = [rows["new"][key]["p50_us"] / r["p50_us"] for key, r in rows["old"].items()
                  if r["status"] == "ok" and key in rows["new"] and rows["new"][key]["status"] == "ok"
                  and (r["variant"] == "persistent") == (variant == "persistent")]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        within = sum(abs(x - 1) <= 0.03 for x in ratios) / len(ratios)
        summary[f"{variant}_new_over_old"] = {"rows": len(ratios), "geomean": gm, "within_3pct": within}
    json.dump(summary, open(os.path.join(out_dir, "programs_ab.json"), "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
