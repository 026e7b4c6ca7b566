"""The MoE op's shape suites: shape keys, the model table and its family split, TP/EP variants,
the weight-memory guard, suite sizes, and the mapping of vLLM's tuned files (hand-checked)."""
import csv
from collections import Counter
from pathlib import Path

import pytest

from gemm_costmodel.kernels.vllm import tables
from gemm_costmodel.kernels.moe import routing as R
from gemm_costmodel.kernels.moe import space
from gemm_costmodel.kernels.moe import suites as S

VLLM_DIR = Path(tables.tables_dir(tables.KIND_MOE))  # vLLM 0.33.0's tables, kept in the repository
DTYPES = ("bf16", "fp8")


def _by_name(name):
    return next(m for m in S.ALL_MODELS if m.name == name)


def test_shape_key_family_and_problem():
    s = S.MoeShape(16, 14336, 4096, "bf16", 8, 2, "gate_up", "zipf", ("mixtral-8x7b/Mixtral-8x7B-v0.1/tp1",))
    p = space.Problem(16, 14336, 4096, "bf16", 8, 2, "gate_up", "zipf")
    assert s.key == p.key == "bf16:16x14336x4096:e8k2:gate_up:zipf"
    assert s.problem == p and s.family == "mixtral-8x7b"
    assert (s.intermediate, s.hidden) == (7168, 4096)
    d = S.MoeShape(16, 4096, 7168, "bf16", 8, 2, "down")
    assert (d.intermediate, d.hidden, d.routing, d.family) == (7168, 4096, "balanced", "user")
    # Origins are not part of a shape's identity.
    assert s == S.MoeShape(16, 14336, 4096, "bf16", 8, 2, "gate_up", "zipf") and hash(s) == hash(
        S.MoeShape(16, 14336, 4096, "bf16", 8, 2, "gate_up", "zipf", ("x/y/tp2",)))
    for bad in [dict(stage="up"), dict(routing="uniform"), dict(top_k=9), dict(n=14335)]:
        kw = dict(m=16, n=14336, k=4096, dtype="bf16", e=8, top_k=2, stage="gate_up") | bad
        with pytest.raises(ValueError):
            S.MoeShape(**kw)


def test_model_table_is_the_published_configs():
    # (E, top_k, I, hidden) from each config.json (checked by hand).
    want = {
        "Mixtral-8x7B-v0.1": (8, 2, 14336, 4096), "DeepSeek-V2-Lite": (64, 6, 1408, 2048),
        "DeepSeek-V3": (256, 8, 2048, 7168), "Qwen1.5-MoE-A2.7B": (60, 4, 1408, 2048),
        "Qwen2-57B-A14B": (64, 8, 2560, 3584), "Qwen3-235B-A22B": (128, 8, 1536, 4096),
        "OLMoE-1B-7B-0924": (64, 8, 1024, 2048), "dbrx-base": (16, 4, 10752, 6144),
        "Llama-4-Scout-17B-16E": (16, 1, 8192, 5120),
        "Mixtral-8x22B-v0.1": (8, 2, 16384, 6144), "Phi-3.5-MoE-instruct": (16, 2, 6400, 4096),
        "gpt-oss-20b": (32, 4, 2880, 2880), "granite-3.0-3b-a800m": (40, 8, 512, 1536),
        "Qwen3-30B-A3B": (128, 8, 768, 2048), "DeepSeek-V2": (160, 6, 1536, 5120),
        "Kimi-K2-Instruct": (384, 8, 2048, 7168), "Qwen3-Next-80B-A3B-Instruct": (512, 10, 512, 2048),
        "AI21-Jamba-1.5-Mini": (16, 2, 14336, 4096), "gpt-oss-120b": (128, 4, 2880, 2880),
        "GLM-4.5-Air": (128, 8, 1408, 4096), "Llama-4-Maverick-17B-128E": (128, 1, 8192, 5120),
    }
    assert {m.name: (m.experts, m.top_k, m.intermediate, m.hidden) for m in S.ALL_MODELS} == want
    assert len({m.name for m in S.ALL_MODELS}) == len(S.ALL_MODELS)


