"""Shape suites of the fp8_blockscale op (torch-free)."""
from __future__ import annotations

from gemm_costmodel.data.shapes import M_GRID, Shape, nk_pairs

# The (N, K) of vLLM 0.33.0's tuned w8a8 block-fp8 files (DeepSeek-V3 layers at its TP
# degrees): the union of the 23 H100 and 23 H200 files
# (../shared/external/vllm_w8a8_block_fp8_configs/MANIFEST.csv).
VLLM_TUNED_NK = (
    (256, 7168), (512, 7168), (576, 7168), (1536, 1536), (1536, 7168), (2048, 512), (2112, 7168),
    (2304, 7168), (3072, 1536), (3072, 7168), (4096, 512), (4096, 7168), (4608, 7168), (7168, 128),
    (7168, 256), (7168, 1024), (7168, 1152), (7168, 2048), (7168, 2304), (7168, 16384), (7168, 18432),
    (12288, 7168), (24576, 1536), (24576, 7168), (32768, 512), (36864, 7168),
)
_VLLM_ORIGIN = "deepseek-v3/DeepSeek-V3/vllm_w8a8_block_fp8_tuned"


def training_suite(dtype: str = "fp8", ms=M_GRID) -> list[Shape]:
    """The dense training families' (N, K) plus DeepSeek-V3's vLLM-tuned (N, K), over the dense
    M grid (deepseek-v3 is a training family)."""
    pairs = {nk: list(orig) for nk, orig in nk_pairs().items()}
    for nk in VLLM_TUNED_NK:
        pairs.setdefault(nk, []).append(_VLLM_ORIGIN)
    return [Shape(m, n, k, dtype, tuple(orig)) for (n, k), orig in sorted(pairs.items()) for m in ms]
