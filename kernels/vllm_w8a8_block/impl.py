"""The op ``vllm_w8a8_block``'s implementation (torch, triton; imported lazily by the registry).

A candidate runs vLLM's ``_w8a8_triton_block_scaled_mm`` compiled from a vLLM source
(``kernels/vllm/source.py``: COSTMODEL_VLLM_SRC, ./.vllm_src, or an installed vllm; nothing of vLLM
is in this repository), launched by ``kernels/moe/vllm_kernels.w8a8_block_fp8_matmul`` (our mirror
of vLLM 0.33.0's ``w8a8_triton_block_scaled_mm``: grid, strides, block_size [128, 128]). The
vendor candidate is the fp8_blockscale op's blockwise torch._scaled_mm.

The operands, the reference and the error bounds are the fp8_blockscale op's (the same problem:
activations quantised per token and 128 columns, weights per 128x128 block, y in bf16; the fp32
reference of the dequantised operands; the output rounding bounds the error).
"""
from __future__ import annotations

import torch

from ..fp8_blockscale import impl as BI
from ..moe import vllm_kernels as VK
from ..vllm import source as S
from .space import GROUP_K, GROUP_N, Problem, VendorConfig, VllmBlockConfig, to_vllm

TORCH_DTYPES = BI.TORCH_DTYPES
OUT_TORCH_DTYPES = BI.OUT_TORCH_DTYPES
ERROR_BOUNDS = dict(BI.ERROR_BOUNDS)

_KERNELS: list = []


def unavailable() -> str:
    """'' when vLLM's kernels can be compiled here (a vLLM source is found), else why not."""
    if _KERNELS:
        return ""
    src, why = S.find_source()
    return "" if src is not None else why


def kernels():
    """vLLM's kernels module, compiled from the source ``find_source`` names on first use and kept for
    the process."""
    if not _KERNELS:
        _KERNELS.append(VK.compile_kernels())
    return _KERNELS[0]


def launch(cfg, a: torch.Tensor, b: torch.Tensor, as_: torch.Tensor, bs: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Run candidate ``cfg`` for y = (a * as_) @ (b * bs).T into ``out`` (bf16 for fp8 inputs, else the
    input dtype); never synchronises."""
    if out is None:
        out = torch.empty((a.shape[0], b.shape[0]), dtype=OUT_TORCH_DTYPES[BI.dtype_name(a)], device=a.device)
    if isinstance(cfg, VendorConfig):
        return BI.launch(cfg, a, b, as_, bs, out)
    if not isinstance(cfg, VllmBlockConfig):
        raise ValueError(f"not a vllm_w8a8_block candidate: {cfg!r}")
    return VK.w8a8_block_fp8_matmul(kernels(), a, b, as_, bs, [GROUP_N, GROUP_K], to_vllm(cfg), out.dtype, out=out)


class Operands(BI.Operands):
    """The fp8_blockscale op's operand set, run through this op's candidates."""

    def run(self, cfg) -> torch.Tensor:
        return launch(cfg, self.a, self.b, self.as_, self.bs, self.out)


def make_operands(problem: Problem, device, generator: torch.Generator) -> Operands:
    """Fresh random inputs quantised as vLLM does (the fp8_blockscale op's ``make_operands``). On a GPU,
    no vLLM source is an error here, before any candidate runs (the harness stops the sweep with it)."""
    why = unavailable() if torch.device(device).type == "cuda" else ""
    if why:
        raise RuntimeError(f"vllm_w8a8_block: {why}")
    o = BI.make_operands(problem, device, generator)
    return Operands(o.a, o.b, o.as_, o.bs, o.out)


reference = BI.reference