def test_family_split():
    assert S.TRAINING_FAMILIES == ("dbrx", "deepseek-v2-lite", "deepseek-v3", "llama-4-scout", "mixtral-8x7b",
                                   "olmoe-1b-7b", "qwen1.5-moe-a2.7b", "qwen2-57b-a14b", "qwen3-235b-a22b")
    assert not set(S.TRAINING_FAMILIES) & set(S.HELDOUT_FAMILIES)
    # The eval families: 8, E from 8 to 512.
    assert sorted(m.experts for m in S.HELDOUT_MODELS) == [8, 16, 32, 40, 128, 160, 384, 512]
    for dtype in DTYPES:
        train = S.training_suite(dtype)
        # Every origin of every training shape is a training family: no held-out family in train.
        fams = {o.split("/")[0] for s in train for o in s.origins}
        assert fams == set(S.TRAINING_FAMILIES)
        ev = S.eval_suite(dtype)
        assert {s.family for s in ev} == {m.family for m in S.HELDOUT_MODELS}
        assert not {o.split("/")[0] for s in ev for o in s.origins} & set(S.TRAINING_FAMILIES)
        assert {s.family for s in S.vllm_suite(dtype)} <= set(S.TRAINING_FAMILIES)
        # No held-out shape is measured for training under another family's name either.
        assert not {s.key for s in ev} & {s.key for s in train}
        assert not {s.key for s in ev} & {s.key for s in S.vllm_suite(dtype)}
        assert {s.family for s in S.gate_suite(dtype)} == {"gate"}


def test_variants_follow_vllms_sharding():
    mix = _by_name("Mixtral-8x7B-v0.1")
    got = {v.name: (v.e, v.inter, v.top_k) for v in S.variants(mix)}
    # EP8 would leave 1 expert per rank for top_k = 2: skipped.
    assert got == {"tp1": (8, 14336, 2), "tp2": (8, 7168, 2), "tp4": (8, 3584, 2), "tp8": (8, 1792, 2),
                   "ep2": (4, 14336, 2), "ep4": (2, 14336, 2)}
    qwen15 = _by_name("Qwen1.5-MoE-A2.7B")  # 60 experts: EP8 does not divide them
    assert [v.name for v in S.variants(qwen15)] == ["tp1", "tp2", "tp4", "tp8", "ep2", "ep4"]
    granite = _by_name("granite-3.0-3b-a800m")  # I = 512: TP8 gives N = 64, the smallest kept
    assert S.variant(granite, "tp8").inter == 64 and "tp8" in [v.name for v in S.variants(granite)]
    small = S.MoeModel("x", "x", 16, 2, 256, 1024)   # TP8: N = 32 < 64
    odd = S.MoeModel("y", "y", 16, 2, 1100, 1024)    # TP8 does not divide 1100 (TP4: 275 does)
    assert [v.name for v in S.variants(small) if v.kind == "tp"] == ["tp1", "tp2", "tp4"]
    assert [v.name for v in S.variants(odd) if v.kind == "tp"] == ["tp1", "tp2", "tp4"]
    v = S.variant(_by_name("Qwen3-235B-A22B"), "ep2")
    assert v.origin == "qwen3-235b-a22b/Qwen3-235B-A22B/ep2"
    g, d = v.shapes(64, "bf16", "hot")
    assert (g.m, g.n, g.k, g.e, g.top_k, g.stage, g.routing) == (64, 3072, 4096, 64, 8, "gate_up", "hot")
    assert (d.m, d.n, d.k, d.e, d.top_k, d.stage, d.routing) == (64, 4096, 1536, 64, 8, "down", "hot")
    with pytest.raises(ValueError, match="no variant"):
        S.variant(mix, "ep8")


