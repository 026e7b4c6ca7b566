"""The vLLM-kernel ops ``vllm_moe`` and ``vllm_w8a8_block`` (docs/ops/vllm_moe.md, docs/ops/vllm_w8a8_block.md):
their spaces are vLLM's tuner spaces, their suites the MoE and fp8_blockscale ops' splits, their compile keys
follow vLLM's kernels' int arguments, the training picks and the campaign are what the files say, and a sweep
of them goes through the dataset, training, the runtime and `export-vllm` (with a stand-in kernel: no vLLM
needed). The tests that launch vLLM's own kernels in the Triton CPU interpreter (fp16/fp32) need its source
(COSTMODEL_VLLM_SRC, ./.vllm_src or an installed vllm) and are skipped without it, saying how to supply one."""
from __future__ import annotations

import csv
import itertools
import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import harness as H
from gemm_costmodel.benchmarks import vllm_picks as VP
from gemm_costmodel.kernels import hardware
from gemm_costmodel.kernels.moe import space as MOES
from gemm_costmodel.kernels.moe import suites as MOESU
from gemm_costmodel.kernels.moe import vllm_blockfp8
from gemm_costmodel.kernels.vllm import source, tables
from gemm_costmodel.kernels.vllm_moe import space as VS
from gemm_costmodel.kernels.vllm_w8a8_block import space as BS

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "benchmarks" / "campaigns" / "vllm-kernels-h200.txt"
SMEM = 232448  # sm90's largest shared memory per block
MOE = registry.get("vllm_moe")
BLOCK = registry.get("vllm_w8a8_block")


# -- the spaces are vLLM's tuner spaces ------------------------------------------------------------

def _grid_moe():
    return [VS.VllmMoeConfig(*t) for t in itertools.product((16, 32, 64, 128, 256), (32, 64, 128, 256),
                                                             (64, 128, 256), (1, 16, 32, 64), (4, 8), (2, 3, 4, 5))]


def test_moe_space_is_vllms_tuner_grid_by_shared_memory():
    grid = _grid_moe()
    assert len(grid) == 1920  # vLLM's get_configs_compute_bound (CUDA): 5 x 4 x 3 x 4 x 2 x 4
    for dtype, nbytes, tiled in (("bf16", 2, 1248), ("fp8", 1, 1680)):
        space = [c for c in VS.generate_configs("sm90", dtype) if c.variant == "tiled"]
        assert len(space) == tiled
        fits = {c for c in grid if c.num_stages * (c.block_m + c.block_n) * c.block_k * nbytes <= SMEM}
        assert set(space) == fits  # vLLM's defaults are grid points
        for c in set(grid) - fits:
            assert "shared memory" in VS.static_feasible(c, VS.ARCHS["sm90"], dtype)[1]
    assert [c.id for c in VS.generate_configs("sm90", "bf16")][-1] == "grouped_mm"
    assert "grouped_mm" not in {c.id for c in VS.generate_configs("sm90", "fp8")}


def test_moe_block_fp8_space_is_vllms_pruned_grid_with_its_k_cap_and_defaults():
    space = [c for c in VS.generate_configs("sm90", "fp8bs") if c.variant == "tiled"]
    pruned = {VS.canonical(c, "fp8bs") for c in _grid_moe() if c.block_k % 128 == 0 and c.block_n % 128 == 0}
    assert len(pruned) == 320  # BLOCK_SIZE_K 256 launches as 128: the same kernel as 128
    defaults = {VS.vllm_default(m, 1, "fp8bs") for m in range(1, 300)}
    assert {c.block_n for c in defaults} == {64, 128}  # the M <= 8 default's N tile is off the pruned grid
    shipped = {VS.VllmMoeConfig(*t) for t in vllm_blockfp8.FP8_BLOCK}  # vLLM's block-fp8 files' configs
    fits = {c for c in pruned | defaults | shipped if c.num_stages * (c.block_m + c.block_n) * 128 <= SMEM}
    assert set(space) == fits and len(space) == 298
    assert all(c.block_k == 128 for c in space)


def test_block_linear_space_is_vllms_tuner_grid():
    grid = [BS.VllmBlockConfig(bm, bn, bk, g, w, s) for s, bm, bk, bn, w, g in itertools.product(
        (2, 3, 4, 5), (16, 32, 64, 128, 256), (64, 128), (32, 64, 128, 256), (4, 8), (1, 16, 32, 64))]
    assert [c.id for c in BS.tuner_configs()] == [c.id for c in grid] and len(grid) == 1280
    space = [c for c in BS.generate_configs("sm90", "fp8") if c.variant == "tiled"]
    assert set(space) == {c for c in grid if c.num_stages * (c.block_m + c.block_n) * c.block_k <= SMEM}
    assert len(space) == 1248 and space[0] == BS.vllm_default() and space[0].id == BLOCK.default_config
    assert [c.id for c in BS.generate_configs("sm90", "fp8")][-1] == "cublas"


