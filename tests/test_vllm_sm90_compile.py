"""vLLM's fused-MoE kernel (op ``vllm_moe``) compiled for sm90 (the H200) on the CPU: Triton runs its
MLIR passes without a GPU when given the target, so configs that Triton cannot compile are found here,
not in a GPU sweep. Each launch goes through the op's own path (``impl.make_operands``,
``vllm_kernels.fused_experts``, vLLM's SWAP_AB rule for compute capability 9.0) with a stand-in
driver that reports an sm90 target and a compile hook (tests/sm90_compile.py, shared with the other ops'
sm90 compile tests) that records the launch's signature,
constexprs and specialisation instead of launching; the record is compiled to TTGIR (where the
layout passes run), which takes ~50 ms a launch.

Triton 3.6.0 (the H200 host's) fails on some of vLLM's configs on vLLM's sorted path (``LAYOUT_BUG``
below): its TritonGPURemoveLayoutConversions pass reuses the ``token_mask[:, None]`` it converted for
the K loop's A mask (defined inside the loop) for the epilogue's ``c_mask``, and the verifier stops
the compile ("operand #0 does not dominate this use"; triton-lang/triton#9809, which vLLM's own tuner
meets too). The space still offers them (a GPU sweep records them as compile_error rows); the test
pins the failure so that a Triton upgrade that fixes it shows. Skipped, saying why, without a vLLM
source or a Triton with the CUDA backend. ``python tests/test_vllm_sm90_compile.py DTYPE`` compiles
every config of the space for the gate suite's compile keys of DTYPE (minutes) and prints failures.

vLLM's w8a8 block-fp8 linear kernel (op ``vllm_w8a8_block``) is compiled the same way, through its
own launch path (``impl.make_operands``, ``Operands.run``: one launch per config). Every config of
its fp8 space compiles for sm90 under Triton 3.6.0 on each compile key of its gate, eval_core and
train suites (M, N and K off every multiple of 16 included), so nothing is pinned for it;
``python tests/test_vllm_sm90_compile.py vllm_w8a8_block`` repeats that sweep (~1 minute a key).
The representative configs also compile to a cubin (``compile_ttgir(..., until="cubin")``), and the
space's largest pipelines (its static shared-memory rule's 192-200 KiB) ask Triton for at most
205,824 B of shared memory (``until="llir"``, metadata "shared"), under sm90's 232,448 B.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys

import pytest
import torch

from gemm_costmodel.kernels.moe import vllm_kernels as VK
from gemm_costmodel.kernels.vllm import source
from gemm_costmodel.kernels.vllm_moe import impl, space
from gemm_costmodel.kernels.vllm_moe.space import Problem, VllmMoeConfig
from gemm_costmodel.kernels.vllm_w8a8_block import impl as block_impl
from gemm_costmodel.kernels.vllm_w8a8_block import space as block_space
from gemm_costmodel.kernels.vllm_w8a8_block.space import VllmBlockConfig
from sm90_compile import NO_BACKEND_REASON, compile_ttgir, first_line, recording, run_child

SRC, WHY = source.find_source()


NO_BACKEND = NO_BACKEND_REASON
pytestmark = [pytest.mark.skipif(SRC is None, reason=WHY or "no vLLM source"),
              pytest.mark.skipif(bool(NO_BACKEND), reason=NO_BACKEND)]
_recording = recording


def sm90_launches(problem: Problem, cfg: VllmMoeConfig, ops=None) -> list:
    """The layer's two launches of vLLM's kernel (gate_up, down) as the H200 sweep makes them."""
    mod = VK.compile_kernels(SRC)
    if ops is None:
        ops = impl.make_operands(problem, "cpu", torch.Generator().manual_seed(0))
    fp8 = problem.dtype in space.FP8_DTYPES
    swap = fp8 and VK.enable_swap_ab(cfg.block_m, cfg.block_n, (9, 0))
    with _recording(VK.MOE_KERNEL) as got:
        VK.fused_experts(mod, ops.x, ops.w1, ops.w2, ops.topk_weights, ops.topk_ids, space.to_vllm(cfg),
                         w1_scale=ops.w1_scale, w2_scale=ops.w2_scale, a1_scale=ops.a1_scale,
                         a2_scale=ops.a2_scale, swap_ab=swap, out=ops.out)
    return got


def block_sm90_launches(problem: block_space.Problem, cfg: VllmBlockConfig, ops=None) -> list:
    """The op ``vllm_w8a8_block``'s one launch of vLLM's kernel, through the op's own path
    (``impl.make_operands``, ``Operands.run``: vLLM's grid, strides and block size [128, 128])."""
    if ops is None:
        ops = block_impl.make_operands(problem, "cpu", torch.Generator().manual_seed(0))
    with _recording(VK.BLOCK_FP8_KERNEL) as got:
        ops.run(cfg)
    return got


# Each op: its Problem, its config ids' parser and its recorded launches.
OPS = {"vllm_moe": (Problem, space.config_from_id, sm90_launches),
       "vllm_w8a8_block": (block_space.Problem, block_space.config_from_id, block_sm90_launches)}


def _op_of(problem) -> str:
    return next(name for name, (cls, _, _) in OPS.items() if type(problem) is cls)


def compiles(problem, cfg, ops=None) -> list[str]:
    """'' per launch (of either op) that compiles, else Triton's error (first line)."""
    out = []
    for fn, args in OPS[_op_of(problem)][2](problem, cfg, ops):
        try:
            compile_ttgir(fn, args)
            out.append("")
        except RuntimeError as exc:
            out.append(first_line(exc))
    return out


# A gate-suite compile key on vLLM's sorted path (M * top_k * 4 > E) with N and K off every multiple of
# 16 (the failing H200 sweep's), one with both multiples of 16, and one on the per-pair path.
SORTED_ODD = Problem(2, 45, 37, "bf16", 2, 2)
SORTED_ALIGNED = Problem(8, 32, 32, "bf16", 16, 2)
PER_PAIR_ODD = Problem(1, 45, 37, "bf16", 8, 2)


def _as(p: Problem, dtype: str) -> Problem:
    return Problem(p.m, p.n, p.k, dtype, p.e, p.top_k, p.routing)


# (problem, config) that compile: the tile extremes, both warp counts, the fp8 swapped path
# (BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 on sm90), block scales, vLLM's default.
REPRESENTATIVE = [
    (SORTED_ODD, VllmMoeConfig(16, 32, 64, 1, 4, 2)),
    (SORTED_ODD, VllmMoeConfig(256, 256, 64, 16, 8, 3)),
    (SORTED_ODD, VllmMoeConfig(256, 128, 64, 1, 4, 3)),
    (PER_PAIR_ODD, VllmMoeConfig(256, 256, 64, 1, 4, 3)),
    (_as(SORTED_ODD, "fp8"), VllmMoeConfig(16, 128, 128, 1, 4, 3)),
    (_as(SORTED_ODD, "fp8"), VllmMoeConfig(64, 128, 128, 1, 4, 3)),
    (Problem(2, 333, 517, "fp8bs", 2, 2), VllmMoeConfig(32, 128, 128, 1, 4, 3)),
    (Problem(2, 333, 517, "fp8bs", 2, 2), VllmMoeConfig(128, 128, 128, 1, 8, 3)),
    (SORTED_ALIGNED, space.vllm_default(2048, 64, "bf16")),
]
# Configs Triton 3.6.0 cannot compile on the sorted path (found by compiling the whole space, ``_sweep``):
# BLOCK_SIZE_M 256 with 4 warps and (N, K tile) bf16 (64, 64), (128, 128); fp8 also (128, 256), (256, 128);
# fp8bs (128, 128), (256, 128); any GROUP_SIZE_M and num_stages. bf16 fails at every N and K, fp8 and
# fp8bs only with N or K off a multiple of 16; the per-pair path compiles them all. The space rules them
# out on both paths (its rule reads the dimensions only: kernels/vllm_moe/space.py, PROBLEM_RULES).
LAYOUT_BUG = [(p, VllmMoeConfig(256, n, k, g, 4, s)) for p in (SORTED_ODD, SORTED_ALIGNED)
              for n, k, g, s in ((64, 64, 1, 3), (128, 128, 16, 2))]
LAYOUT_BUG += [(Problem(2, 333, 517, "fp8bs", 2, 2), VllmMoeConfig(256, 256, 128, 1, 4, 3))]

# vllm_w8a8_block (fp8): compile keys of its gate suite (``block_space.probe_problem``) with M, N and K
# off every multiple of 16 (N = K = 1000's), all three multiples of 16 and ceil(K / 128) too (the train
# suite's K = 2048), and M = 1 with K one scale group (N = 7168, K = 128).
BLOCK_ODD = block_space.Problem(17, 17, 255, "fp8")
BLOCK_ALIGNED = block_space.Problem(16, 16, 2048, "fp8")
BLOCK_DECODE = block_space.Problem(1, 16, 128, "fp8")
# (problem, config) that compile: vLLM's default, the tile extremes (the largest tiles within shared
# memory), both BLOCK_SIZE_K, both warp counts, 2 to 5 stages, every GROUP_SIZE_M.
BLOCK_REPRESENTATIVE = [
    (BLOCK_ODD, block_space.vllm_default()),
    (BLOCK_ODD, VllmBlockConfig(16, 32, 64, 1, 4, 5)),
    (BLOCK_ODD, VllmBlockConfig(256, 256, 128, 64, 8, 3)),
    (BLOCK_ODD, VllmBlockConfig(256, 128, 64, 16, 4, 4)),
    (BLOCK_ODD, VllmBlockConfig(128, 256, 128, 32, 4, 2)),
    (BLOCK_ALIGNED, VllmBlockConfig(256, 256, 128, 1, 4, 3)),
    (BLOCK_ALIGNED, VllmBlockConfig(32, 64, 64, 16, 8, 5)),
    (BLOCK_DECODE, VllmBlockConfig(16, 128, 128, 1, 4, 5)),
]


def _case(p, cfg) -> list:
    return [_op_of(p), [getattr(p, f.name) for f in dataclasses.fields(p)], cfg.id]


def _from_case(op: str, fields: list, cid: str) -> tuple:
    cls, config_from_id, _ = OPS[op]
    return cls(*fields), config_from_id(cid)


def compile_in_child(cases) -> list[list[str]]:
    """``compiles`` of each (problem, config) in a child process: the CPU suite runs under
    TRITON_INTERPRET=1, whose triton.language helpers cannot be compiled in the same process."""
    return run_child(__file__, "--cases", json.dumps([_case(p, c) for p, c in cases]))


@pytest.fixture(scope="module")
def results():
    cases = REPRESENTATIVE + LAYOUT_BUG + BLOCK_REPRESENTATIVE
    return dict(zip(map(str, cases), compile_in_child(cases)))


@pytest.mark.parametrize("case", REPRESENTATIVE, ids=[f"{p.key}-{c.id}" for p, c in REPRESENTATIVE])
def test_representative_configs_compile_for_sm90(case, results):
    problem, cfg = case
    assert space.check_feasible(cfg, problem)[0], "a representative config the space leaves out"
    assert results[str(case)] == ["", ""], "gate_up and down launches must both compile"


@pytest.mark.parametrize("case", LAYOUT_BUG, ids=[f"{p.key}-{c.id}" for p, c in LAYOUT_BUG])
def test_triton_36_cannot_compile_the_layout_bug_configs(case, results):
    import triton

    if triton.__version__ != "3.6.0":
        pytest.skip(f"the failure is Triton 3.6.0's; this is {triton.__version__}")
    assert any("PassManager::run failed" in r for r in results[str(case)])


@pytest.mark.parametrize("case", BLOCK_REPRESENTATIVE, ids=[f"{p.key}-{c.id}" for p, c in BLOCK_REPRESENTATIVE])
def test_representative_w8a8_block_configs_compile_for_sm90(case, results):
    problem, cfg = case
    assert cfg in block_space.feasible_configs(problem, include_vendor=False), "a config the space leaves out"
    assert results[str(case)] == [""], "vLLM's block-fp8 linear launch must compile"


def _sweep(dtype: str) -> None:
    """Compile every config of the space for each compile key of the gate suite (and the per-pair
    twin of each), printing the launches that fail."""
    from gemm_costmodel.kernels.vllm_moe import suites

    keys = {}
    for s in suites.gate_suite(dtype):
        keys.setdefault(space.specialisation(s.problem), space.probe_problem(s.problem))
    _sweep_keys(space, impl, keys.values())


def _block_sweep(dtype: str) -> None:
    """vllm_w8a8_block's ``_sweep``: every config of its space on each compile key of its gate,
    eval_core and train suites (12 keys for fp8; ~1 minute a key)."""
    from gemm_costmodel.kernels.vllm_w8a8_block import suites

    keys = {}
    for name in ("gate", "eval_core", "train"):
        for s in suites.SUITES[name](dtype):
            p = block_space.Problem(s.m, s.n, s.k, s.dtype)
            keys.setdefault(block_space.specialisation(p), block_space.probe_problem(p))
    _sweep_keys(block_space, block_impl, keys.values())


def _sweep_keys(space_mod, impl_mod, problems) -> None:
    for p in problems:
        ops = impl_mod.make_operands(p, "cpu", torch.Generator().manual_seed(0))
        cfgs = space_mod.feasible_configs(p, include_vendor=False)
        bad = [(c.id, r) for c in cfgs for r in compiles(p, c, ops) if r]
        print(p.key, len(cfgs), "configs,", len(bad), "failing launches", bad[:5], flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--cases":
        out = []
        with contextlib.redirect_stdout(sys.stderr):  # MLIR's dumps go to stderr; the answer to stdout
            for case in json.loads(sys.argv[2]):
                out.append(compiles(*_from_case(*case)))
        print(json.dumps(out))
    elif sys.argv[1] == "vllm_w8a8_block":
        _block_sweep(sys.argv[2] if len(sys.argv) > 2 else "fp8")
    else:
        _sweep(sys.argv[1])