def test_weight_memory_guard():
    ds = _by_name("DeepSeek-V3")
    # 256 experts x (2 x 2048 + 2048) x 7168 x 2 bytes = 22.5 GB at TP1 > 12 GB; TP2 and EP2 11.3 GB.
    assert S.variant(ds, "tp1").weight_bytes == 256 * 3 * 2048 * 7168 * 2 == 22_548_578_304
    assert S.variant(ds, "tp2").weight_bytes == S.variant(ds, "ep2").weight_bytes == 11_274_289_152
    assert {v.name for v in S.variants(ds)} == {"tp2", "tp4", "tp8", "ep2", "ep4", "ep8"}
    assert "tp1" in {v.name for v in S.variants(ds, guard=False)}
    kimi = _by_name("Kimi-K2-Instruct")  # 33.8 GB at TP1, 16.9 GB at TP2/EP2
    assert {v.name for v in S.variants(kimi)} == {"tp4", "tp8", "ep4", "ep8"}
    for suite in (S.training_suite, S.eval_suite, S.vllm_suite):
        for s in suite("bf16"):
            assert s.e * 3 * s.intermediate * s.hidden * 2 <= S.WEIGHT_LIMIT_BYTES, s.key
    # No shape of DeepSeek-V3 at TP1 (E = 256 with the full I = 2048) in training.
    assert not [s for s in S.training_suite() if s.e == 256 and s.intermediate == 2048]


def _layers(shapes):
    """{(m, e, top_k, routing, I, hidden): {stage}}"""
    out = {}
    for s in shapes:
        out.setdefault((s.m, s.e, s.top_k, s.routing, s.intermediate, s.hidden), set()).add(s.stage)
    return out


@pytest.mark.parametrize("name", ["train", "train_skewed", "eval", "vllm", "gate"])
def test_every_layer_has_both_stages(name):
    shapes = S.SUITES[name]("bf16")
    assert len(shapes) == len({s.key for s in shapes})
    for key, stages in _layers(shapes).items():
        assert stages == {"gate_up", "down"}, key
    for s in shapes:
        s.problem  # noqa: B018 - every shape is a valid problem


def test_suite_sizes():
    sizes = {name: {dt: len(f(dt)) for dt in DTYPES} for name, f in S.SUITES.items()}
    assert sizes == {"train": {"bf16": 4294, "fp8": 4318}, "train_skewed": {"bf16": 944, "fp8": 944},
                     "eval": {"bf16": 128, "fp8": 128},
                     "vllm": {"bf16": 72, "fp8": 48}, "gate": {"bf16": 48, "fp8": 48}}
    # train by hand: per guarded variant, M = 1 balanced only, 18 other M balanced + one skewed,
    # both stages; minus the vllm suite's (balanced) shapes; no two variants share a shape.
    n_var = sum(len(S.variants(m)) for m in S.TRAINING_MODELS)
    assert n_var == 59  # 6 + 7 + 6 + 6 + 7 + 7 + 7 + 6 + 7 in TRAINING_MODELS order
    per_variant = 2 * (1 + 2 * (len(S.TRAIN_M) - 1))
    assert sizes["train"]["bf16"] == n_var * per_variant - sizes["vllm"]["bf16"]
    assert sizes["train"]["fp8"] == n_var * per_variant - sizes["vllm"]["fp8"]
    # Every skewed routing at every M > 1 instead of one: 59 x 2 x (1 + 18 x 6) - 72.
    full = S.training_suite("bf16", skewed=len(R.SKEWED))
    assert len(full) == n_var * 2 * (1 + (len(S.TRAIN_M) - 1) * 6) - 72 == 12790
    assert len(S.training_suite("bf16", skewed=0)) == n_var * 2 * len(S.TRAIN_M) - 72
    # eval: 8 families x (6 balanced + 2 zipf M) x 2 stages; vllm: 6 files x 6 M x 2 stages.
    assert sizes["eval"]["bf16"] == 8 * (6 + 2) * 2 and sizes["vllm"]["bf16"] == 6 * 6 * 2


