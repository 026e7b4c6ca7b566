"""The grouped-GEMM op's kernels (op ``grouped_gemm``) compiled for sm90 (the H200) on the CPU
(tests/sm90_compile.py: a stand-in sm90 driver and Triton's compile hook record a launch through the
op's own path, ``impl.make_operands`` then ``Operands.run``, and the record is compiled in a child
process without TRITON_INTERPRET). The TMA variant ``persistent_tma`` (pending: space.PENDING_SM90)
makes its tensor descriptors on the device; nothing is launched here, so no descriptor allocator is
needed (the workspace is asked for at launch only).

Every ``persistent_tma`` config (the 11 bf16 configs of the pending grid) compiles for sm90 under
Triton 3.6.0 (the H200 host's) to TTGIR in each pass (fwd, dgrad, wgrad) on every compile key of the
``gate`` and ``eval`` suites where the TMA rule holds (gate: N = 200, K = 136 with E = 1 and N = 512,
K = 256 with E = 8; eval: its 5 keys a pass, E 4 to 64), and so does every pointer config of the space
(tiled, persistent, split-K) for dgrad and wgrad on every gate and eval key (decision 068's wrapped,
hinted indices; the gate's N = 333, K = 517 and N = 1000, K = 260 take them too). The cases below
compile further, to a cubin with the bundled ptxas (also with Triton 3.9). Nothing is pinned as
failing. ``python tests/test_grouped_gemm_sm90_compile.py sweep [SUITE...] [--cubin]`` repeats the
sweep (about a minute for gate and eval to TTGIR; --cubin takes about a minute a key).
"""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from gemm_costmodel.kernels.grouped_gemm import impl, space
from gemm_costmodel.kernels.grouped_gemm.space import (GgPersistentConfig, GgPersistentTmaConfig, GgSplitKConfig,
                                                       GgTiledConfig, Problem)
from sm90_compile import NO_BACKEND_REASON, compile_ttgir, first_line, recording, run_child

pytestmark = pytest.mark.skipif(bool(NO_BACKEND_REASON), reason=NO_BACKEND_REASON)

KERNELS = ("_gg_rows_kernel", "_gg_wgrad_kernel", "_gg_rows_tma_kernel", "_gg_wgrad_tma_kernel")


def sm90_launches(problem: Problem, cfg, ops=None) -> list:
    """The pass's one launch of a grouped_gemm kernel, through the op's own path (``launch``: the TMA
    kernel where the operands are aligned, its grid, constexprs and knobs)."""
    if ops is None:
        ops = impl.make_operands(problem, "cpu", torch.Generator().manual_seed(0))
    with recording(KERNELS) as got:
        ops.run(cfg)
    return got


def compiles(problem: Problem, cfg, ops=None, until: str = "ttgir") -> list[str]:
    """'' per launch that compiles (to ``until``), else Triton's error (first line)."""
    out = []
    for fn, args in sm90_launches(problem, cfg, ops):
        try:
            compile_ttgir(fn, args, until)
            out.append(fn.__name__)
        except Exception as exc:  # noqa: BLE001 - Triton raises RuntimeError, CompilationError, ...
            out.append("error: " + first_line(exc))
    return out


# Compile keys of the gate suite where the TMA rule holds (space.probe_problem of its shapes: N and K
# multiples of 8, N = 200 and K = 136 off every multiple of 16 besides), E = 1 and 8, and an eval
# problem's key (N, K multiples of 128, E = 64).
GATE_ODD = dict(m=3, n=200, k=136, dtype="bf16", e=1)
GATE_ALIGNED = dict(m=3, n=128, k=128, dtype="bf16", e=8)
EVAL_LIKE = dict(m=64, n=256, k=384, dtype="bf16", e=64)


def _p(dims: dict, stage: str) -> Problem:
    return Problem(stage=stage, **dims)


# Representative configs per pass: every TMA tile's extremes (64-row, the 256-wide and 128-deep tiles,
# both warp counts and stage counts), on the odd and aligned keys; a pointer variant of each kind.
TMA_CASES = [(_p(GATE_ODD, st), GgPersistentTmaConfig(64, 128, 64, 8, 4, 3)) for st in space.STAGES]
TMA_CASES += [(_p(GATE_ALIGNED, st), GgPersistentTmaConfig(128, 256, 64, 8, 8, 3)) for st in space.STAGES]
TMA_CASES += [(_p(GATE_ODD, "wgrad"), GgPersistentTmaConfig(256, 128, 64, 8, 8, 3)),
              (_p(EVAL_LIKE, "dgrad"), GgPersistentTmaConfig(128, 128, 128, 8, 8, 3)),
              (_p(EVAL_LIKE, "fwd"), GgPersistentTmaConfig(128, 128, 64, 8, 4, 4))]
