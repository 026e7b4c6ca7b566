"""The op ``vllm_moe``'s implementation (torch, triton; imported lazily by the registry).

A candidate runs a whole MoE layer: vLLM's ``fused_moe_kernel`` compiled from a vLLM source
(``kernels/vllm/source.py``: COSTMODEL_VLLM_SRC, ./.vllm_src, or an installed vllm; nothing of
vLLM is in this repository) and launched by ``kernels/moe/vllm_kernels.fused_experts``, our mirror
of vLLM 0.33.0's ``fused_experts_impl`` with the config for both GEMMs: the expert assignment
(vLLM's per-pair path, or the MoE op's align in place of vLLM's ``moe_align_block_size``), the
gate_up GEMM, silu-and-mul, the down GEMM (times the routing weights), the sum over top_k; fp8:
the activations quantised with a static per-tensor scale before each GEMM, fp8bs: per token and
128 columns with dynamic scales. The vendor candidate runs the MoE op's torch._grouped_mm path for
both GEMMs (bf16).

The reference is the MoE op's fp32 layer reference (``moe.impl.moe_reference``) of the same
(quantised) operands. The error bound of a layer allows two GEMMs' errors: bf16 rounds the
intermediate and the per-pair outputs (each 2^-9) and the MoE op's per-GEMM bound (1e-2) covers
both; fp8 and fp8bs quantise the intermediate again from the kernel's own bf16 intermediate, which
differs from the reference's by a rounding here and there, so an element may land one fp8 step
away (2^-4 of it) and the down GEMM adds its own error. Each such flip moves every output of a token
together, by about 2^-3 |h_j| / (sqrt(N) rms(h)): ~0.006 at the gate suite's N = 200, so a small
layer's error is a few flips, whatever the config. The H200 gate (benchmarks/results/vllm_kernels/
h200-gate/) measured 0.0200-0.0243 on six fp8/fp8bs layers with N <= 200 at M 1-7, the same value for
every config of a layer: three times the per-GEMM bound (0.03) covers that, while a lost K tile or a
wrong expert costs 0.1 and more.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..moe import impl as MI
from ..moe import routing as R
from ..moe import space as MSP
from ..moe import vllm_kernels as VK
from ..vllm import source as S
from .space import BLOCK_DTYPE, Problem, VendorConfig, VllmMoeConfig, to_vllm

TORCH_DTYPES = MI.TORCH_DTYPES
OUT_TORCH_DTYPES = MI.OUT_TORCH_DTYPES
ERROR_BOUNDS = {"bf16": MI.ERROR_BOUNDS["bf16"], "fp8": 3 * MI.ERROR_BOUNDS["fp8"],
                BLOCK_DTYPE: 3 * MI.ERROR_BOUNDS[BLOCK_DTYPE], "fp16": MI.ERROR_BOUNDS["fp16"],
                "fp32": MI.ERROR_BOUNDS["fp32"]}
# How the harness keeps a layer's timed reads out of L2 (the MoE op's: shifted expert ids).
L2_POLICY = MI.L2_POLICY

_KERNELS: list = []


def unavailable() -> str:
    """'' when vLLM's kernels can be compiled here (a vLLM source is found), else why not."""
    if _KERNELS:
        return ""
    src, why = S.find_source()
    return "" if src is not None else why


def _require_source(device) -> None:
    """On a GPU, no vLLM source is an error before any candidate runs: the harness then stops the sweep
    with the reason, instead of recording every candidate as a compile error."""
    why = unavailable() if torch.device(device).type == "cuda" else ""
    if why:
        raise RuntimeError(f"vllm_moe: {why}")


def kernels():
    """vLLM's kernels module, compiled from the source ``find_source`` names on first use and kept for
    the process (a launch must not open the wheel again)."""
    if not _KERNELS:
        _KERNELS.append(VK.compile_kernels())
    return _KERNELS[0]


@dataclass
class Operands:
    """One layer's inputs and its preallocated output y (M, hidden). x (M, hidden) in the activation
    dtype (bf16 for fp8 and fp8bs: quantised inside the layer); w1 (E, 2N, hidden), w2 (E, hidden,
    N); fp8: w1_scale/w2_scale (E,) and static a1_scale/a2_scale (1,); fp8bs: block scales
    (E, ceil(./128), ceil(./128)) and no activation scales."""

    x: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    out: torch.Tensor
    w1_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    a1_scale: torch.Tensor | None = None
    a2_scale: torch.Tensor | None = None

    def run(self, cfg) -> torch.Tensor:
        return launch(cfg, self)

    @property
    def nbytes(self) -> int:
        ts = (self.x, self.w1, self.w2, self.topk_weights, self.topk_ids, self.out, self.w1_scale, self.w2_scale,
              self.a1_scale, self.a2_scale)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def launch(cfg, ops: Operands) -> torch.Tensor:
    """Run the layer on candidate ``cfg`` into ``ops.out``; never synchronises (CUDA-graph safe after
    one warm-up call, as the MoE op's launches)."""
    if isinstance(cfg, VendorConfig):
        return MI.fused_moe(ops.x, ops.w1, ops.w2, ops.topk_weights, ops.topk_ids, MSP.VENDOR, MSP.VENDOR,
                            w1_scale=ops.w1_scale, w2_scale=ops.w2_scale, a1_scale=ops.a1_scale,
                            a2_scale=ops.a2_scale, out=ops.out, check=False)
    if not isinstance(cfg, VllmMoeConfig):
        raise ValueError(f"not a vllm_moe candidate: {cfg!r}")
    return VK.fused_experts(kernels(), ops.x, ops.w1, ops.w2, ops.topk_weights, ops.topk_ids, to_vllm(cfg),
                            w1_scale=ops.w1_scale, w2_scale=ops.w2_scale, a1_scale=ops.a1_scale,
                            a2_scale=ops.a2_scale, out=ops.out)


