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
