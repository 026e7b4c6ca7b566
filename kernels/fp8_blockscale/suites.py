"""Shape suites of the fp8_blockscale op (torch-free).

- ``train``: the dense training families' (N, K) plus DeepSeek-V3's vLLM-tuned (N, K), over
  the dense M grid; swept with a sample of candidates per shape (a shard of it: see
  benchmarks/device_fp8_blockscale.sh).
- ``eval``: evaluation shapes, every candidate measured: vLLM's 23 H100-tuned (N, K) at
  EVAL_M_VLLM (on and off vLLM's M grid), and, for every other training family, a few of its
  (N, K) at EVAL_M_FAMILY. All come from the training families (DeepSeek-V3 is one): the
  held-out evaluation leaves one family out at a time.
- ``gate``: the GPU correctness gate's odd shapes (M = 1, 7, 64, 4097; N and K not multiples
  of 128, K = 128); not from a model family, so never in the dataset.
"""
from __future__ import annotations

from gemm_costmodel.kernels.shapes import M_GRID, Shape, nk_pairs

# The (N, K) of vLLM 0.33.0's tuned w8a8 block-fp8 files (DeepSeek-V3 layers at its TP
# degrees): the union of the 23 H100 and 23 H200 files
# (datasets/vllm/0.33.0/w8a8_block_fp8_configs/MANIFEST.csv).
VLLM_TUNED_NK = (
    (256, 7168), (512, 7168), (576, 7168), (1536, 1536), (1536, 7168), (2048, 512), (2112, 7168),
    (2304, 7168), (3072, 1536), (3072, 7168), (4096, 512), (4096, 7168), (4608, 7168), (7168, 128),
    (7168, 256), (7168, 1024), (7168, 1152), (7168, 2048), (7168, 2304), (7168, 16384), (7168, 18432),
    (12288, 7168), (24576, 1536), (24576, 7168), (32768, 512), (36864, 7168),
)
# The 23 of them with an H100 file.
VLLM_H100_NK = (
    (256, 7168), (576, 7168), (1536, 1536), (1536, 7168), (2048, 512), (2112, 7168), (2304, 7168),
    (3072, 7168), (4096, 512), (4096, 7168), (4608, 7168), (7168, 128), (7168, 1024), (7168, 1152),
    (7168, 2048), (7168, 2304), (7168, 16384), (7168, 18432), (12288, 7168), (24576, 1536), (24576, 7168),
    (32768, 512), (36864, 7168),
)
_VLLM_ORIGIN = "deepseek-v3/DeepSeek-V3/vllm_w8a8_block_fp8_tuned"

# On vLLM's M grid (1, 16, 4096) and between its keys (100: nearest 96; 512 is a key; 1000:
# nearest 1024): what a user's batch meets.
EVAL_M_VLLM = (1, 16, 100, 512, 4096)
EVAL_M_FAMILY = (1, 64, 2048)
EVAL_PAIRS_PER_FAMILY = 2


def _pairs() -> dict[tuple[int, int], list[str]]:
    pairs = {nk: list(orig) for nk, orig in nk_pairs().items()}
    for nk in VLLM_TUNED_NK:
        pairs.setdefault(nk, []).append(_VLLM_ORIGIN)
    return pairs


def training_suite(dtype: str = "fp8", ms=M_GRID) -> list[Shape]:
    """The dense training families' (N, K) plus DeepSeek-V3's vLLM-tuned (N, K), over the dense
    M grid (deepseek-v3 is a training family)."""
    return [Shape(m, n, k, dtype, tuple(orig)) for (n, k), orig in sorted(_pairs().items()) for m in ms]


def eval_suite(dtype: str = "fp8") -> list[Shape]:
    """Evaluation shapes (measure with --mode all): vLLM's H100-tuned (N, K) at EVAL_M_VLLM, and
    EVAL_PAIRS_PER_FAMILY (N, K) of every other training family (spread by weight size) at
    EVAL_M_FAMILY."""
    pairs = _pairs()
    out = [Shape(m, n, k, dtype, tuple(pairs[(n, k)])) for (n, k) in VLLM_H100_NK for m in EVAL_M_VLLM]
    by_family: dict[str, list] = {}
    for nk, orig in sorted(pairs.items(), key=lambda kv: kv[0][0] * kv[0][1]):
        by_family.setdefault(orig[0].split("/")[0], []).append((nk, orig))
    for fam, items in sorted(by_family.items()):
        if fam == "deepseek-v3":
            continue
        step = max(1, len(items) // (EVAL_PAIRS_PER_FAMILY + 1))
        for (n, k), orig in items[step::step][:EVAL_PAIRS_PER_FAMILY]:
            out += [Shape(m, n, k, dtype, tuple(orig)) for m in EVAL_M_FAMILY]
    return list(dict.fromkeys(out))


GATE_NK = ((576, 7168), (1000, 1000), (7168, 128), (2112, 7168))
GATE_M = (1, 7, 64, 4097)


def gate_suite(dtype: str = "fp8") -> list[Shape]:
    """The correctness gate's odd shapes (not model layers: never in the dataset)."""
    return [Shape(m, n, k, dtype, ("gate/odd-shapes",)) for (n, k) in GATE_NK for m in GATE_M]