def test_skewed_suite_is_the_next_routing_of_the_cycle():
    """train_skewed: per (variant, M >= 256) exactly one more skewed routing, the one after train's
    in routing.SKEWED; no shape of train, eval or vllm; 8 M x 59 variants x 2 stages."""
    for dtype in DTYPES:
        extra = S.skewed_suite(dtype)
        assert len(extra) == 8 * 59 * 2
        taken = {s.key for f in ("train", "eval", "vllm") for s in S.SUITES[f](dtype)}
        assert not {s.key for s in extra} & taken
        train = {(s.m, s.e, s.top_k, s.intermediate, s.hidden, s.stage): s.routing
                 for s in S.training_suite(dtype) if s.routing != "balanced"}
        for s in extra:
            assert s.m >= S.SKEWED_EXTRA_MIN_M and s.routing in R.SKEWED
            before = train[(s.m, s.e, s.top_k, s.intermediate, s.hidden, s.stage)]
            assert s.routing == R.SKEWED[(R.SKEWED.index(before) + 1) % len(R.SKEWED)]
    assert {s.m for s in S.skewed_suite("bf16", min_m=4096)} == {4096, 8192}


def test_training_grid_and_routings():
    assert S.TRAIN_M == S.VLLM_M_GRID + (8192,)
    train = S.training_suite()
    assert {s.m for s in train} == set(S.TRAIN_M)
    by_m = {}
    for s in train:
        by_m.setdefault(s.m, Counter())[s.routing] += 1
    assert set(by_m[1]) == {"balanced"}  # M = 1: every routing is the same histogram
    for m in S.TRAIN_M[1:]:
        assert by_m[m]["balanced"] > 0 and set(by_m[m]) - {"balanced"}, m
    assert {s.routing for s in train} == set(R.ROUTINGS)
    # Per (variant origin, M > 1): balanced and exactly one skewed routing.
    per = {}
    for s in train:
        for o in s.origins:
            per.setdefault((o, s.m), set()).add(s.routing)
    for (o, m), rs in per.items():
        assert "balanced" in rs or (m in S.EVAL_M), (o, m)
        assert len(rs - {"balanced"}) == (0 if m == 1 else 1), (o, m, rs)


def test_vllm_suite_is_held_out_of_training():
    for dtype in DTYPES:
        vl = S.vllm_suite(dtype)
        train_keys = {s.key for s in S.training_suite(dtype)}
        assert not {s.key for s in vl} & train_keys
        assert {s.m for s in vl} == set(S.EVAL_M) and {s.routing for s in vl} == {"balanced"}
        files = {(f.e, f.n): f for f in S.vllm_file_shapes(dtype)}
        for s in vl:
            f = files[(s.e, s.intermediate)]
            assert f.training and (s.hidden, s.top_k) == (f.variant.hidden, f.variant.top_k)
        assert {(s.e, s.intermediate) for s in vl} == set(S.VLLM_SUITE_FILES[dtype])


def test_eval_suite_grid():
    ev = S.eval_suite()
    assert {(s.m, s.routing) for s in ev} == ({(m, "balanced") for m in S.EVAL_M}
                                              | {(m, "zipf") for m in S.EVAL_SKEWED_M})
    assert len({s.family for s in ev}) == 8
    # One variant per family, the declared one.
    for m in S.HELDOUT_MODELS:
        origins = {o for s in ev if s.family == m.family for o in s.origins}
        assert origins == {S.variant(m, m.eval_variant).origin}


