"""The dense GEMM's torch custom ops: ``gemm(x, w)`` (bf16/fp16) and ``gemm_fp8(x, w, scale_a,
scale_b)`` (per-tensor scales) compute y = x @ w.T (nn.Linear layout: x is (M, K), w is (N, K)).

Registered as ``torch.ops.gemm_costmodel.gemm`` / ``gemm_fp8`` with fake implementations, so they
trace under torch.compile and replay inside CUDA graphs: the decision is made on the host from the
shapes alone. The decision itself comes from serving, which binds a host here (``bind``, called by
``gemm_costmodel.serving.ops`` on import: the registry's ``torch_op`` field names this module), so
this folder imports nothing from serving; users call these through ``gemm_costmodel.serving.ops``.
"""
from __future__ import annotations

import torch

from . import impl as K
from .space import Problem

# The torch.ops.gemm_costmodel names this module registers (tests/test_registry.py checks them).
CUSTOM_OPS = ("gemm", "gemm_fp8")
# The names gemm_costmodel.serving.ops re-exports (its public API).
EXPORTS = ("gemm", "gemm_fp8", "choose")

_host = None


def bind(host) -> None:
    """Called by serving.ops with its host for this op (serving/ops.py ``_Host``: ``select``,
    ``tuning``, ``decide``, ``config``, ``dispatcher``)."""
    global _host
    _host = host


def _bound():
    if _host is None:
        raise RuntimeError("no dispatcher bound: import gemm_costmodel.serving.ops (it binds the dispatcher)")
    return _host


def choose(x: torch.Tensor, w: torch.Tensor, scale_a=None, scale_b=None) -> str:
    """The config id the ops would launch for these operands (validates them)."""
    host = _bound()
    name = K.check_operands(x, w, scale_a, scale_b)
    m, k = x.shape
    n = w.shape[0]
    if not host.tuning():  # the warm path: one cached model decision
        return host.select(m, n, k, name)

    def run(cid):
        return K.launch(host.config(cid), x, w, None, scale_a, scale_b)

    # Unsure mode keys a shape as <dtype>:<M>x<N>x<K> (the Dispatcher's tuned-table format).
    return host.decide(m, n, k, name, key=f"{name}:{m}x{n}x{k}", run=run,
                       agree=lambda y, ref: torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2),
                       problem=lambda: Problem(m, n, k, name), operand=x)


def _run(x, w, scale_a=None, scale_b=None) -> torch.Tensor:
    return K.launch(_bound().config(choose(x, w, scale_a, scale_b)), x, w, None, scale_a, scale_b)


@torch.library.custom_op("gemm_costmodel::gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _run(x, w)


@_gemm_op.register_fake
def _(x, w):
    return x.new_empty((x.shape[0], w.shape[0]))


def _run_fp8(x, w, scale_a, scale_b) -> torch.Tensor:
    # The launchers apply scale_a and scale_b only to fp8 operands (launch_args): bf16/fp16 ones
    # would come back unscaled, a silently wrong y (issue 57, row 4), so they are refused here.
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float8_e4m3fn:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be float8_e4m3fn for gemm_fp8 (its scales apply to fp8 operands only), got {got}; "
                         "use gemm for bf16/fp16 operands")
    return _run(x, w, scale_a, scale_b)


@torch.library.custom_op("gemm_costmodel::gemm_fp8", mutates_args=())
def _gemm_fp8_op(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    return _run_fp8(x, w, scale_a, scale_b)


@_gemm_fp8_op.register_fake
def _(x, w, scale_a, scale_b):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)


# Eager calls skip the custom-op dispatcher: it costs ~20 us of host time per call on
# launch-bound shapes (measured on the H100 host), while tracing (torch.compile) needs
# the registered op. Both paths run the same decision and launch.

def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ w.T for bf16/fp16 x (M, K) and w (N, K), on the dispatched kernel."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm(x, w)
    return _run(x, w)


def gemm_fp8(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """y = (x @ w.T) * scale_a * scale_b in bf16, for fp8 e4m3 x (M, K), w (N, K) and fp32 scalar scales."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm_fp8(x, w, scale_a, scale_b)
    return _run_fp8(x, w, scale_a, scale_b)