def test_vllms_shipped_tunings_are_candidates():
    """Every entry of vLLM 0.33.0's H200 fused-MoE files (bf16, fp8, block fp8) is a candidate, but for its
    BLOCK_SIZE_M 8 block-fp8 entries (Hopper's swapped operands only); every entry of its H100 and H200
    block-fp8 linear files is."""
    from gemm_costmodel.kernels.fp8_blockscale import baselines as FB
    from gemm_costmodel.kernels.vllm_moe import baselines as VB

    outside = set()
    for dtype in ("bf16", "fp8", "fp8bs"):
        space = set(VS.generate_configs("sm90", dtype))
        found = VB.load_vllm_tables(gpu_name="NVIDIA H200", dtype=dtype)
        assert found, dtype
        outside |= {(dtype, c.id) for t in found.values() for c in t.values() if c not in space}
    # The project's shared-memory rule (num_stages full A and B tiles) is stricter than Triton's compiler
    # for one bf16 config; the rest are BLOCK_SIZE_M 8.
    assert ("bf16", "vmoe_m16n256k128_g1_w8s4") in outside
    assert all(cid.startswith("vmoe_m8n") for d, cid in outside - {("bf16", "vmoe_m16n256k128_g1_w8s4")})
    assert len(outside) == 6
    space = {c.id for c in BS.generate_configs("sm90", "fp8")}
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        for t in FB.load_vllm_tables(gpu_name=gpu).values():
            for cid in t.values():
                assert BS.from_vllm(FB.space.to_vllm(FB.space.config_from_id(cid))).id in space


@pytest.mark.parametrize("op", ["vllm_moe", "vllm_w8a8_block"])
def test_vllms_configs_run_every_problem_and_the_fallback_is_vllms_default(op):
    spec = registry.get(op)
    space = spec.space_module()
    rng = random.Random(0)
    for dtype in spec.dtypes:
        cfgs = spec.configs("sm90", dtype)
        arrays = space.ConfigArrays(cfgs)
        dicts = [{"variant": c.variant, **space.config_params(c)} for c in cfgs]
        for _ in range(25):
            m, n, k = rng.choice([1, 2, 7, 64, 4097]), rng.randrange(1, 9000), rng.randrange(1, 9000)
            if op == "vllm_moe":
                e = rng.choice([1, 8, 64, 384])
                top_k = rng.randrange(1, min(e, 10) + 1)
                p = space.Problem(m, n, k, dtype, e, top_k, "zipf")
                want = space.vllm_default(m, e, dtype).id
                kw = {"e": e, "top_k": top_k, "dtype": dtype}
            else:
                p, want, kw = space.Problem(m, n, k, dtype), space.vllm_default().id, {}
            mask = space.problem_mask(arrays, p)
            # every tiled config runs every problem, but for those Triton 3.6 cannot compile (vllm_moe)
            assert all(ok or (op == "vllm_moe" and "triton#9809" in space.check_feasible(c, p)[1])
                       for c, ok in zip(cfgs, mask) if c.variant == "tiled")
            assert mask[[c.id for c in cfgs].index(want)]
            assert cfgs[spec.fallback_rule()(m, n, k, 132, dicts, **kw)].id == want


def test_vllm_default_is_vllms_rule():
    # vLLM 0.33.0's get_default_config (CUDA): the per-tensor fp8 default keeps a 128-wide K tile.
    assert VS.vllm_default(1, 8, "bf16").id == "vmoe_m16n64k128_g1_w4s4"
    assert VS.vllm_default(200, 8, "bf16").id == "vmoe_m64n128k64_g1_w8s3"
    assert VS.vllm_default(200, 8, "fp8").id == "vmoe_m64n128k128_g1_w8s3"
    assert VS.vllm_default(4096, 8, "bf16").id == "vmoe_m128n128k64_g16_w8s3"
    assert [VS.vllm_default(m, 256, "fp8bs").id for m in (1, 8, 16, 64, 65)] == [
        "vmoe_m16n64k128_g1_w4s4", "vmoe_m16n64k128_g1_w4s3", "vmoe_m16n128k128_g1_w4s3",
        "vmoe_m16n128k128_g32_w4s3", "vmoe_m64n128k128_g32_w4s3"]
    assert VS.vllm_default(3, 8, "fp16") == VS.vllm_default(3, 8, "bf16")


