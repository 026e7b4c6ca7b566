"""The MoE op's space, routings and features (torch-free) against known answers."""
import glob
import json
import math
import os
import time

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.kernels.vllm import tables
from gemm_costmodel.benchmarks import precompile
from gemm_costmodel.kernels.moe import features as MF
from gemm_costmodel.kernels.moe import routing as R
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.kernels.moe import vllm_blockfp8, vllm_h100
from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel.serving.candidates import table

VLLM_DIR = tables.tables_dir(tables.KIND_MOE)  # vLLM 0.33.0's tables, kept in the repository


def test_vllm_h100_tables_are_the_distinct_configs_of_vllms_files():
    want = {"bf16": set(), "fp8": set()}
    for path in glob.glob(os.path.join(VLLM_DIR, "*NVIDIA_H100_80GB_HBM3*.json")):
        name = os.path.basename(path)
        if "int8" in name or "block_shape" in name:
            continue
        dt = "fp8" if ("fp8" in name or "float8" in name) else "bf16"
        for entry in json.load(open(path)).values():
            if isinstance(entry, dict):
                want[dt].add(tuple(entry[k] for k in S.VLLM_KEYS))
    assert set(vllm_h100.BF16) == want["bf16"] and len(want["bf16"]) == 206
    assert set(vllm_h100.FP8) == want["fp8"] and len(want["fp8"]) == 129


def test_space_holds_vllms_defaults_and_feasible_tuned_picks():
    ids = {c.id for c in S.generate_configs("sm90", "bf16")}
    for m in (1, 32, 33, 64, 65, 96, 97, 512, 513, 4096):
        for e in (1, 8, 64, 512):
            assert S.vllm_default(m, e).id in ids
    # vLLM's get_default_config (its README): M = 1, 33, 97, 513 with E = 8.
    assert S.vllm_default(1, 8) == S.MoeTiledConfig(16, 64, 128, 1, 4, 4)
    assert S.vllm_default(33, 8) == S.MoeTiledConfig(32, 64, 128, 1, 4, 3)
    assert S.vllm_default(97, 8) == S.MoeTiledConfig(64, 128, 64, 1, 4, 3)
    assert S.vllm_default(513, 8) == S.MoeTiledConfig(128, 128, 64, 1, 8, 3)
    assert S.vllm_default(2048, 8).group_m == 16 and S.vllm_default(2048, 16).group_m == 1
    assert S.vllm_default(97, 8, "fp8").block_k == 128
    out = [t for t in vllm_h100.BF16 if S.MoeTiledConfig(*t).id not in ids]
    assert len(out) == 5 and all(S.smem_bytes(S.MoeTiledConfig(*t), "bf16") > 232448 for t in out)
    assert "grouped_mm" in ids and "grouped_mm" not in {c.id for c in S.generate_configs("sm90", "fp8")}


def test_vllm_blockfp8_table_is_what_vllm_launches_from_its_block_files():
    """Every entry of vLLM's H100/H200 block-fp8 MoE files, BLOCK_SIZE_K capped at 128 as vLLM's
    launch caps it; the BLOCK_SIZE_M 8 entries (vLLM's Hopper swap-AB path) left out."""
    want, dropped = set(), set()
    for path in glob.glob(os.path.join(VLLM_DIR, "*,dtype=fp8_w8a8,block_shape=[[]128,128[]].json")):
        for entry in json.load(open(path)).values():
            if isinstance(entry, dict):
                t = tuple(min(entry[k], 128) if k == "BLOCK_SIZE_K" else entry[k] for k in S.VLLM_KEYS)
                (dropped if t[0] < 16 else want).add(t)
    assert set(vllm_blockfp8.FP8_BLOCK) == want and len(want) == 37 and len(dropped) == 5


