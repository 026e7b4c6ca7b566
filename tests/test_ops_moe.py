"""The fused-MoE torch op (``gemm_costmodel::fused_moe``) and the MoE dispatcher, on CPU tensors
through the Triton interpreter (fp32 operands: the interpreter computes garbage for bf16 dots),
plus the shipped MoE model's decisions and the vLLM-table precedence (no GPU needed: the GPU is
named)."""
import json

import numpy as np
import pytest
import torch

from gemm_costmodel.kernels.moe import impl as I
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.serving import features as F
from gemm_costmodel.serving import ops
from gemm_costmodel.serving.runtime import Dispatcher

GPU = "NVIDIA H100 80GB HBM3"
OP = "moe"


@pytest.fixture(scope="module")
def shipped():
    """The dispatcher of the shipped MoE model (models/moe-sm90.onnx) for the H100."""
    return Dispatcher(gpu_name=GPU, op=OP)


@pytest.fixture
def fallback(tmp_path):
    """A dispatcher without a model: the op's fallback rule (vLLM's default) decides."""
    d = Dispatcher(gpu_name=GPU, models_dir=str(tmp_path), op=OP)
    ops.set_dispatcher(d)
    yield d
    ops.set_dispatcher(None, op=OP)
    ops.clear_vllm_moe_configs()


def _layer(m, e, top_k, inter, hidden, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hidden, generator=g)
    w1, _ = I.random_weights(e, 2 * inter, hidden, "fp32", "cpu", g)
    w2, _ = I.random_weights(e, hidden, inter, "fp32", "cpu", g)
    tw, ids = ops.route(torch.randn(m, e, generator=g), top_k)
    return x, w1, w2, tw, ids


@pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")
@pytest.mark.parametrize("m, e, top_k, inter, hidden", [(1, 8, 2, 40, 72), (7, 16, 4, 24, 40), (33, 4, 1, 48, 24)])
def test_fused_moe_op_equals_reference_and_launches_the_fallback_choice(fallback, m, e, top_k, inter, hidden):
    x, w1, w2, tw, ids = _layer(m, e, top_k, inter, hidden)
    up, down = ops.choose_moe(x, w1, w2, tw, ids)
    # No model: vLLM's default config for (M, E), for both stages.
    assert up == down == S.vllm_default(m, e, "fp16").id
    y = ops.fused_moe(x, w1, w2, tw, ids)
    ref = I.moe_reference(x, w1, w2, tw, ids)
    assert y.shape == (m, hidden)
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() < 2e-3


@pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")
def test_vllm_table_exact_m_hit_wins_for_both_stages(fallback, tmp_path):
    folder = tmp_path / "vllm"
    folder.mkdir()
    cfg = S.MoeTiledConfig(32, 64, 64, 1, 4, 3)
    body = {"7": S.to_vllm(cfg), "64": S.to_vllm(S.MoeTiledConfig(64, 128, 64, 16, 8, 3)), "triton_version": "3.6.0"}
    (folder / "E=16,N=24,device_name=NVIDIA_H100_80GB_HBM3.json").write_text(json.dumps(body))
    # Another GPU's file and a block-scaled one are not this GPU's bf16 table.
    (folder / "E=16,N=24,device_name=NVIDIA_H200.json").write_text(json.dumps({"8": S.to_vllm(cfg)}))
    (folder / "E=16,N=24,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json").write_text(
        json.dumps({"8": S.to_vllm(cfg)}))
    assert ops.load_vllm_moe_configs(str(folder), gpu_name=GPU) == 1
    x, w1, w2, tw, ids = _layer(7, 16, 4, 24, 40)
    # fp32 operands are decided as fp16: the table is keyed by dtype, so no hit here ...
    assert ops.choose_moe(x, w1, w2, tw, ids) == (S.vllm_default(7, 16).id,) * 2
    ops._moe_tables[(16, 24, "fp32")] = ops._moe_tables[(16, 24, "bf16")]
    # ... an exact M hit launches the file's config for both stages; M = 8 is no key (no nearest-M).
    assert ops.choose_moe(x, w1, w2, tw, ids) == (cfg.id, cfg.id)
    x8, w1, w2, tw8, ids8 = _layer(8, 16, 4, 24, 40)
    assert ops.choose_moe(x8, w1, w2, tw8, ids8) == (S.vllm_default(8, 16).id,) * 2


def test_vllm_table_entry_outside_the_space_names_the_file(fallback, tmp_path):
    (tmp_path / "E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3.json").write_text(
        json.dumps({"1": S.to_vllm(S.MoeTiledConfig(32, 256, 256, 16, 4, 4))}))  # 589,824 B of shared memory
    with pytest.raises(ValueError, match="E=8,N=64.*M=1.*not in the moe space"):
        ops.load_vllm_moe_configs(str(tmp_path), gpu_name=GPU)


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a.update(w2=a["w2"][:, :, :-1]), "w2 must have shape"),
    (lambda a: a.update(ids=a["ids"][:, :1]), "topk"),
    (lambda a: a.update(x=a["x"][:, :-1]), "x"),
])
def test_fused_moe_bad_operands_name_the_argument(fallback, mutate, match):
    x, w1, w2, tw, ids = _layer(3, 8, 2, 16, 24)
    a = dict(x=x, w1=w1, w2=w2, tw=tw, ids=ids)
    mutate(a)
    with pytest.raises(ValueError, match=match):
        ops.fused_moe(a["x"], a["w1"], a["w2"], a["tw"], a["ids"])