# -- the suites are the MoE and fp8_blockscale ops' splits ------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp8bs"])
def test_moe_suites_are_the_moe_ops_layers(dtype):
    for name, moe_suite in (("train", MOESU.training_suite), ("eval", MOESU.eval_suite), ("gate", MOESU.gate_suite)):
        ours = MOE.suite(name, dtype)
        stages = moe_suite(dtype)
        assert len(ours) == len({s.key for s in ours}) == len(stages) // 2  # two stages per layer
        want = {(s.m, s.intermediate, s.hidden, s.e, s.top_k, s.routing) for s in stages}
        assert {(s.m, s.n, s.k, s.e, s.top_k, s.routing) for s in ours} == want
    train = {s.family for s in MOE.suite("train", dtype)}
    assert train <= set(MOESU.TRAINING_FAMILIES)
    evals = MOE.suite("eval", dtype)
    assert {s.family for s in evals} <= set(MOESU.HELDOUT_FAMILIES)
    assert {s.key for s in MOE.suite("eval_core", dtype)} <= {s.key for s in evals}


def test_eval_core_problems_share_compile_keys():
    core = MOE.suite("eval_core", "bf16")
    keys = [VS.specialisation(H.shape_problem(MOE, s)) for s in core]
    assert len(set(keys[:6])) == 2 and len(set(keys[:8])) == 3
    assert {s.family for s in core[:6]} == {"qwen3-30b-a3b", "kimi-k2"}
    bcore = BLOCK.suite("eval_core", "fp8")
    bkeys = [BS.specialisation(H.shape_problem(BLOCK, s)) for s in bcore]
    assert len(set(bkeys[:6])) == 1 and len(set(bkeys)) == 2
    assert len({s.family for s in bcore[:6]}) == 6 and all(s.family != "user" for s in bcore)
    train = {(s.n, s.k) for s in BLOCK.suite("train", "fp8")}
    assert {(s.n, s.k) for s in bcore} <= train  # fp8_blockscale's split: held out by family, not (N, K)


# -- compile keys: what vLLM's kernels are compiled for -----------------------------------------------

