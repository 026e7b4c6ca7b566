"""Issue 60: compile the grouped GEMM's TMA kernels (impl.py, ``persistent_tma``) for sm90 without a
GPU: ``triton.compile`` with a GPUTarget, then the bundled ptxas with ``-v``. Says, per config and
pass, whether the kernel compiles, its shared memory (against space.smem_bytes), its descriptor
workspace per program, whether the PTX has wgmma and TMA loads/stores, whether Triton made it
warp-specialised, and ptxas's registers and spills. The GPU host's Triton can be tried from a
wheel unpacked elsewhere (PYTHONPATH=DIR; ptxas in it must be executable).

    python benchmarks/explore/gg_tma_compile_check.py [grid|knobs]

``grid`` (default): every pending bf16 config, each pass, with the launch's knobs (impl.TMA_FLATTEN,
TMA_WARP_SPEC). ``knobs``: the 128 x 128 x 64 config with flatten on/off x warp specialisation
on/off.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gemm_costmodel.kernels.grouped_gemm import impl as I
from gemm_costmodel.kernels.grouped_gemm import space as S

TARGET = GPUTarget("cuda", 90, 32)
DIV16 = [["tt.divisibility", 16]]  # pointers, N and K: what a bf16 problem on the TMA rule specialises on


def _source(cfg, stage: str, flatten: bool, ws: bool) -> ASTSource:
    tiles = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                 FLATTEN=flatten, WARP_SPEC=ws)
    if stage == "wgrad":
        sig = {"dy_ptr": "*bf16", "x_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i32", "N": "i32", "K": "i32",
               "G": "i32", "NUM_PROGRAMS": "i32", **{k: "constexpr" for k in tiles}}
        return ASTSource(I._gg_wgrad_tma_kernel, sig, tiles, {(i,): DIV16 for i in range(6)})
    const = dict(G_PAD=16, FWD=stage == "fwd", **tiles)
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i32", "M": "i32", "N_OUT": "i32",
           "RED": "i32", "G": "i32", "NUM_PROGRAMS": "i32", **{k: "constexpr" for k in const}}
    return ASTSource(I._gg_rows_tma_kernel, sig, const, {(i,): DIV16 for i in (0, 1, 2, 3, 5, 6)})


def _ptxas(ptx: str) -> str:
    try:  # the ptxas Triton itself assembles sm90 with (newer Tritons name it ptxas_blackwell)
        from triton.backends.nvidia.compiler import get_ptxas

        exe = get_ptxas(90).path
    except ImportError:
        exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as fh:
        fh.write(ptx)
    try:
        res = subprocess.run([exe, "-v", "--gpu-name", "sm_90a", fh.name, "-o", os.devnull],
                             capture_output=True, text=True)
    finally:
        os.unlink(fh.name)
    return "; ".join(ln.split("info    : ")[-1].strip() for ln in res.stderr.splitlines()
                     if "registers" in ln or "spill" in ln)


def check(cfg, stage: str, flatten: bool, ws: bool) -> dict:
    k = triton.compile(_source(cfg, stage, flatten, ws), target=TARGET,
                       options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    return dict(smem=k.metadata.shared, smem_model=S.smem_bytes(cfg, "bf16"),
                scratch_per_program=k.metadata.global_scratch_size, wgmma="wgmma" in ptx,
                tma_load=re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global", ptx) is not None,
                tma_store=re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::", ptx) is not None,
                warp_specialized="ttg.warp_specialize" in ttgir, warps=k.metadata.num_warps, ptxas=_ptxas(ptx))


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "grid"
    cfgs = S.pending_configs("sm90", "bf16")
    if which == "knobs":
        one = S.GgPersistentTmaConfig(128, 128, 64, 8, 4, 4)
        todo = [(one, st, fl, ws) for st in S.STAGES for fl in (True, False) for ws in (False, True)]
    else:
        todo = [(c, st, I.TMA_FLATTEN, I.TMA_WARP_SPEC) for c in cfgs for st in S.STAGES]
    print(f"triton {triton.__version__}, target sm90")
    for cfg, stage, fl, ws in todo:
        head = f"{cfg.id} {stage} flatten={int(fl)} ws={int(ws)}"
        try:
            print(head, check(cfg, stage, fl, ws), flush=True)
        except Exception as exc:  # noqa: BLE001 - a failure to compile is the finding
            print(head, "FAILED", type(exc).__name__, (str(exc).strip().splitlines() or [""])[-1][:200], flush=True)


if __name__ == "__main__":
    main()
