"""vLLM 0.33.0's device names in its tuned-config file names (torch-free).

vLLM names a tuned file by the CUDA device name turned into a file-name part
(``vllm.utils.platform_utils.get_device_name_as_file_name``: every run of whitespace or '/' becomes
one '_'). The two kinds of file then differ:

- fused MoE (``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``get_config_file_name``): a
  name one of whose '_'-separated parts is exactly ``H200`` becomes ``NVIDIA_H200`` (so "NVIDIA
  H200 NVL" reads the H200's files; "NVIDIA GH200 480GB" is not mapped: its part is ``GH200``);
- w8a8 block-fp8 linear (``vllm/model_executor/layers/quantization/utils/fp8_utils.py``,
  ``get_w8a8_block_fp8_configs``): the file-name part as it is, no H200 mapping.

An exported file carries the name vLLM computes on the GPU it is for, or vLLM never finds it.
"""
from __future__ import annotations

import re

VLLM_VERSION = "0.33.0"

# get_device_name_as_file_name's substitution.
_SEPARATORS = re.compile(r"[\s/]+")
# get_config_file_name's H200 family: the part it looks for and the name it uses instead.
_H200_PART = "H200"
_H200_NAME = "NVIDIA_H200"

KIND_MOE = "moe"
KIND_BLOCK_FP8 = "block_fp8"
KINDS = (KIND_MOE, KIND_BLOCK_FP8)


def file_device_name(gpu_name: str) -> str:
    """vLLM's ``get_device_name_as_file_name`` of a CUDA device name (the block-fp8 files' part)."""
    return _SEPARATORS.sub("_", gpu_name)


def moe_device_name(gpu_name: str) -> str:
    """The device part of vLLM's fused-MoE file names (``get_config_file_name``)."""
    name = file_device_name(gpu_name)
    return _H200_NAME if _H200_PART in name.split("_") else name


def device_name(gpu_name: str, kind: str) -> str:
    """The device part vLLM puts in the file name of this kind (``KIND_MOE`` or ``KIND_BLOCK_FP8``)."""
    if kind == KIND_MOE:
        return moe_device_name(gpu_name)
    if kind == KIND_BLOCK_FP8:
        return file_device_name(gpu_name)
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
