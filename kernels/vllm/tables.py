"""vLLM's own tuned tables, kept in this repository as data (datasets/vllm/<version>/, with their
source, version, license and sha256 in PROVENANCE.json): what the baselines, the spaces' vLLM
config lists and the tests compare against, so a fresh clone reproduces every vLLM comparison.
Torch-free."""
from __future__ import annotations

import os

from .names import KIND_BLOCK_FP8, KIND_MOE, KINDS, VLLM_VERSION

# Sub-folders per kind: vLLM's fused_moe/configs/ and quantization/utils/configs/ (the H100 SXM
# and H200 files of each).
SUBDIRS = {KIND_MOE: "fused_moe_configs", KIND_BLOCK_FP8: "w8a8_block_fp8_configs"}


def tables_root(version: str = VLLM_VERSION) -> str:
    """datasets/vllm/<version>/ of this checkout (the kernels/ folder's sibling datasets/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "datasets", "vllm", version))


def tables_dir(kind: str, version: str = VLLM_VERSION) -> str:
    """The folder of vLLM's tuned files of one kind (KIND_MOE or KIND_BLOCK_FP8)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return os.path.join(tables_root(version), SUBDIRS[kind])