POINTER_CASES = [(_p(GATE_ODD, "dgrad"), GgTiledConfig(128, 64, 64, 8, 4, 4)),
                 (_p(GATE_ODD, "wgrad"), GgPersistentConfig(128, 256, 64, 8, 8, 3)),
                 (Problem(512, 333, 517, "bf16", 3, "wgrad", "real2"), GgSplitKConfig(128, 128, 64, 2, 8, 3)),
                 (Problem(1024, 512, 384, "bf16", 64, "dgrad"), GgSplitKConfig(64, 128, 64, 2, 4, 3))]
TMA_KERNEL = {"fwd": "_gg_rows_tma_kernel", "dgrad": "_gg_rows_tma_kernel", "wgrad": "_gg_wgrad_tma_kernel"}
POINTER_KERNEL = {"fwd": "_gg_rows_kernel", "dgrad": "_gg_rows_kernel", "wgrad": "_gg_wgrad_kernel"}


def _case(p: Problem, cfg) -> list:
    return [[getattr(p, f.name) for f in dataclasses.fields(p)], cfg.id]


def _from_case(fields: list, cid: str) -> tuple:
    return Problem(*fields), space.config_from_id(cid)


def _ids(cases):
    return [f"{p.key}-{c.id}" for p, c in cases]


@pytest.fixture(scope="module")
def results():
    cases = TMA_CASES + POINTER_CASES
    got = run_child(__file__, "--cases", json.dumps([_case(p, c) for p, c in cases]))
    return dict(zip(map(str, cases), got))


@pytest.mark.parametrize("case", TMA_CASES, ids=_ids(TMA_CASES))
def test_tma_configs_compile_for_sm90(case, results):
    problem, cfg = case
    assert cfg in space.pending_configs("sm90", "bf16") + space.generate_configs("sm90", "bf16"), \
        "a config of no grid"
    assert space.check_feasible(cfg, problem)[0], "a TMA config the rules leave out of this problem"
    assert results[str(case)] == [TMA_KERNEL[problem.stage]], "the TMA kernel's launch must compile"


@pytest.mark.parametrize("case", POINTER_CASES, ids=_ids(POINTER_CASES))
def test_pointer_configs_compile_for_sm90(case, results):
    problem, cfg = case
    assert space.check_feasible(cfg, problem)[0], "a config the space leaves out"
    assert results[str(case)] == [POINTER_KERNEL[problem.stage]], "the pointer kernel's launch must compile"


def _sweep(suites, until: str = "ttgir") -> None:
    """Every persistent_tma config (pending included) and every pointer config of the space on each
    compile key of ``suites``' problems; prints each key's count and its failures (stderr), then a
    JSON summary (stdout)."""
    from gemm_costmodel.kernels.grouped_gemm import suites as S

    # Each compile key's probe (the kernels specialise on neither M nor E beyond the padded group
    # count) with every config feasible on one of the key's problems (split-K needs their M).
    keys: dict = {}
    for name in suites:
        for s in S.SUITES[name]("bf16"):
            p = s.problem
            probe, cfgs = keys.setdefault(space.specialisation(p), (space.probe_problem(p), {}))
            cfgs.update(dict.fromkeys(c for c in space.feasible_configs(p, include_vendor=False)
                                      + space.pending_configs("sm90", "bf16")
                                      if space.check_feasible(c, p)[0]
                                      and (isinstance(c, GgPersistentTmaConfig) or p.stage != "fwd")))
    summary = []
    for p, cfgs in keys.values():
        ops = impl.make_operands(p, "cpu", torch.Generator().manual_seed(0))
        bad, n_tma = [], 0
        for c in cfgs:
            got = compiles(p, c, ops, until)
            n_tma += got == [TMA_KERNEL[p.stage]]
            if len(got) != 1 or got[0].startswith("error"):
                bad.append((c.id, got))
        summary.append([p.key, len(cfgs), n_tma, bad])
        print(p.key, len(cfgs), "configs,", n_tma, "TMA launches,", len(bad), "failing", bad[:5], file=sys.stderr,
              flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    if sys.argv[1] == "--cases":
        out = []
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):
            for case in json.loads(sys.argv[2]):
                out.append(compiles(*_from_case(*case), until="cubin"))
        print(json.dumps(out))
    else:
        until = "cubin" if "--cubin" in sys.argv else "ttgir"
        _sweep([a for a in sys.argv[2:] if a != "--cubin"] or ["gate", "eval"], until)
