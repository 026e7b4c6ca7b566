"""Interpreter correctness of the stream-K exploration kernel (benchmarks/explore/gemm_streamk.py):
the data-parallel + stream-K hybrid schedule and its deterministic, atomic-free fixup.

The kernel is a record outside the installed package; pytest puts benchmarks/explore/ on the
path (pyproject's pythonpath), so it imports as the explore scripts import it."""
import pytest
import torch

from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.gemm import kernel as gemm

import gemm_streamk as SK
from conftest import operands_for

SMALL = SK.StreamKConfig(16, 32, 32, 2, 4, 3)


def _cdiv(a, b):
    return -(-a // b)


def _tiles(cfg, m, n, k):
    return _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n), _cdiv(k, cfg.block_k)


def _schedule(tiles, k_tiles, programs):
    """Python mirror of the kernel's schedule: (dp_tiles, per stream-K tile the list of
    (program, k0, k1, slot) contributions, the slots the fixup reads for it, in order)."""
    dp, sk = SK.split(tiles, programs)
    total = sk * k_tiles
    q_ = min(programs, total)
    contrib = {t: [] for t in range(sk)}
    for p in range(q_):
        s, e = p * total // q_, (p + 1) * total // q_
        assert e > s  # no empty range
        first_t, last_t = s // k_tiles, (e - 1) // k_tiles
        for t in range(first_t, last_t + 1):
            k0, k1 = max(s - t * k_tiles, 0), min(e - t * k_tiles, k_tiles)
            slot = None if (k0, k1) == (0, k_tiles) else 2 * p + (t != first_t)
            contrib[t].append((p, k0, k1, slot))
    reads = {}
    for t in range(sk):
        tb = t * k_tiles
        first = ((tb + 1) * q_ - 1) // total
        last = ((tb + k_tiles) * q_ - 1) // total
        first_slot = 2 * first + (first * total // q_ < tb)
        reads[t] = [first_slot] + [2 * q for q in range(first + 1, last + 1)]
    return dp, contrib, reads


def _max_contributors(cfg, shape, programs):
    t, kt = _tiles(cfg, *shape)
    programs = min(programs, t * kt)
    _, contrib, _ = _schedule(t, kt, programs)
    return max((len(c) for c in contrib.values()), default=0)


def _regime(cfg, shape, programs):
    t, kt = _tiles(cfg, *shape)
    p = min(programs, t * kt)
    if t < p:
        return "all-sk"
    if t % p == 0:
        return "all-dp"
    return "dp+2sk" if t >= 2 * p else "dp+sk"


def _counters_zero(device):
    return int(gemm._arrival_counters(device, 1).abs().sum()) == 0


# (shape, programs, schedule): M in {1, 7, 33, 257}; N and K ragged against 16x32x32 tiles;
# K * element size 16-byte aligned (TMA). N = 33 / 100 also switch y between pointer and
# TMA stores (fp16 rows of 66 bytes are not 16-byte aligned).
CASES = [
    ((1, 40, 72), 4, "all-sk"),       # 2 tiles x 3 k-steps on 4 programs: both tiles split
    ((1, 40, 72), 8, "all-sk"),       # more programs than iterations: grid clamped to 6
    ((7, 33, 136), 3, "all-sk"),
    ((33, 72, 200), 3, "all-dp"),     # 9 tiles, 3 programs
    ((33, 72, 200), 4, "dp+2sk"),     # 9 = 1 + 2 * 4: 4 DP tiles, 5 SK tiles
    ((33, 72, 200), 5, "dp+sk"),      # 9 = 5 + 4: one DP wave, 4 SK tiles
    ((257, 100, 40), 4, "all-dp"),    # 68 tiles
    ((257, 100, 40), 5, "dp+2sk"),    # 68 = 60 + 8
]


def _ids(val):
    return "x".join(map(str, val)) if isinstance(val, tuple) else getattr(val, "id", str(val))


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape,programs,regime", CASES, ids=[f"{_ids(s)}-p{p}" for s, p, _ in CASES])
def test_streamk_matches_reference_and_leaves_counters_zero(shape, programs, regime, dtype):
    assert _regime(SMALL, shape, programs) == regime
    prob, ops, ref = operands_for(*shape, dtype)
    for _ in range(2):  # the second launch reuses the counters the first left
        status, err, why = C.gate(SMALL, ops, ref, dtype,
                                  run=lambda: SK.launch(SMALL, ops.x, ops.w, ops.out, programs=programs))
        assert status == C.STATUS_OK, why
        assert err < C.ERROR_BOUNDS[dtype]
        assert _counters_zero(ops.x.device)


CONFIGS = [
    SK.StreamKConfig(16, 32, 32, 8, 4, 3),                      # 4 programs (CPU "SMs")
    SK.StreamKConfig(64, 64, 32, 8, 4, 3),                      # one or two tiles: all stream-K
    SK.StreamKConfig(16, 32, 64, 2, 4, 3, programs_per_sm=3),   # 12 programs: some own a single K step
]


@pytest.mark.parametrize("shape", [(7, 33, 136), (65, 40, 72)], ids=_ids)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_streamk_default_grid(cfg, shape):
    prob, ops, ref = operands_for(*shape, "fp32")
    status, err, why = C.gate(cfg, ops, ref, "fp32", run=lambda: SK.launch(cfg, ops.x, ops.w, ops.out))
    assert status == C.STATUS_OK, why
    assert _counters_zero(ops.x.device)


@pytest.mark.parametrize("shape,programs", [((1, 40, 72), 5), ((33, 72, 200), 7), ((7, 40, 264), 7)],
                         ids=_ids)
def test_streamk_is_deterministic(shape, programs):
    """Bitwise identical across launches and arrival orders. The interpreter runs programs
    in ascending order, so the last arrival is always the highest contributor; the
    reversed numbering makes it the lowest (the other fixup branch). fp32 and tiles of 3+
    contributors, where a sum in arrival order would differ (checked by mutating the kernel)."""
    assert _max_contributors(SMALL, shape, programs) >= 3
    prob, ops, ref = operands_for(*shape, "fp32")
    outs = []
    for rev in (False, False, True, True):
        ops.out.fill_(float("nan"))
        outs.append(SK.launch(SMALL, ops.x, ops.w, ops.out, programs=programs, _reversed=rev).clone())
        assert _counters_zero(ops.x.device)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert C.check_output(outs[0], ref, "fp32")[0]


@pytest.mark.parametrize("shape,programs", [((7, 48, 96), 3), ((33, 64, 160), 4)], ids=_ids)
def test_streamk_fp8_scales(shape, programs):
    """Per-tensor scales on whole stream-K tiles, DP tiles and fixed-up tiles."""
    prob, ops, ref = operands_for(*shape, "fp8")
    status, err, why = C.gate(SMALL, ops, ref, "fp8", run=lambda: SK.launch(
        SMALL, ops.x, ops.w, ops.out, ops.scale_a, ops.scale_b, programs=programs))
    assert status == C.STATUS_OK, why
    assert _counters_zero(ops.x.device)


@pytest.mark.parametrize("n", [33, 40], ids=str)
def test_streamk_strided_output(n):
    """y may be a column slice of a wider buffer (pointer stores for N = 33, TMA for 40)."""
    prob, ops, ref = operands_for(33, n, 72, "fp16")
    wide = torch.full((33, n + 8), float("nan"), dtype=torch.float16)  # rows of 82 / 96 bytes
    out = wide[:, :n]
    assert SK._y_tma_ok(out) == (n == 40)
    SK.launch(SMALL, ops.x, ops.w, out, programs=5)
    assert C.check_output(out, ref, "fp16")[0]
    assert torch.isnan(wide[:, n:]).all()  # nothing written past N


def test_streamk_y_store_paths_are_both_covered():
    # fp16 rows of 33 elements are 66 bytes: pointer stores; 40 are 80: TMA.
    assert not SK._y_tma_ok(torch.empty(7, 33, dtype=torch.float16))
    assert SK._y_tma_ok(torch.empty(7, 40, dtype=torch.float16))
    assert SK._y_tma_ok(torch.empty(7, 100, dtype=torch.float32))


def test_streamk_split_rule():
    assert SK.split(72, 132) == (0, 72)          # fewer tiles than programs: all stream-K
    assert SK.split(264, 132) == (264, 0)        # full waves: all data-parallel
    assert SK.split(200, 132) == (132, 68)       # one wave + a partial one: DP + the remainder
    assert SK.split(300, 132) == (132, 168)      # T >= 2P: the remainder plus one full wave
    assert SK.split(5, 1) == (5, 0)


@pytest.mark.parametrize("tiles,k_tiles,programs", [
    (72, 56, 132), (72, 56, 264), (200, 56, 132), (300, 7, 132), (2, 3, 4), (5, 1, 4), (9, 7, 4),
    (1, 1000, 132), (3, 2, 5), (67, 1, 132),
])
def test_streamk_schedule_covers_each_iteration_once_and_fixup_reads_the_right_slots(tiles, k_tiles,
                                                                                     programs):
    """At real sizes (the interpreter can't run them): the stream-K ranges cover every
    (tile, k) once, each program writes at most two partial slots, no slot is written
    twice, and the slots the fixup infers for a tile are exactly those its contributors
    wrote, in ascending program order."""
    programs = min(programs, tiles * k_tiles)
    dp, contrib, reads = _schedule(tiles, k_tiles, programs)
    written = []
    for t, cs in contrib.items():
        ks = sorted((k0, k1) for _, k0, k1, _ in cs)
        assert ks[0][0] == 0 and ks[-1][1] == k_tiles
        assert all(a[1] == b[0] for a, b in zip(ks, ks[1:]))
        slots = [s for _, _, _, s in sorted(cs)]
        if len(cs) == 1:
            assert slots == [None]
        else:
            assert None not in slots and reads[t] == slots
            written += slots
    assert len(written) == len(set(written))
    assert all(0 <= s < 2 * programs for s in written)


def test_streamk_splits_tiles_between_programs():
    """The owner formula ((x + 1) * P - 1) // T agrees with the ranges p * T // P."""
    for total in (1, 7, 10, 72 * 56, 4097):
        for progs in (1, 3, 4, 132, 264):
            if progs > total:
                continue  # the kernel shares the stream-K region among min(P, S) programs
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