def _act_dtype(dtype: str) -> torch.dtype:
    return OUT_TORCH_DTYPES[dtype]


def make_operands(problem: Problem, device, generator: torch.Generator, storage: torch.dtype | None = None
                  ) -> Operands:
    """Fresh random inputs of one layer (never zeros): x ~ N(0, 1) (fp8bs: times a per-token
    magnitude 2^-3 .. 2^3, so the group scales differ by row), weights ~ N(0, 1/K) per expert
    (the MoE op's generators: fp8 per-expert scales, fp8bs 128x128 block scales), topk_ids from the
    routing, topk_weights positive and normalised per token. fp8's static activation scales are
    the amax / 448 of x and of the reference intermediate. ``storage`` (fp8bs only): fp16/fp32
    stand-ins for the CPU interpreter, same scales."""
    _require_source(device)
    m, n, k, e, top_k, dtype = problem.m, problem.n, problem.k, problem.e, problem.top_k, problem.dtype
    ids = torch.from_numpy(np.ascontiguousarray(R.topk_ids(problem.routing, m, e, top_k))).to(device)
    tw = torch.rand((m, top_k), generator=generator, device=device) + 0.25
    tw /= tw.sum(dim=1, keepdim=True)
    x = torch.randn((m, k), generator=generator, device=device, dtype=torch.float32)
    w1_scale = w2_scale = a1_scale = a2_scale = None
    if dtype == BLOCK_DTYPE:
        store = storage or torch.float8_e4m3fn
        x *= torch.exp2(torch.rand((m, 1), generator=generator, device=device) * 6 - 3)
        w1, w1_scale = MI.random_block_weights(e, 2 * n, k, device, generator, store)
        w2, w2_scale = MI.random_block_weights(e, k, n, device, generator, store)
        x = x.to(OUT_TORCH_DTYPES[MI.DTYPE_NAMES[store]] if storage is not None else torch.bfloat16)
    else:
        w1, w1_scale = MI.random_weights(e, 2 * n, k, dtype, device, generator)
        w2, w2_scale = MI.random_weights(e, k, n, dtype, device, generator)
        x = x.to(_act_dtype(dtype))
        if dtype == "fp8":
            a1_scale = MI.dynamic_scale(x)
            h = MI.stage_reference("gate_up", x, w1, tw, ids, a1_scale, w1_scale)
            a2_scale = MI.dynamic_scale(h)
    out = torch.empty((m, k), dtype=x.dtype, device=device)
    return Operands(x, w1, w2, tw, ids, out, w1_scale, w2_scale, a1_scale, a2_scale)


def reference(ops: Operands) -> torch.Tensor:
    """fp32 reference of the layer (the MoE op's): the intermediate rounded to the activation dtype
    and, for fp8, quantised as the down GEMM's input is."""
    return MI.moe_reference(ops.x, ops.w1, ops.w2, ops.topk_weights, ops.topk_ids, w1_scale=ops.w1_scale,
                            w2_scale=ops.w2_scale, a1_scale=ops.a1_scale, a2_scale=ops.a2_scale)


def bytes_read(ops: Operands) -> int:
    """Bytes one layer reads and writes: the weights of the experts topk_ids names (both GEMMs),
    the activations and the output. Reads topk_ids on the host (harness set-up only)."""
    active = int(ops.topk_ids.unique().numel())
    w = active * sum(w.shape[1] * w.shape[2] * w.element_size() for w in (ops.w1, ops.w2))
    return w + sum(t.numel() * t.element_size() for t in (ops.x, ops.out))


def timing_copies(first: Operands, n_copies: int) -> list[Operands]:
    """Up to ``n_copies`` operand sets to rotate over when timing: the weights shared, topk_ids
    shifted by whole spans of experts (the MoE op's rule, ``moe.impl.timing_copies``), so the
    experts a launch reads are not left in L2 by the one before."""
    e = first.w1.shape[0]
    lo, hi = int(first.topk_ids.min()), int(first.topk_ids.max())
    stride = hi - lo + 1
    n = max(1, min(int(n_copies), e // stride))
    ids = first.topk_ids.long()
    return [first] + [dataclasses.replace(first, topk_ids=((ids + j * stride) % e).to(first.topk_ids.dtype))
                      for j in range(1, n)]