def test_gate_suite_is_odd():
    gate = S.gate_suite()
    assert {s.m for s in gate} == {1, 7, 4097}
    assert max(s.e for s in gate) == 512 and any(s.top_k == s.e for s in gate)
    assert {s.routing for s in gate} == {"balanced", "real2"}
    for s in gate:
        assert s.n % 64 and s.k % 64, s.key
        assert s.origins == (S.GATE_ORIGIN,)
    # Experts without tokens: at small M, and under real2 at large M too.
    empty = [s for s in gate if (s.problem.counts() == 0).any()]
    assert {s.m for s in empty} >= {1, 7, 4097}
    assert {s.routing for s in empty} == {"balanced", "real2"}
    assert {(s.e, s.m) for s in empty if s.routing == "real2"} >= {(8, 4097), (64, 4097), (512, 4097)}
    assert not {s.key for s in gate} & {s.key for f in ("train", "eval", "vllm") for s in S.SUITES[f]("bf16")}


# -- vLLM's files ---------------------------------------------------------------------------

def test_vllm_file_mapping_known_answers():
    rows = {(f.e, f.n): f for f in S.vllm_file_shapes("bf16")}
    assert rows[(8, 1792)].row() == (8, 1792, "mixtral-8x7b", "Mixtral-8x7B-v0.1", "tp8", 4096, 2)
    assert rows[(8, 7168)].row() == (8, 7168, "mixtral-8x7b", "Mixtral-8x7B-v0.1", "tp2", 4096, 2)
    assert rows[(16, 2688)].row() == (16, 2688, "dbrx", "dbrx-base", "tp4", 6144, 4)
    assert rows[(64, 640)].row() == (64, 640, "qwen2-57b-a14b", "Qwen2-57B-A14B", "tp4", 3584, 8)
    assert rows[(64, 1536)].row() == (64, 1536, "qwen3-235b-a22b", "Qwen3-235B-A22B", "ep2", 4096, 8)
    assert rows[(256, 512)].row() == (256, 512, "deepseek-v3", "DeepSeek-V3", "tp4", 7168, 8)
    # (E, N) shared by a training and a held-out model: the training variant maps it, both match.
    f = rows[(128, 384)]
    assert f.row()[2:5] == ("qwen3-235b-a22b", "Qwen3-235B-A22B", "tp4")
    assert [v.origin for v in f.matches] == ["qwen3-235b-a22b/Qwen3-235B-A22B/tp4", "qwen3-30b-a3b/Qwen3-30B-A3B/tp2"]
    # Held-out families' files are mapped but not training.
    assert rows[(512, 512)].mapped and not rows[(512, 512)].training
    assert rows[(8, 4096)].row()[2:5] == ("mixtral-8x22b", "Mixtral-8x22B-v0.1", "tp4")
    assert {(f.e, f.n) for f in S.unmapped_vllm_files("bf16")} == {
        (1, 3072), (32, 1792), (62, 256), (62, 512), (72, 384), (72, 768), (128, 928), (128, 1856)}
    assert all(f.note for f in S.unmapped_vllm_files("bf16"))
    assert {(f.e, f.n) for f in S.vllm_file_shapes("bf16") if f.training} == {
        (8, 1792), (8, 3584), (8, 7168), (16, 1344), (16, 2688), (64, 320), (64, 640), (64, 1280), (64, 1536),
        (128, 192), (128, 384), (256, 512)}
    assert rows[(8, 1792)].file_name == "E=8,N=1792,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert S.vllm_file_shapes("fp8")[0].file_name.endswith(",dtype=fp8_w8a8.json")
    with pytest.raises(ValueError):
        S.vllm_file_shapes("fp16")


def test_vllm_file_list_is_the_shipped_one():
    manifest = VLLM_DIR / "MANIFEST.csv"
    assert manifest.is_file(), f"vLLM's tables belong in the repository: {manifest}"
    rows = list(csv.DictReader(manifest.open()))
    for dtype, tag in (("bf16", ""), ("fp8", "fp8_w8a8")):
        shipped = sorted((int(r["E"]), int(r["N"])) for r in rows
                         if r["device"] == S.VLLM_DEVICE and r["dtype"] == tag and not r["block_shape"])
        assert sorted(S.VLLM_H100_FILES[dtype]) == shipped, dtype
        for f in S.vllm_file_shapes(dtype):
            assert (VLLM_DIR / f.file_name).is_file(), f.file_name
