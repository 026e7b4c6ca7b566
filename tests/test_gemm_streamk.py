"""Interpreter correctness of the stream-K exploration kernel (kernels/gemm_streamk.py)."""
import pytest
import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels import gemm, gemm_streamk as SK

from conftest import operands_for

# K * element size must be 16-byte aligned (TMA); M, N ragged against the tiles.
SHAPES = [(1, 40, 72), (7, 33, 136), (33, 72, 200), (65, 40, 72), (7, 64, 128)]
CONFIGS = [
    SK.StreamKConfig(16, 32, 32, 8, 4, 3),                      # 4 programs on many tiles: splits mid-tile
    SK.StreamKConfig(64, 64, 32, 8, 4, 3),                      # one or two tiles: every tile is split
    SK.StreamKConfig(16, 32, 64, 2, 4, 3, programs_per_sm=3),   # 12 programs: some own a single K step
]


def _ids(val):
    return "x".join(map(str, val)) if isinstance(val, tuple) else getattr(val, "id", str(val))


def _run(cfg, shape, dtype):
    prob, ops, ref = operands_for(*shape, dtype)
    return C.gate(cfg, ops, ref, dtype, run=lambda: SK.launch(cfg, ops.x, ops.w, ops.out)), ops


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_streamk_matches_reference_and_leaves_buffers_zero(cfg, shape, dtype):
    for _ in range(2):  # the second launch reuses the workspace and counters the first left
        (status, err, why), ops = _run(cfg, shape, dtype)
        assert status == C.STATUS_OK, why
        assert err < C.ERROR_BOUNDS[dtype]
        assert float(SK._zeroed_workspace(ops.x.device, 1).abs().sum()) == 0.0
        assert int(gemm._arrival_counters(ops.x.device, 1).abs().sum()) == 0


def test_streamk_splits_tiles_between_programs():
    """The owner formula ((x + 1) * P - 1) // T agrees with the ranges p * T // P."""
    for total in (1, 7, 10, 72 * 56, 4097):
        for progs in (1, 3, 4, 132, 264):
            starts = [p * total // progs for p in range(progs)]
            for x in range(0, total, max(1, total // 97)):
                owner = ((x + 1) * progs - 1) // total
                assert starts[owner] <= x and (owner + 1 == progs or starts[owner + 1] > x)


def test_streamk_id_and_feasibility():
    cfg = SK.StreamKConfig(128, 256, 64, 8, 8, 3, programs_per_sm=2)
    assert cfg.id == "streamk_m128n256k64_g8_p2_w8s3"
    assert SK.feasible(cfg, 3584, 2) == (True, "")
    assert not SK.feasible(cfg, 3583, 2)[0]
    assert not SK.feasible(SK.StreamKConfig(512, 64, 64, 8, 4, 3), 3584, 2)[0]


def test_gate_classifies_a_failing_exploration_launch():
    prob, ops, ref = operands_for(7, 40, 72, "fp32")

    def boom():
        raise RuntimeError("no such kernel")

    status, err, why = C.gate(CONFIGS[0], ops, ref, "fp32", run=boom)
    assert status == C.STATUS_COMPILE_ERROR and "no such kernel" in why and err != err  # NaN