def test_shipped_model_decides_each_stage_and_the_routing_changes_the_features(shipped):
    up = shipped.select(16, 2 * 768, 2048, "bf16", 128, 8, stage="gate_up")
    down = shipped.select(16, 2048, 768, "bf16", 128, 8, stage="down", routing="zipf")
    assert up.source == down.source == "model"
    assert S.config_from_id(up.candidate) in S.generate_configs("sm90", "bf16")
    # The routing id reaches the model's own features: 16 tokens x top-8 over 128 experts touch
    # at most 128 experts when balanced, fewer under a Zipf routing.
    ct_ids = [c for c in S.generate_configs("sm90", "bf16")]
    bm = np.array([S.config_params(c)["block_m"] for c in ct_ids])
    bal = F.op_features(OP).problem_inputs(16, 128, 8, "down", bm, "balanced")
    zipf = F.op_features(OP).problem_inputs(16, 128, 8, "down", bm, "zipf")
    assert bal["active_experts"] == 128 and zipf["active_experts"] < 128
    assert bal["tpe_max"] == 1 and zipf["tpe_max"] > 1


def test_dispatcher_names_missing_and_unknown_problem_fields(shipped):
    with pytest.raises(ValueError, match="needs the problem field 'stage'"):
        shipped.select(16, 1536, 2048, "bf16", 128, 8)
    with pytest.raises(ValueError, match="no problem field 'expert_bias'"):
        shipped.select(16, 1536, 2048, "bf16", 128, 8, stage="down", expert_bias=1)
    with pytest.raises(ValueError, match="stage must be one of"):
        shipped.select(16, 1536, 2048, "bf16", 128, 8, stage="up")
    with pytest.raises(ValueError, match="routing must be one of"):
        shipped.select(16, 1536, 2048, "bf16", 128, 8, stage="down", routing="uniform")
    with pytest.raises(ValueError, match="top_k"):
        shipped.select(16, 1536, 2048, "bf16", 4, 8, stage="down")


def test_dense_dispatcher_refuses_moe_fields():
    d = Dispatcher(gpu_name=GPU, op="gemm")
    with pytest.raises(ValueError, match="op gemm has no problem field 'stage'"):
        d.select(16, 1536, 2048, "bf16", stage="down")


class _RankedDispatcher:
    """A MoE dispatcher double whose ranking per stage is fixed (fp32 operands have no model)."""
    op = OP
    gpu_name = GPU

    def __init__(self, ranked):
        self.ranked, self.calls = ranked, []

    def rank(self, m, n, k, dtype="bf16", count=8, e=1, top_k=1, stage=None, routing="balanced"):
        self.calls.append((stage, m, n, k, dtype, e, top_k, count, routing))
        from gemm_costmodel.serving.runtime import Choice
        return [Choice(c, "model") for c in self.ranked[stage][:count]]

    def select(self, *a, **kw):
        return self.rank(*a, **kw)[0]


@pytest.fixture
def unsure_moe(monkeypatch, tmp_path):
    """Unsure mode over a fixed MoE ranking, with the launched config ids recorded."""
    ranked = {"gate_up": [S.vllm_default(3, 8, "fp16").id, "moegemv_n8k256_w4", "moegemv_n4k256_w4"],
              "down": ["moegemv_n4k256_w4", "moegemv_n8k256_w4", S.vllm_default(3, 8, "fp16").id]}
    fake = _RankedDispatcher(ranked)
    ops.set_dispatcher(fake, op=OP)
    ops.set_dispatcher(Dispatcher(gpu_name=GPU, models_dir=str(tmp_path / "none")))
    launched = []
    real = I.launch

    def recording(cfg, stage, *a, **kw):
        launched.append((stage, cfg.id))
        return real(cfg, stage, *a, **kw)

    monkeypatch.setattr(I, "launch", recording)
    yield fake, ranked, launched
    ops.disable_unsure_mode()
    ops.set_dispatcher(None, op=OP)
    ops.set_dispatcher(None)
    ops.clear_vllm_moe_configs()