def test_fp8bs_space_rules_defaults_and_no_vendor():
    """fp8bs: a K tile within one 128-column scale group (tiled, swap-AB), whole groups per GEMV K
    tile, any BLOCK_N; vLLM's block default for every M; no vendor (torch._grouped_mm has no fp8)."""
    cfgs = S.generate_configs("sm90", "fp8bs")
    ids = {c.id for c in cfgs}
    assert "grouped_mm" not in ids
    ok, why = S.static_feasible(S.VENDOR, S.ARCHS["sm90"], "fp8bs")
    assert not ok and "block-scaled" in why
    for c in cfgs:
        if c.variant == "gemv":
            assert c.block_k % 128 == 0
        else:
            assert 128 % c.block_k == 0 and c.block_k >= 32
    assert {c.block_n for c in cfgs if c.variant == "tiled"} >= {32, 64, 128, 256}
    p = S.Problem(16, 4096, 7168, "fp8bs", 256, 8, "gate_up")
    ok, why = S.check_feasible(S.MoeTiledConfig(16, 64, 256, 1, 4, 3), p)
    assert not ok and "divide the 128-column scale group" in why
    assert S.check_feasible(S.MoeTiledConfig(16, 64, 256, 1, 4, 3), S.Problem(16, 4096, 7168, "fp8", 256, 8,
                                                                                "gate_up"))[0]
    # vLLM 0.33.0's get_default_config with block_shape [128, 128] on CUDA.
    assert S.vllm_default(1, 256, "fp8bs") == S.MoeTiledConfig(16, 64, 128, 1, 4, 4)
    assert S.vllm_default(8, 256, "fp8bs") == S.MoeTiledConfig(16, 64, 128, 1, 4, 3)
    assert S.vllm_default(16, 256, "fp8bs") == S.MoeTiledConfig(16, 128, 128, 1, 4, 3)
    assert S.vllm_default(64, 256, "fp8bs") == S.MoeTiledConfig(16, 128, 128, 32, 4, 3)
    assert S.vllm_default(65, 256, "fp8bs") == S.MoeTiledConfig(64, 128, 128, 32, 4, 3)
    for m in (1, 4, 5, 8, 9, 16, 17, 64, 65, 4096):
        assert S.vllm_default(m, 8, "fp8bs").id in ids
    # The rule without a model answers vLLM's block default for fp8bs (and the bf16 default otherwise).
    cands = [{"variant": c.variant, **S.config_params(c)} for c in cfgs]
    for m in (1, 8, 16, 64, 65, 2048):
        assert cfgs[S.choose(m, 4096, 7168, 132, cands, e=256, top_k=8, dtype="fp8bs")] == S.vllm_default(m, 256,
                                                                                                           "fp8bs")
    # The existing dtypes' spaces are unchanged by the new one (the shipped manifests' hashes).
    assert S.space_hash(S.generate_configs("sm90", "bf16")) == "838d60482071c3b6"
    assert S.space_hash(S.generate_configs("sm90", "fp8")) == "acfd541f097b48db"


@pytest.mark.parametrize("kw, match", [
    (dict(e=0), "e must be in 1..512"), (dict(e=513), "e must be in 1..512"),
    (dict(top_k=9), "top_k must be in 1..e=8"), (dict(stage="up"), "stage must be one of"),
    (dict(n=1001), "n must be even for stage gate_up"), (dict(routing="uniform"), "routing must be one of"),
    (dict(m=0), "m must be >= 1"), (dict(dtype="int8"), "dtype must be one of"),
])
def test_problem_names_the_bad_field(kw, match):
    args = dict(m=4, n=1000, k=64, dtype="bf16", e=8, top_k=2, stage="gate_up", routing="balanced")
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        S.Problem(**args)


def test_vendor_rule_needs_k_multiple_of_8():
    p = S.Problem(4, 1000, 104, "bf16", 8, 2, "down")
    assert S.check_feasible(S.VENDOR, p) == (True, "")
    ok, why = S.check_feasible(S.VENDOR, S.Problem(4, 1000, 101, "bf16", 8, 2, "down"))
    assert not ok and "K divisible by 8" in why