def _q(x):
    return -(-x // 128)


def _moe_launch_ints(p, block_m):
    """The int arguments vLLM's fused_moe_kernel gets in both launches of a layer (kernels/moe/vllm_kernels.py's
    mirror of vLLM's host code), and its constexprs that depend on the problem."""
    pairs, n, k = p.m * p.top_k, p.n, p.k
    naive = p.m * p.top_k * 4 <= p.e
    em = pairs * block_m if naive else pairs + min(p.e, pairs) * (block_m - 1)
    block = p.dtype == "fp8bs"
    up = [2 * n, k, em, pairs, k, 2 * n * k, k, 2 * n]
    down = [k, n, em, pairs, n, k * n, n, k]
    if block:
        up += [_q(k), _q(2 * n) * _q(k), _q(k) if _q(2 * n) > 1 else 0]
        down += [_q(n), _q(k) * _q(n), _q(n) if _q(k) > 1 else 0]
    classes = tuple((v == 1, v % 16 == 0) for v in up + down)
    return (p.dtype, p.top_k, naive, classes)


def test_same_compile_key_same_int_classes_for_every_block_m():
    """Problems with one ``specialisation`` give vLLM's kernel int arguments of the same classes (== 1,
    divisible by 16: what Triton specialises on) for every BLOCK_SIZE_M, so a config compiled for one runs
    the others from the cache."""
    rng = random.Random(1)
    by_key: dict = {}
    for _ in range(3000):
        dtype = rng.choice(["bf16", "fp8bs"])
        e = rng.choice([2, 3, 8, 16, 40, 64, 128, 384, 512])
        top_k = rng.randrange(1, min(e, 10) + 1)
        p = VS.Problem(rng.choice([1, 2, 3, 7, 16, 64, 100, 1024, 4097]), rng.choice([64, 192, 333, 768, 2048, 4096]),
                       rng.choice([64, 1536, 2048, 2880, 7168]), dtype, e, top_k)
        by_key.setdefault(VS.specialisation(p), []).append(p)
        probe = VS.probe_problem(p)
        assert VS.specialisation(probe) == VS.specialisation(p), p.key
        assert probe.m <= 64 and probe.e <= p.e and probe.n <= max(p.n, 48) and probe.k <= max(p.k, 48)
    shared = 0
    for probs in by_key.values():
        shared += len(probs) > 1
        for bm in (16, 32, 64, 128, 256):
            assert len({_moe_launch_ints(p, bm) for p in probs}) == 1
    assert shared > 20


@pytest.mark.parametrize("op", ["vllm_moe", "vllm_w8a8_block"])
def test_every_suite_problem_has_a_probe_of_its_compile_key(op):
    spec = registry.get(op)
    space = spec.space_module()
    for dtype in spec.dtypes:
        for name in spec.suites:
            for s in spec.suite(name, dtype):
                p = H.shape_problem(spec, s)
                assert space.specialisation(space.probe_problem(p)) == space.specialisation(p), (name, p.key)


def test_block_compile_key_follows_the_kernels_ints():
    def ints(p):
        return tuple((v == 1, v % 16 == 0) for v in (p.m, p.n, p.k, p.k, p.n, _q(p.k)))

    rng = random.Random(2)
    by_key: dict = {}
    for _ in range(2000):
        p = BS.Problem(rng.randrange(1, 5000), rng.randrange(1, 40000), rng.randrange(1, 20000), "fp8")
        by_key.setdefault(BS.specialisation(p), []).append(p)
        assert ints(BS.probe_problem(p)) == ints(p)
    for probs in by_key.values():
        assert len({ints(p) for p in probs}) == 1


# -- features ----------------------------------------------------------------------------------------

def test_runtime_features_equal_training_features():
    from gemm_costmodel.kernels.vllm_moe import features as VF
    from gemm_costmodel.serving import features as F
    from gemm_costmodel.serving.candidates import table as candidate_table

    h200 = hardware.spec_for("NVIDIA H200")
    for dtype in ("bf16", "fp8bs"):
        ct = candidate_table("sm90", dtype, "vllm_moe")
        fz = F.CandidateFeatures(ct.params, ct.variant_code, dtype, h200, "vllm_moe")
        # Per-pair path (1 * 8 * 4 <= 128), a sorted one with a skewed routing.
        for m, n, k, e, top_k, routing in ((1, 384, 2048, 128, 8, "balanced"), (300, 768, 4096, 64, 6, "zipf")):
            idx = np.flatnonzero(ct.feasible_mask(m, n, k))
            cols = {"m": m, "n": n, "k": k, "e": e, "top_k": top_k, "dtype_code": F.DTYPE_CODES[dtype],
                    "variant_code": ct.variant_code[idx], **{p: ct.params[p][idx] for p in F.PARAMS},
                    **F.gpu_columns(h200, dtype)}
            inputs = VF.problem_inputs(m, e, top_k, block_m=ct.params["block_m"][idx], routing=routing)
            cols.update(inputs)
            want = F.compute(cols, "vllm_moe")
            np.testing.assert_array_equal(fz.matrix(idx, m, n, k, e, top_k, inputs), want)
            names = F.feature_names("vllm_moe")
            assert np.isfinite(want).all()
            per_pair = want[:, names.index("per_pair")]
            assert (per_pair == (1.0 if m == 1 else 0.0)).all()
            swap = want[:, names.index("swap_ab_rule")]
            assert swap.any() == (dtype == "fp8bs")


# -- vLLM's source: ./.vllm_src -------------------------------------------------------------------------

def test_find_source_takes_the_prepared_folder_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(source.ENV_SRC, raising=False)
    monkeypatch.chdir(tmp_path)
    found, why = source.find_source()
    if source.installed_package_dir() is None:
        assert found is None and source.DEFAULT_SRC_DIR in why
    f = tmp_path / source.DEFAULT_SRC_DIR / source.FUSED_MOE_PY
    f.parent.mkdir(parents=True)
    f.write_text("# vLLM's file\n")
    found, _ = source.find_source()
    assert found is not None and found.where == source.DEFAULT_SRC_DIR and found.has(source.FUSED_MOE_PY)
    other = tmp_path / "other"
    (other / source.FUSED_MOE_PY).parent.mkdir(parents=True)
    (other / source.FUSED_MOE_PY).write_text("#\n")
    monkeypatch.setenv(source.ENV_SRC, str(other))
    assert source.find_source()[0].where == str(other)  # the variable wins


@pytest.mark.parametrize("op", ["vllm_moe", "vllm_w8a8_block"])
def test_a_gpu_sweep_without_vllms_source_stops_before_any_candidate(op, tmp_path, monkeypatch):
    """On a GPU without a vLLM source, making a problem's operands raises (the harness stops the sweep with
    the reason) rather than every candidate becoming a compile-error row."""
    spec = registry.get(op)
    impl = spec.impl_module()
    monkeypatch.delenv(source.ENV_SRC, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(impl, "_KERNELS", [])
    if source.installed_package_dir() is not None:
        pytest.skip("a vllm is installed here")
    fields = dict(m=4, n=64, k=128, dtype=spec.dtypes[0], e=8, top_k=2, routing="balanced")
    p = spec.problem_of({f: fields[f] for f in spec.problem_fields})
    with pytest.raises(RuntimeError, match=source.ENV_SRC):
        impl.make_operands(p, "cuda", torch.Generator())


# -- the training picks and the campaign ----------------------------------------------------------------

# vllm-moe-train-bf16-picks.csv (shard 0 of 8) is left out: it was drawn before the space ruled out
# the configs Triton 3.6 cannot compile (triton#9809) and was measured as it is
# (vmoe-train-h200-shard00of08), so it stays the record of that sweep; every other list is the
# generator's now.
PICKS = {"vllm-moe-train-bf16-picks-s1.csv": ("vllm_moe", "bf16", (1, 8)),
         "vllm-moe-train-bf16-picks-s2.csv": ("vllm_moe", "bf16", (2, 8)),
         "vllm-moe-train-fp8-picks.csv": ("vllm_moe", "fp8", (0, 8)),
         "vllm-moe-train-fp8bs-picks.csv": ("vllm_moe", "fp8bs", (0, 8)),
         "vllm-w8a8-block-train-picks.csv": ("vllm_w8a8_block", "fp8", (0, 32)),
         "vllm-w8a8-block-train-picks-s1.csv": ("vllm_w8a8_block", "fp8", (1, 32))}


@pytest.mark.parametrize("name", sorted(PICKS))
def test_committed_picks_are_the_generators(name):
    op, dtype, shard = PICKS[name]
    with open(ROOT / "benchmarks" / "campaigns" / name, newline="", encoding="utf-8") as fh:
        rows = [tuple(r) for r in csv.reader(fh)]
    assert rows[0] == ("key", "candidate")
    want = VP.keyed_picks(op, dtype, shard)
    assert rows[1:] == [tuple(r) for r in want]
    spec = registry.get(op)
    space = spec.space_module()
    held = {s.key for n in ("eval", "eval_core") for s in spec.suite(n, dtype)}
    probs = {}
    for s in H.shard_shapes(spec.suite("train", dtype), shard):
        probs[s.key] = H.shape_problem(spec, s)
    per_key: dict = {}
    by_problem: dict = {}
    for key, cid in want:
        assert key in probs and key not in held
        by_problem.setdefault(key, []).append(cid)
        per_key.setdefault(space.specialisation(probs[key]), set()).add(cid)
    assert all(len(v) == 9 for v in by_problem.values())  # vLLM's default + 8 of the pool
    for key, cids in by_problem.items():
        p = probs[key]
        default = space.vllm_default(p.m, p.e, p.dtype) if op == "vllm_moe" else space.vllm_default()
        assert cids[0] == default.id
    # Per compile key at most 32 pooled configs plus the defaults of its problems: far fewer compiles
    # than measurements.
    assert sum(len(v) for v in per_key.values()) < len(want) / 2


def test_campaign_lines_and_their_estimates():
    """The campaign's lines are `costmodel bench` sweeps of the two ops, its table is what they select, and
    its measurements fit about 10 device-minutes at 70 a second."""
    from gemm_costmodel.cli import build_parser

    lines = VP.campaign_lines(str(CAMPAIGN))
    assert lines
    parser = build_parser()
    for name, args in lines:
        a = parser.parse_args(["bench", "--name", name, *args])
        assert a.op in ("vllm_moe", "vllm_w8a8_block") and a.suite in registry.get(a.op).suites
        if a.mode.startswith("pick:"):
            assert (ROOT / a.mode[5:]).is_file()
    text = CAMPAIGN.read_text()
    total = 0
    for r in VP.estimate(str(CAMPAIGN)):
        row = re.search(rf"^#\s+{re.escape(r['name'])}\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)", text, re.M)
        assert row, r["name"]
        assert [int(v.replace(",", "")) for v in row.groups()] == [r["problems"], r["measurements"], r["tasks"]]
        total += r["measurements"]
    assert total <= 10 * 60 * VP.MEASUREMENTS_PER_S


# -- baselines ------------------------------------------------------------------------------------------

def test_baselines_are_vllms_default_and_its_h200_tuning():
    import pandas as pd

    from gemm_costmodel.kernels.vllm_moe import baselines as VB

    ev = pd.DataFrame([
        # Qwen3-30B-A3B TP2 (E=128, N=384): vLLM ships an H200 bf16 file; Kimi-K2 TP8 (E=384, N=256): none.
        {"sid": "a", "gpu_name": "NVIDIA H200", "dtype": "bf16", "m": 64, "n": 384, "k": 2048, "e": 128, "top_k": 8},
        {"sid": "b", "gpu_name": "NVIDIA H200", "dtype": "bf16", "m": 64, "n": 256, "k": 7168, "e": 384, "top_k": 8}])
    picks = VB.picks(ev, ev.iloc[:0])
    tuned = VB.load_vllm_tables(gpu_name="NVIDIA H200", dtype="bf16")[(128, 384)]
    assert picks["vllm_tuned"]["a"] == tuned[min(tuned, key=lambda x: abs(x - 64))].id
    assert picks["vllm_tuned"]["b"] == picks["vllm_default"]["b"] == VS.vllm_default(64, 384, "bf16").id


# -- a sweep through the dataset, training, the runtime and export-vllm (a stand-in kernel) -------------

def _stand_in(impl, monkeypatch):
    """The op's kernel replaced by its reference (no vLLM here): the harness's gate passes, the rows carry
    the fake timer's latencies."""
    ref = impl.reference
    memo = {}  # one reference per operand set: every candidate of a problem gets the same output

    def launch(cfg, *args):
        ops = args[0] if len(args) == 1 else impl.Operands(*args)
        key = tuple(id(t) for t in vars(ops).values())
        if key not in memo:
            memo[key] = (ops, ref(ops))  # the operands kept alive: their ids stay theirs
        return ops.out.copy_(memo[key][1])

    monkeypatch.setattr(impl, "launch", launch)


def _latency(key: str) -> float:
    """Fake latencies with a pattern a model can learn: larger M tiles cost more at small M."""
    m = int(key.split("|")[2])
    tile = re.search(r"_m(\d+)n(\d+)", key)
    bm = int(tile.group(1)) if tile else 64
    return 10.0 + bm / m + (H.stable_hash(key) % 7) * 0.01


def _sweep_train_export(tmp_path, op, shapes, dtype):
    from gemm_costmodel.benchmarks.store import ResultStore
    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.kernels.timing import FakeTimer
    from gemm_costmodel.learning import pipeline
    from gemm_costmodel.learning.model import TrainConfig

    from conftest import PROVENANCE

    raw = tmp_path / "raw"
    raw.mkdir()
    prov = {**PROVENANCE, "gpu_name": "NVIDIA H200"}
    with ResultStore(raw / f"{op}.jsonl") as store:
        stats = H.run_sweep(shapes, store, FakeTimer(_latency), mode="sample:4", seed=0, device="cpu", op=op,
                            provenance=prov, progress=False)
    assert stats.statuses and set(stats.statuses) == {"ok"}, stats.statuses
    paths = D.build_parquet([str(raw / f"{op}.jsonl")], out_root=str(tmp_path / "datasets"), log=lambda m: None)
    df = pipeline.load_training_frame(paths, op=op)
    assert set(df["dtype"]) == {dtype} and (df["op"] == op).all()
    # The op's own training defaults (as `costmodel run --op` takes them), few small trees.
    config = TrainConfig().with_(**{**registry.get(op).train_defaults, "n_estimators": 10, "max_depth": 3, "n_jobs": 1})
    model = pipeline.train(df, config, log=lambda m: None)
    models = tmp_path / "models"
    pipeline.export_model(model, df, str(models), arch="sm90", log=lambda m: None)
    return str(models)


def test_moe_sweep_evaluation_model_and_export_rank_vllms_kernel(tmp_path, monkeypatch):
    """Training rows (sampled) and two held-out families' problems in full, through the dataset, the
    held-out evaluation with vLLM's baselines, training and export, then the runtime and `export-vllm`."""
    from gemm_costmodel.benchmarks.store import ResultStore
    from gemm_costmodel.data import dataset as D
    from gemm_costmodel.learning import pipeline
    from gemm_costmodel.learning.model import TrainConfig
    from gemm_costmodel.kernels.shapes import ProblemShape
    from gemm_costmodel.kernels.timing import FakeTimer
    from gemm_costmodel.kernels.vllm_moe import impl
    from gemm_costmodel.learning import vllm_export as V
    from gemm_costmodel.serving.runtime import Dispatcher

    from conftest import PROVENANCE

    _stand_in(impl, monkeypatch)
    train = [ProblemShape(VS.Problem(m, n, k, "bf16", e, 2, r), (f"{fam}/x/tp1",))
             for fam, (n, k, e) in (("olmoe-1b-7b", (32, 64, 4)), ("olmoe-1b-7b", (64, 128, 8)),
                                    ("mixtral-8x7b", (48, 64, 16)))
             for m, r in itertools.product((1, 3, 8, 33), ("balanced", "zipf"))]
    evals = [ProblemShape(VS.Problem(16, n, 64, "bf16", e, 2), (f"{fam}/x/tp2",))
             for fam, n, e in (("qwen3-30b-a3b", 32, 8), ("kimi-k2", 48, 16))]
    prov = {**PROVENANCE, "gpu_name": "NVIDIA H200"}
    raw = []
    for name, shapes, mode in (("train", train, "sample:4"), ("eval", evals, "all")):
        raw.append(str(tmp_path / f"{name}.jsonl"))
        with ResultStore(raw[-1]) as store:
            stats = H.run_sweep(shapes, store, FakeTimer(_latency), mode=mode, seed=0, device="cpu", op="vllm_moe",
                                provenance=prov, progress=False)
        assert set(stats.statuses) == {"ok"}, stats.statuses
    paths = D.build_parquet(raw, out_root=str(tmp_path / "datasets"), log=lambda m: None)
    df = pipeline.load_training_frame(paths, op="vllm_moe")
    config = TrainConfig().with_(**{**MOE.train_defaults, "n_estimators": 10, "max_depth": 3, "n_jobs": 1})
    # The held-out evaluation (`costmodel run`'s first step): both families' problems, scored against vLLM's
    # default and tuned picks in vLLM's kernel.
    results, _ = pipeline.evaluate(df, config, schemes=("family",), log=lambda m: None)["family"]
    assert {"model", "oracle", "vllm_default", "vllm_tuned"} <= set(results["method"])
    assert results.groupby("method")["shape"].nunique()["model"] == 2
    models = str(tmp_path / "models")
    pipeline.export_model(pipeline.train(df, config, log=lambda m: None), df, models, arch="sm90", log=lambda m: None)
    d = Dispatcher(gpu_name="NVIDIA H200", models_dir=models, op="vllm_moe")
    assert d.model_for("bf16") is not None
    assert d.select(8, 128, 2048, "bf16", e=64, top_k=8, routing="zipf").source == "model"
    out = tmp_path / "vllm"
    (path, table), = V.export_moe([(64, 256, 2048, 8)], str(out), gpu_name="NVIDIA H200", models_dir=models)
    assert table.counts()["model"] == len(V.VLLM_M_GRID)
    for entry in json.loads(Path(path).read_text()).values():
        assert VS.from_vllm(entry) in set(VS.generate_configs("sm90", "bf16"))
    side = json.loads((out / V.SIDECAR).read_text())["files"][table.file_name]
    assert side["op"] == "moe" and side["ranked_with"]["op"] == "vllm_moe"
    assert side["ranked_with"]["kernel"] == "vllm" and side["ranked_with"]["model"] == "vllm_moe-sm90.onnx"
    assert side["m"]["16"]["combine"] == "layer"
    assert "vLLM's own kernel" in V.summary_line(path, table)
    # Without the vllm_moe model (fp8 here): the MoE op's dispatcher, as before, and the sidecar says why.
    (path, table), = V.export_moe([(64, 256, 2048, 8)], str(out), gpu_name="NVIDIA H200", models_dir=models,
                                  dtype="fp8")
    rw = json.loads((out / V.SIDECAR).read_text())["files"][table.file_name]["ranked_with"]
    assert rw["op"] == "moe" and rw["kernel"] == "project" and "no vllm_moe model" in rw["vllm_kernel_model"]


def test_block_sweep_dataset_model_and_export_rank_vllms_kernel(tmp_path, monkeypatch):
    from gemm_costmodel.kernels.vllm_w8a8_block import impl
    from gemm_costmodel.learning import vllm_export as V

    from gemm_costmodel.kernels.shapes import Shape

    _stand_in(impl, monkeypatch)
    shapes = [Shape(m, n, k, "fp8", ("qwen2.5/x/o_proj/tp1",))
              for m, (n, k) in itertools.product((1, 4, 16, 33), ((128, 512), (256, 128), (48, 1024), (96, 256),
                                                                  (64, 64), (160, 384)))]
    models = _sweep_train_export(tmp_path, "vllm_w8a8_block", shapes, "fp8")
    out = tmp_path / "vllm"
    (path, table), = V.export([(1536, 1536)], str(out), gpu_name="NVIDIA H200", models_dir=models)
    assert table.counts()["model"] == len(V.VLLM_M_GRID)
    for entry in json.loads(Path(path).read_text()).values():
        assert BS.from_vllm(entry) in set(BS.generate_configs("sm90", "fp8"))
    side = json.loads((out / V.SIDECAR).read_text())["files"][table.file_name]
    assert side["op"] == "fp8_blockscale" and side["ranked_with"]["op"] == "vllm_w8a8_block"
    assert side["ranked_with"]["kernel"] == "vllm"
    # An empty model folder: the fp8_blockscale dispatcher, as before.
    empty = tmp_path / "none"
    empty.mkdir()
    (path, table), = V.export([(1536, 1536)], str(tmp_path / "v2"), gpu_name="NVIDIA H200", models_dir=str(empty))
    rw = json.loads((tmp_path / "v2" / V.SIDECAR).read_text())["files"][table.file_name]["ranked_with"]
    assert rw["op"] == "fp8_blockscale" and rw["kernel"] == "project" and "vllm_w8a8_block" in rw["vllm_kernel_model"]


# -- vLLM's own kernels in the interpreter (need vLLM's source) -------------------------------------------

SRC, WHY = source.find_source()
needs_vllm = pytest.mark.skipif(SRC is None, reason=WHY or "no vLLM source")


def _rel(y, ref):
    return float((y.float() - ref).norm() / ref.norm())


@needs_vllm
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_vllms_moe_kernel_runs_layers_through_the_harness_gate(dtype):
    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.kernels.vllm_moe import impl

    # The sorted path (align), the per-pair path (1 * 2 * 4 <= 16), a skewed routing, N and K off 16.
    for m, n, k, e, top_k, routing in ((20, 48, 64, 4, 2, "zipf"), (1, 40, 136, 16, 2, "balanced"),
                                       (33, 33, 72, 8, 3, "real2")):
        p = VS.Problem(m, n, k, dtype, e, top_k, routing)
        ops = impl.make_operands(p, "cpu", torch.Generator().manual_seed(m))
        ref = impl.reference(ops)
        cfgs = MOE.feasible_configs(p, include_vendor=False)
        for cfg in (cfgs[0], VS.VllmMoeConfig(32, 32, 64, 16, 4, 2), cfgs[-1]):
            status, err, why = C.gate(cfg, ops, ref, dtype, bounds=impl.ERROR_BOUNDS)
            assert status == C.STATUS_OK, (p.key, cfg.id, why)
        # The timing copies shift the experts: still the layer of their own ids.
        for cp in impl.timing_copies(ops, 3)[1:]:
            assert _rel(cp.run(cfgs[0]), impl.reference(cp)) <= impl.ERROR_BOUNDS[dtype]


@needs_vllm
@pytest.mark.parametrize("storage", [torch.float32, torch.float16])
def test_vllms_moe_kernel_block_fp8_path_with_stand_in_storage(storage):
    """vLLM's block-scaled path (per-token-group activations, 128x128 weight blocks; on Hopper its swapped
    operands too) on fp32/fp16 stand-ins for fp8 (the interpreter's fp8 dots are garbage)."""
    from gemm_costmodel.kernels.moe import vllm_kernels as VK
    from gemm_costmodel.kernels.vllm_moe import impl

    bound = 1e-5 if storage == torch.float32 else 2e-3
    for m, n, k, e, top_k in ((5, 128, 256, 4, 2), (1, 200, 300, 16, 2)):
        p = VS.Problem(m, n, k, "fp8bs", e, top_k, "zipf")
        ops = impl.make_operands(p, "cpu", torch.Generator().manual_seed(3), storage=storage)
        ref = impl.reference(ops)
        for cfg in (VS.vllm_default(m, e, "fp8bs"), VS.VllmMoeConfig(32, 128, 128, 16, 4, 3)):
            for swap in (False, True):
                y = VK.fused_experts(impl.kernels(), ops.x, ops.w1, ops.w2, ops.topk_weights, ops.topk_ids,
                                     VS.to_vllm(cfg), w1_scale=ops.w1_scale, w2_scale=ops.w2_scale, swap_ab=swap,
                                     out=ops.out)
                assert y.data_ptr() == ops.out.data_ptr() and _rel(y, ref) <= bound, (p.key, cfg.id, swap)


@needs_vllm
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_vllms_block_linear_kernel_through_the_harness_gate(dtype):
    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.kernels.vllm_w8a8_block import impl

    for m, n, k in ((1, 40, 136), (7, 200, 256), (33, 72, 520)):
        p = BS.Problem(m, n, k, dtype)
        ops = impl.make_operands(p, "cpu", torch.Generator().manual_seed(m))
        ref = impl.reference(ops)
        cfgs = BLOCK.feasible_configs(p, include_vendor=False)
        for cfg in (cfgs[0], BS.VllmBlockConfig(16, 32, 64, 1, 4, 3), cfgs[-1]):
            status, err, why = C.gate(cfg, ops, ref, dtype, bounds=impl.ERROR_BOUNDS)
            assert status == C.STATUS_OK, (p.key, cfg.id, why)


@needs_vllm
def test_a_prepared_vllm_src_folder_compiles_the_kernels(tmp_path, monkeypatch):
    """What the GPU host carries (`vllm_compare prepare`'s .vllm_src) is enough for the kernels, found in
    the current folder without COSTMODEL_VLLM_SRC."""
    from gemm_costmodel.benchmarks import vllm_compare
    from gemm_costmodel.kernels.moe import vllm_kernels as VK

    if SRC.root is not None:
        pytest.skip("the vLLM source here is a folder, not a wheel to prepare from")
    vllm_compare.prepare(SRC.where, str(tmp_path / source.DEFAULT_SRC_DIR))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(source.ENV_SRC, raising=False)
    found, why = source.find_source()
    assert found is not None and found.where == source.DEFAULT_SRC_DIR, why
    mod = VK.compile_kernels(found)
    assert hasattr(mod, "fused_moe_kernel") and hasattr(mod, "_w8a8_triton_block_scaled_mm")