def test_unsure_mode_times_each_stage_top_k_on_the_real_operands_and_persists_the_winners(unsure_moe, tmp_path):
    fake, ranked, launched = unsure_moe
    m, e, top_k, inter, hidden = 3, 8, 2, 40, 72
    x, w1, w2, tw, ids = _layer(m, e, top_k, inter, hidden, seed=4)
    # Fake times: gate_up's third choice and down's second are the fastest.
    times = {"gate_up": dict(zip(ranked["gate_up"], (3.0, 2.0, 1.0))),
             "down": dict(zip(ranked["down"], (2.0, 1.0, 3.0)))}
    benched = []

    def bench(fn):
        fn()
        stage, cid = launched[-1]
        benched.append((stage, cid))
        return times[stage][cid]

    cache = tmp_path / "tuned.json"
    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=bench)
    up, down = ops.choose_moe(x, w1, w2, tw, ids, routing="zipf")
    assert (up, down) == (ranked["gate_up"][2], ranked["down"][1])
    assert sorted(benched) == sorted((s, c) for s in ranked for c in ranked[s])
    # Each stage asked the model for its own problem (N, K swap between the stages), k = 3, and the
    # routing the caller named.
    assert [c[:4] for c in fake.calls] == [("gate_up", m, 2 * inter, hidden), ("down", m, hidden, inter)]
    assert {c[7] for c in fake.calls} == {3} and {c[8] for c in fake.calls} == {"zipf"}

    # Known layer: no more timing; the op launches the two winners and matches the reference.
    n_bench = len(benched)
    launched.clear()
    y = ops.fused_moe(x, w1, w2, tw, ids)
    assert launched == [("gate_up", up), ("down", down)] and len(benched) == n_bench
    ref = I.moe_reference(x, w1, w2, tw, ids)
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() < 2e-3

    body = json.loads(cache.read_text())
    assert body["entries"] == {}  # the dense tuned-table part stays a valid (empty) table
    ent = body["ops"]["moe"]
    key_up, key_down = f"fp32:gate_up:{m}x{2 * inter}x{hidden}:e{e}k{top_k}", f"fp32:down:{m}x{hidden}x{inter}:e{e}k{top_k}"
    assert set(ent) == {key_up, key_down}
    assert ent[key_up]["candidate"] == up and ent[key_up]["ms"] == 1.0 and ent[key_up]["timed"] == times["gate_up"]
    assert ent[key_down]["model_top1"] == ranked["down"][0] and ent[key_down]["routing"] == "zipf"
    # A Dispatcher reads the same file as a dense tuned table without tripping on the MoE part.
    Dispatcher(gpu_name=GPU, models_dir=str(tmp_path / "none"), tuned_table=str(cache))

    # A later process reloads the winners: nothing is timed again.
    def no_bench(fn):
        raise AssertionError("a persisted layer must not be timed again")

    ops.enable_unsure_mode(k=3, cache_file=str(cache), bench=no_bench)
    assert ops.choose_moe(x, w1, w2, tw, ids) == (up, down)


def test_unsure_mode_skips_a_candidate_that_disagrees_and_a_vllm_table_still_wins(unsure_moe, tmp_path, monkeypatch):
    fake, ranked, launched = unsure_moe
    x, w1, w2, tw, ids = _layer(3, 8, 2, 40, 72, seed=5)
    real = I.launch

    def broken(cfg, stage, *a, **kw):
        y = real(cfg, stage, *a, **kw)
        return y * 1.5 if cfg.id == ranked["gate_up"][1] and stage == "gate_up" else y

    monkeypatch.setattr(I, "launch", broken)
    # The broken candidate would be the fastest: it must never be picked.
    speed = {ranked["gate_up"][0]: 2.0, ranked["gate_up"][1]: 0.5, ranked["gate_up"][2]: 3.0}
    calls = []

    def bench(fn):
        calls.append(1)
        return 1.0 if len(calls) > 2 else list(speed.values())[0 if len(calls) == 1 else 2]

    tuner = ops.enable_unsure_mode(k=3, bench=bench)
    up, _ = ops.choose_moe(x, w1, w2, tw, ids)
    assert up == ranked["gate_up"][0]
    assert tuner.op_entries["moe"][f"fp32:gate_up:3x80x72:e8k2"]["timed"][ranked["gate_up"][1]] == float("inf")
    # An exact-M vLLM table entry wins before unsure mode (the user's table is explicit).
    cfg = S.MoeTiledConfig(32, 64, 64, 1, 4, 3)
    ops._moe_tables[(8, 40, "fp32")] = {3: cfg.id}
    assert ops.choose_moe(x, w1, w2, tw, ids) == (cfg.id, cfg.id)


@pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")
def test_fused_moe_op_block_scales(fallback):
    """Block scales (fp8bs's layout) through the torch op, on fp32 stand-ins (the interpreter):
    equal to the reference that quantises x and the intermediate per token group; block_shape
    [128, 128] accepted, any other refused naming it."""
    g = torch.Generator().manual_seed(2)
    m, e, top_k, inter, hidden = 3, 4, 2, 40, 136
    x = torch.randn(m, hidden, generator=g)
    w1, s1 = I.random_block_weights(e, 2 * inter, hidden, "cpu", g, torch.float32)
    w2, s2 = I.random_block_weights(e, hidden, inter, "cpu", g, torch.float32)
    tw, ids = ops.route(torch.randn(m, e, generator=g), top_k)
    y = ops.fused_moe(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, block_shape=[128, 128])
    ref = I.moe_reference(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2)
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() < 2e-3
    with pytest.raises(ValueError, match=r"block_shape must be \[128, 128\]"):
        ops.fused_moe(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, block_shape=[64, 64])
