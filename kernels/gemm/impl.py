"""The dense GEMM op's implementation, as the op registry sees it (imported lazily:
torch and triton). What the harness, the correctness gate and the explorations need
of an op: its operands (fresh random inputs, never zeros, and a preallocated
output), the fp32 reference, the error bound, the operand checks and the launch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernel as gemm
from .kernel import check_operands  # noqa: F401 - part of the op's interface
from .space import GemmConfig, Problem

# Relative Frobenius error bounds, per input dtype. The error is dominated by
# rounding the fp32 accumulator to the output dtype (bf16: 2^-9 per element,
# fp16: 2^-12) and by TF32 for fp32 dots on the GPU.
ERROR_BOUNDS = {"bf16": 1e-2, "fp16": 2e-3, "fp8": 1e-2, "fp32": 2e-3}

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class Operands:
    """One set of inputs and a preallocated output for a problem."""

    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor
    scale_a: torch.Tensor | None = None
    scale_b: torch.Tensor | None = None

    def run(self, cfg: GemmConfig) -> torch.Tensor:
        return gemm.launch(cfg, self.x, self.w, self.out, self.scale_a, self.scale_b)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.w, self.out))


def launch(cfg: GemmConfig, x: torch.Tensor, w: torch.Tensor, out=None, scale_a=None, scale_b=None):
    """``gemm.launch``, looked up at call time (so a wrapped or patched launcher is the one used)."""
    return gemm.launch(cfg, x, w, out, scale_a, scale_b)


def make_operands(problem: Problem, device: str | torch.device, generator: torch.Generator) -> Operands:
    """Fresh random inputs (never zeros). Weights are scaled by 1/sqrt(K) so outputs are O(1)."""
    m, n, k = problem.m, problem.n, problem.k
    x = torch.randn((m, k), generator=generator, device=device, dtype=torch.float32)
    w = torch.randn((n, k), generator=generator, device=device, dtype=torch.float32) * k ** -0.5
    if problem.dtype == "fp8":
        sa = (x.abs().amax() / FP8_MAX).reshape(1).float()
        sb = (w.abs().amax() / FP8_MAX).reshape(1).float()
        xq = (x / sa).to(torch.float8_e4m3fn)
        wq = (w / sb).to(torch.float8_e4m3fn)
        out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        return Operands(xq, wq, out, sa, sb)
    dt = gemm.TORCH_DTYPES[problem.dtype]
    xd, wd = x.to(dt), w.to(dt)
    return Operands(xd, wd, torch.empty((m, n), dtype=dt, device=device))


def reference(ops: Operands) -> torch.Tensor:
    """fp32 reference output for one operand set."""
    return gemm.reference(ops.x, ops.w, ops.scale_a, ops.scale_b)
