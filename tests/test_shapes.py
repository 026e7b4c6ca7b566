"""Shape suites: layer dims hand-checked against the models' config.json, M grid, CSV reader."""
import pytest

from gemm_costmodel.kernels import shapes as S
from gemm_costmodel.kernels.gemm import suites as GS

MODELS = {m.name: m for m in S.TRAINING_MODELS}


def dims(model: str, tp: int) -> dict:
    return {ly.layer: (ly.n, ly.k) for ly in S.model_layers(MODELS[model], tp)}


def test_llama_8b_tp1():
    assert dims("Llama-3.1-8B", 1) == {
        "qkv_proj": (6144, 4096),        # (32 + 2*8) * 128
        "o_proj": (4096, 4096),
        "gate_up_proj": (28672, 4096),   # 2 * 14336
        "down_proj": (4096, 14336),
    }


def test_llama_8b_tp2_splits_n_of_column_and_k_of_row_parallel():
    assert dims("Llama-3.1-8B", 2) == {
        "qkv_proj": (3072, 4096),        # (16 + 2*4) * 128
        "o_proj": (4096, 2048),
        "gate_up_proj": (14336, 4096),
        "down_proj": (4096, 7168),
    }


def test_llama_70b_tp8_qkv():
    # 64/8 query heads * 128 + 2 * (8/8 = 1) kv head * 128
    assert dims("Llama-3.1-70B", 8)["qkv_proj"] == (64 // 8 * 128 + 2 * 1 * 128, 8192) == (1280, 8192)
    assert dims("Llama-3.1-70B", 8)["o_proj"] == (8192, 1024)


def test_qwen_05b_has_no_tp4_tp8():
    # 14 query heads: not divisible by 4 or 8.
    assert S.model_layers(MODELS["Qwen2.5-0.5B"], 4) == []
    assert S.model_layers(MODELS["Qwen2.5-0.5B"], 8) == []
    assert dims("Qwen2.5-0.5B", 2)["qkv_proj"] == (7 * 64 + 2 * 1 * 64, 896)


def test_qwen_7b_tp8_skipped():
    assert S.model_layers(MODELS["Qwen2.5-7B"], 8) == []   # 28 heads
    assert len(S.model_layers(MODELS["Qwen2.5-7B"], 4)) == 4


def test_gemma2_2b_tp8_replicates_kv():
    # 8 heads / 8 = 1 query head; 4 kv heads < 8 ranks: each rank keeps one replicated kv head.
    d = dims("Gemma-2-2B", 8)
    assert d["qkv_proj"] == (1 * 256 + 2 * 256, 2304) == (768, 2304)
    assert d["o_proj"] == (2304, 256)
    assert dims("Gemma-2-2B", 1)["qkv_proj"] == (8 * 256 + 2 * 4 * 256, 2304)


def test_phi4_kv_heads_not_divisible_skipped():
    # 10 kv heads >= 4 ranks but 10 % 4 != 0: vLLM refuses it.
    assert S.model_layers(MODELS["Phi-4"], 4) == []
    assert len(S.model_layers(MODELS["Phi-4"], 2)) == 4


def test_deepseek_v3_tp8():
    d = dims("DeepSeek-V3", 8)
    assert d["q_b_proj"] == (16 * 192, 1536) == (3072, 1536)
    assert d["kv_b_proj"] == (16 * 256, 512) == (4096, 512)
    assert d["o_proj"] == (7168, 2048)
    assert d["fused_qkv_a_proj"] == (2112, 7168)
    assert d["gate_up_proj"] == (2 * 18432 // 8, 7168)
    assert d["down_proj"] == (7168, 18432 // 8)
    assert d["shared_expert_gate_up_proj"] == (512, 7168)
    assert d["shared_expert_down_proj"] == (7168, 256)


@pytest.mark.parametrize("tp", S.TP_DEGREES)
def test_deepseek_fused_qkv_a_replicated_at_every_tp(tp):
    # q_lora_rank + kv_lora_rank + qk_rope_head_dim = 1536 + 512 + 64
    assert dims("DeepSeek-V3", tp)["fused_qkv_a_proj"] == (2112, 7168)


def test_training_layers_origins():
    pairs = S.nk_pairs()
    assert "llama-3.1/Llama-3.1-8B/qkv_proj/tp1" in pairs[(6144, 4096)]
    assert "llama-3.1/Llama-3.1-70B/qkv_proj/tp8" in pairs[(1280, 8192)]
    # Llama-3.1-8B TP1 o_proj and Mistral-7B o_proj are the same GEMM.
    assert "mistral/Mistral-7B-v0.3/o_proj/tp1" in pairs[(4096, 4096)]
    assert all(n > 0 and k > 0 for n, k in pairs)


# ----------------------------------------------------------------------------
# M grid and suites
# ----------------------------------------------------------------------------

def test_m_grid():
    g = S.M_GRID
    assert list(g) == sorted(set(g))                      # sorted, unique
    assert set(range(1, 9)) <= set(g)                     # every M from 1 to 8
    assert {7, 13, 33, 100, 200} <= set(g)                # non-powers of two
    assert g[0] == 1 and g[-1] == 16384
    decode = [m for m in g if m <= 256]
    assert decode[-1] == 256
    assert max(b - a for a, b in zip(decode, decode[1:])) <= 32  # dense up to 256
    assert sum(m & (m - 1) != 0 for m in decode) >= 15   # mostly non-powers of two


def test_training_suite_only_training_families():
    suite = GS.training_suite("bf16")
    assert suite
    assert len(suite) == len(S.nk_pairs()) * len(S.M_GRID)
    assert len(set(suite)) == len(suite)
    for s in suite:
        assert s.dtype == "bf16"
        assert s.family in S.TRAINING_FAMILIES
        assert all(o.split("/")[0] in S.TRAINING_FAMILIES for o in s.origins)
    assert S.TRAINING_FAMILIES == ("deepseek-v3", "gemma-2", "llama-3.1", "llama-3.2", "mistral", "phi",
                                   "qwen2.5", "yi-1.5")


def test_foundation_suite():
    fs = GS.foundation_suite("bf16")
    assert len(fs) >= 40
    assert len(set(fs)) == len(fs)
    assert any(s.m <= 64 for s in fs) and any(s.m >= 1024 for s in fs)
    big_decode = [s for s in fs if s.m <= 64 and s.n * s.k * 2 >= 256 * 2**20]
    assert len(big_decode) >= 4
    assert len({(s.n, s.k) for s in big_decode}) >= 4
    assert GS.foundation_suite("bf16") == fs                 # deterministic
    assert {s.dtype for s in GS.foundation_suite("fp8")} == {"fp8"}
    nk = S.nk_pairs()
    assert all((s.n, s.k) in nk for s in fs)


def test_shape_key_family_and_equality():
    a = S.Shape(7, 40, 72, "fp16", ("llama-3.1/Llama-3.1-8B/qkv_proj/tp1",))
    b = S.Shape(7, 40, 72, "fp16", ("other/x/y/tp1",))
    assert a.key == "fp16:7x40x72"
    assert a.family == "llama-3.1"
    assert S.Shape(7, 40, 72, "fp16").family == "user"
    assert a == b and hash(a) == hash(b)  # origins do not take part in identity


# ----------------------------------------------------------------------------
# read_shape_csv
# ----------------------------------------------------------------------------

def _csv(tmp_path, text, name="shapes.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_read_csv_lowercase_without_dtype(tmp_path):
    p = _csv(tmp_path, "m,n,k\n1,4096,4096\n33,40,72\n")
    got = S.read_shape_csv(p, default_dtype="fp16")
    assert [(s.m, s.n, s.k, s.dtype) for s in got] == [(1, 4096, 4096, "fp16"), (33, 40, 72, "fp16")]
    assert got[0].origins == (f"user/{p}",)
    assert got[0].family == "user"


def test_read_csv_uppercase_with_dtype(tmp_path):
    p = _csv(tmp_path, "M, N ,K,DType\n1,4096,4096,fp8\n16,128,256, bf16\n2,8,8,\n")
    got = S.read_shape_csv(p)
    assert [(s.m, s.n, s.k, s.dtype) for s in got] == [
        (1, 4096, 4096, "fp8"), (16, 128, 256, "bf16"), (2, 8, 8, "bf16")]  # empty dtype -> default


def test_read_csv_missing_column(tmp_path):
    p = _csv(tmp_path, "M,N\n1,2\n")
    with pytest.raises(ValueError, match="missing column K") as ei:
        S.read_shape_csv(p)
    assert str(ei.value).startswith(f"{p}:")


@pytest.mark.parametrize("body,line,fragment", [
    ("M,N,K\n1,2,3\n4,five,6\n", 3, "invalid literal for int"),
    ("M,N,K\n0,2,3\n", 2, "m must be >= 1, got 0"),
    ("M,N,K,dtype\n1,2,3,bf16\n1,2,3,int4\n", 3, "dtype must be one of"),
    ("M,N,K\n1,2,3\n4,5\n", 3, ""),  # short row: K missing
])
def test_read_csv_bad_rows_name_file_and_line(tmp_path, body, line, fragment):
    p = _csv(tmp_path, body)
    with pytest.raises(ValueError) as ei:
        S.read_shape_csv(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: ")
    assert fragment in msg


def test_read_csv_empty_file(tmp_path):
    p = _csv(tmp_path, "")
    with pytest.raises(ValueError, match="empty shape file"):
        S.read_shape_csv(p)


def test_read_csv_line_number_after_blank_line(tmp_path):
    p = _csv(tmp_path, "M,N,K\n\n0,2,3\n")
    with pytest.raises(ValueError) as ei:
        S.read_shape_csv(p)
    assert str(ei.value).startswith(f"{p}:3: ")