def test_precompile_probes_the_moe_gemv_on_its_own_weight_shape():
    """The GEMV compiles per weight shape (N, K and strides constant): its precompile probe is the
    problem's own N, K, dtype, stage and top_k at M = 1 with only top_k experts (the expert stride
    N * K does not depend on E), one task per (config, weight shape), while an MMA config keeps one
    task per divisibility class."""
    from gemm_costmodel.benchmarks import precompile as P

    gemv, tiled = S.MoeGemvConfig(4, 512, 4), S.vllm_default(1, 64)
    assert gemv.shape_specialised and not getattr(tiled, "shape_specialised", False)
    p = S.Problem(2, 2880, 2880, "fp8", 32, 4, "gate_up")
    assert P.shape_probe(p) == S.Problem(1, 2880, 2880, "fp8", 4, 4, "gate_up")
    probs = [S.Problem(1, 1536, 2048, "bf16", 128, 8, "down"), S.Problem(4, 1536, 2048, "bf16", 128, 8, "down"),
             S.Problem(1, 1536, 2048, "bf16", 64, 8, "down"), S.Problem(1, 4096, 2048, "bf16", 128, 8, "down")]
    tasks = P.plan([(q, [tiled, gemv]) for q in probs])
    gemv_probes = sorted((f["m"], f["n"], f["k"], f["e"]) for cid, f in tasks if cid == gemv.id)
    # E = 128 and 64 pad to different align kernels (a specialisation), so 1536x2048 is probed
    # twice, on the same 8-expert weight shape; 4096x2048 once.
    assert gemv_probes == [(1, 1536, 2048, 8), (1, 1536, 2048, 8), (1, 4096, 2048, 8)]
    assert all(f["m"] == 3 for cid, f in tasks if cid == tiled.id)


def test_gemv_configs_ids_and_problem_rules():
    """10 GEMV configs (accumulator tiles of at most 4096 fp32 elements per 4 warps); decode only
    (M <= 4); a K tile over 2x K only at the smallest K tile; ids round-trip; not in vLLM's keys."""
    gemv = [c for c in S.generate_configs("sm90", "fp8") if c.variant == "gemv"]
    assert len(gemv) == 10 and all(c.block_n * c.block_k <= 1024 * c.num_warps for c in gemv)
    assert S.MoeGemvConfig(8, 1024, 8) in gemv and S.MoeGemvConfig(8, 1024, 4) not in gemv
    assert gemv == [c for c in S.generate_configs("sm90", "bf16") if c.variant == "gemv"]
    cfg = S.MoeGemvConfig(2, 1024, 4)
    assert cfg.id == "moegemv_n2k1024_w4" and S.config_from_id(cfg.id) == cfg
    with pytest.raises(ValueError, match="unknown config id"):
        S.config_from_id("moegemv_n02k1024_w4")
    assert S.config_params(cfg) == dict(block_m=1, block_n=2, block_k=1024, group_m=0, split_k=1,
                                        num_warps=4, num_stages=1)
    assert S.smem_bytes(cfg, "bf16") == 0
    p = S.Problem(4, 1024, 512, "bf16", 64, 8, "down")
    assert S.check_feasible(cfg, p) == (True, "")
    ok, why = S.check_feasible(cfg, S.Problem(5, 1024, 512, "bf16", 64, 8, "down"))
    assert not ok and "decode variant (M <= 4), got M=5" in why
    ok, why = S.check_feasible(S.MoeGemvConfig(2, 2048, 4), p)  # 2048 > 2 x 512
    assert not ok and "block_k=2048 is over 2x K=512" in why
    small = S.Problem(1, 1024, 40, "bf16", 8, 2, "down")  # the smallest K tile runs any K
    assert [c.block_k for c in S.feasible_configs(small) if c.variant == "gemv"] == [256, 256]
    assert S.choose(1, 1024, 512, 132, [dict(variant="gemv", **S.config_params(cfg)),
                                        dict(variant="tiled", **S.config_params(S.vllm_default(1, 64)))],
                    e=64, top_k=8) == 1


def test_routings_are_deterministic_distinct_and_hand_checked():
    ids = R.topk_ids("balanced", 3, 4, 2)
    assert ids.tolist() == [[0, 1], [2, 3], [0, 1]]
    assert R.expert_counts("balanced", 1000, 64, 6).tolist() == [94] * 48 + [93] * 16
    for ro in R.ROUTINGS:
        a = R.topk_ids(ro, 257, 16, 4)
        assert (np.sort(a, axis=1)[:, 1:] != np.sort(a, axis=1)[:, :-1]).all()  # distinct experts per token
        assert (a == R.topk_ids(ro, 257, 16, 4)).all() and a.min() >= 0 and a.max() < 16
    c = R.expert_counts("hot", 4096, 64, 2)
    assert np.sort(c)[-4:].min() > 5 * np.median(c)  # 4 experts 16x as likely
    assert R.m_tiles([0, 1, 16, 17], 16) == 0 + 1 + 1 + 2
    assert R.stats([0, 2, 6]) == {"tpe_mean": 8 / 3, "tpe_max": 6, "active_experts": 2, "imbalance": 6 / (8 / 3)}


def _gumbel_counts(routing, m, e, top_k, seed, tokens):
    """The counts' definition, straightforwardly: the first ``tokens`` tokens' Gumbel keys in one
    (tokens, E) array, their top_k per token, counted (topk_ids' draws and selection)."""
    keys = np.log(R.popularity(routing, e, seed))[None, :] + R._rng(routing, m, e, top_k, seed).gumbel(size=(tokens, e))
    return np.bincount(np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k].ravel(), minlength=e)


def _want_counts(monkeypatch, routing, m, e, top_k, seed=0):
    """expert_counts as it was defined: exact up to EXACT_DRAWS, the scaled sample above, its draws
    counted by _gumbel_counts (the balanced routing: topk_ids' closed form)."""
    if routing == "balanced":
        return np.bincount(R.topk_ids(routing, m, e, top_k).ravel(), minlength=e)
    with monkeypatch.context() as mp:
        mp.setattr(R, "_sampled_counts", _gumbel_counts)
        return R.expert_counts.__wrapped__(routing, m, e, top_k, seed)


@pytest.mark.parametrize("routing", R.ROUTINGS)
def test_expert_counts_fast_path_equals_the_definition(monkeypatch, routing):
    """The counts are the models' features: the fast path (routing._sampled_counts) must return the
    reference's numbers exactly, at every M (new or not), E and top_k, on both sides of EXACT_DRAWS."""
    cases = [(m, e, top_k) for m in (1, 7, 255, 256, 257, 4097) for e, top_k in
             ((8, 2), (16, 1), (32, 4), (64, 6), (128, 8), (256, 8), (384, 8), (64, 1), (40, 8), (6, 6), (1, 1))]
    # Around EXACT_DRAWS (exact up to it, the scaled sample of SAMPLE_DRAWS // E tokens above).
    cases += [(R.EXACT_DRAWS // e + d, e, top_k) for e, top_k in ((256, 8), (64, 1)) for d in (0, 1)]
    cases += [(2**20, 256, 8), (100_003, 48, 1), (3000, 512, 10), (9000, 32, 31)]
    R.expert_counts.cache_clear()
    for m, e, top_k in cases:
        got = R.expert_counts(routing, m, e, top_k)
        want = _want_counts(monkeypatch, routing, m, e, top_k)
        assert got.dtype == np.int64 and np.array_equal(got, want), (routing, m, e, top_k)
    if routing != "balanced":  # another seed; and the counts are topk_ids' below EXACT_DRAWS
        assert np.array_equal(R.expert_counts(routing, 3001, 64, 4, seed=5), _want_counts(monkeypatch, routing, 3001, 64, 4, 5))
        assert np.array_equal(R.expert_counts(routing, 2500, 128, 8),
                              np.bincount(R.topk_ids(routing, 2500, 128, 8).ravel(), minlength=128))


def test_expert_counts_fast_path_fallbacks_are_exact(monkeypatch):
    """Each way out of the vectorised keys gives the reference's numbers: the tokens whose candidates
    do not settle them (every row redone), near-ties (libm's keys per token), exact ties (the same
    argpartition), and a zero uniform (the whole call drawn by the gumbel)."""
    cases = [("zipf", 3000, 64, 6), ("hot", 2049, 256, 8), ("real2", 700, 40, 8), ("zipf", 5000, 32, 1)]
    race = R._race
    for routing, m, e, top_k in cases:
        want = _gumbel_counts(routing, m, e, top_k, 0, m)
        assert np.array_equal(R._sampled_counts(routing, m, e, top_k, 0, m), want)
        with monkeypatch.context() as mp:
            mp.setattr(R, "_MARGIN", np.inf)  # no token settled by the vectorised keys
            assert np.array_equal(R._sampled_counts(routing, m, e, top_k, 0, m), want)
        with monkeypatch.context() as mp:  # no token has candidates: every row redone
            mp.setattr(R, "_race", lambda *a: race(*a)[:1] + (np.full(e, 5e-324), 50.0, 1.0))
            assert np.array_equal(R._sampled_counts(routing, m, e, top_k, 0, m), want)
        with monkeypatch.context() as mp:
            mp.setattr(R, "_chunk_counts", lambda *a: None)  # as for a zero draw
            assert np.array_equal(R._sampled_counts(routing, m, e, top_k, 0, m), want)
    # Exact ties: 'hot' gives E - 4 experts one popularity; equal uniforms tie their keys, and which of
    # the tied experts a token takes is argpartition's choice on the reference's keys.
    logp, theta, bound, _ = R._race("hot", 64, 6, 0)
    u = np.random.default_rng(3).random((300, 64))
    u[:100] = u[:100, :1]  # every draw of a token the same
    u[100:200, 10:50] = 0.3  # 40 equal draws in each token
    # numpy's gumbel from these uniforms: 0 - 1 * log(-log(1 - u)), libm's log (math.log's)
    keys = logp[None, :] + np.array([[0.0 - 1.0 * math.log(-math.log(1.0 - x)) for x in row] for row in u.tolist()])
    want = np.bincount(np.argpartition(-keys, 5, axis=1)[:, :6].ravel(), minlength=64)
    redo = []
    got = R._chunk_counts(u, logp, theta, bound, 6, redo)
    for rows in redo:
        got += R._chunk_counts(rows, logp, None, -np.inf, 6, [])
    assert np.array_equal(got, want)
    u[150, 3] = 0.0
    assert R._chunk_counts(u, logp, theta, bound, 6, []) is None  # a zero draw is seen


def test_expert_counts_at_a_new_m_is_fast():
    """A cold decision at a new M draws that M's routing counts (each M has its own stream): the fast
    path against the reference on the same draws (about 4x on the dev CPU; 2x asked, for CI)."""
    R._sampled_counts("zipf", 1000, 256, 8, 0, 1000)  # the routing's candidate bounds, once
    fast, ref = [], []
    for m in (4097, 4099, 4101):  # 1M draws each
        t = time.perf_counter()
        got = R._sampled_counts("zipf", m, 256, 8, 0, m)
        fast.append(time.perf_counter() - t)
        t = time.perf_counter()
        want = R._reference_counts("zipf", m, 256, 8, 0, m)
        ref.append(time.perf_counter() - t)
        assert np.array_equal(got, want)
    assert min(fast) < 0.5 * min(ref), (fast, ref)
    assert min(fast) < 0.05, fast  # about 5 ms on the 2-core dev CPU


def test_precompile_specialises_on_padded_experts_and_top_k():
    a = S.Problem(64, 400, 1000, "bf16", 64, 6, "gate_up", "zipf")
    b = S.Problem(64, 208, 200, "bf16", 512, 10, "gate_up", "zipf")
    c = S.Problem(64, 400, 1000, "bf16", 60, 6, "gate_up", "balanced")
    assert precompile.specialisation(a) != precompile.specialisation(b)
    assert precompile.specialisation(a) == precompile.specialisation(c)  # E 60 and 64 pad to 64
    pr = precompile.probe(a)
    assert (pr.m, pr.n % 32, pr.k, pr.e, pr.top_k, pr.stage) == (3, 400 % 32, 1000, 64, 6, "gate_up")
    assert precompile.specialisation(pr) == precompile.specialisation(a)


def test_features_training_equal_runtime_and_count_real_tiles():
    """The same features from a dataset frame (training) and from the candidate table (runtime)."""
    gpu = "NVIDIA H100 80GB HBM3"
    m, n, k, e, top_k, stage, routing = 33, 2048, 1408, 64, 6, "down", "zipf"
    ct = table("sm90", "bf16", "moe")
    idx = np.arange(len(ct))
    params = {p: ct.params[p][idx] for p in F.PARAMS}
    cols = F.problem_columns(m, n, k, "bf16", hardware.spec_for(gpu), ct.variant_code[idx], params, e, top_k)
    cols.update(MF.problem_inputs(m, e, top_k, stage, params["block_m"], routing))
    runtime = F.compute(cols, "moe")
    frame = pd.DataFrame({"op": "moe", "m": m, "n": n, "k": k, "e": e, "top_k": top_k, "stage": stage,
                          "routing": routing, "dtype": "bf16", "gpu_name": gpu,
                          "variant": [ct.variants[i] for i in idx],
                          **{p: params[p].astype(np.int64) for p in F.PARAMS}})
    training = F.from_frame(frame, hardware.spec_for)
    assert runtime.shape == training.shape == (len(ct), len(F.feature_names("moe")))
    np.testing.assert_array_equal(runtime, training)
    # Real row tiles: sum over experts of ceil(count / BLOCK_M).
    counts = R.expert_counts(routing, m, e, top_k)
    j = F.feature_names("moe").index("tiles_real")
    i16 = [i for i in idx if ct.variants[i] == "tiled" and params["block_m"][i] == 16][0]
    assert runtime[i16, j] == sum(-(-c // 16) for c in counts)
    iv = ct.index["grouped_mm"]
    assert runtime[iv, j] == 0  # no tiles on the vendor row
    with pytest.raises(ValueError, match="counts must be E=64"):
        MF.problem_inputs(m, e, top_k, stage, params["block_m"], counts=[1, 2])


@pytest.mark.parametrize("stage, want", [
    # gate_up at M = 3, top_k 6, N = 2I = 2816: 18 pairs x ceil(1408 / 8) columns; K = 2048 in
    # 512-wide steps; 8 x 512 x 2 (gate and up) accumulators over 128 threads; registers
    # 2 * 64 + 512 / 128 + 32 = 164, so 65536 / (128 * 164) -> 3 programs per SM; 3168 / (132 * 3)
    # = 8 waves; 3 programs x 16 KiB of bf16 weights in flight; 8 waves x 4 steps.
    ("gate_up", dict(gemv_log2_programs=np.log2(18 * 176), gemv_k_steps=4, gemv_acc_per_thread=64,
                     gemv_log2_occupancy=np.log2(3), gemv_waves=8.0, gemv_log2_inflight_kb=np.log2(48),
                     gemv_log2_serial_steps=np.log2(32))),
    # down, N = 2816 hidden, K = 2048: 3 tokens x 352 columns; 6 experts x 4 steps; one accumulator;
    # registers 100 -> 5 per SM; 1056 / 660 = 1.6 waves; 5 x 8 KiB; 2 waves x 24 steps.
    ("down", dict(gemv_log2_programs=np.log2(3 * 352), gemv_k_steps=24, gemv_acc_per_thread=32,
                  gemv_log2_occupancy=np.log2(5), gemv_waves=1.6, gemv_log2_inflight_kb=np.log2(40),
                  gemv_log2_serial_steps=np.log2(48)))])
def test_gemv_features_hand_computed(stage, want):
    """The GEMV's programs, K steps and accumulators per thread, on its rows only (0 elsewhere),
    the same from the runtime's candidate table and from a training frame."""
    gpu = "NVIDIA H100 80GB HBM3"
    m, n, k, e, top_k = 3, 2816, 2048, 64, 6
    ct = table("sm90", "bf16", "moe")
    idx = np.arange(len(ct))
    params = {p: ct.params[p][idx] for p in F.PARAMS}
    cols = F.problem_columns(m, n, k, "bf16", hardware.spec_for(gpu), ct.variant_code[idx], params, e, top_k)
    cols.update(MF.problem_inputs(m, e, top_k, stage, params["block_m"], "balanced"))
    x = F.compute(cols, "moe")
    names = F.feature_names("moe")
    j = [names.index(f) for f in want]
    g = ct.index["moegemv_n8k512_w4"]
    np.testing.assert_allclose(x[g, j], list(want.values()), rtol=1e-6)  # float32 features
    others = [i for i in idx if ct.variants[i] != "gemv"]
    assert not x[np.ix_(others, j)].any()
    frame = pd.DataFrame({"op": "moe", "m": m, "n": n, "k": k, "e": e, "top_k": top_k, "stage": stage,
                          "routing": "balanced", "dtype": "bf16", "gpu_name": gpu,
                          "variant": [ct.variants[i] for i in idx],
                          **{p: params[p].astype(np.int64) for p in F.PARAMS}})
    np.testing.assert_array_equal(F.from_frame(frame, hardware.spec_for), x)
