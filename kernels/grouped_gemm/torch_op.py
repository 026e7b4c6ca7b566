"""``grouped_linear(x, w, group_offsets)``: the expert GEMMs of an MoE layer as one differentiable
torch op, whose forward and backward passes each run the kernel picked for their own problem.

    y = grouped_linear(x, w, offs)   # x (M, K), w (G, N, K), offs int32 (G,) -> y (M, N)
    y.sum().backward()               # x.grad = dgrad pass, w.grad = wgrad pass

Rows [offs[g-1], offs[g]) of x belong to group g (offs: cumulative ends, torch._grouped_mm's
``offs``; offs[-1] must be M, rows past it are left unwritten). Groups may be empty (their dW_g is
zeros).

Each pass is a ``torch.library.custom_op`` (``gemm_costmodel::grouped_gemm_fwd`` / ``_dgrad`` /
``_wgrad``) with a fake (meta) implementation, and the forward's autograd formula calls the other
two, so the op traces under torch.compile (an opaque call per pass) and can be captured in a CUDA
graph: a pass reads only shapes on the host (no device sync, no data-dependent host logic); its
pick is a host-side function of the shapes, cached.

The pick: ``decide(problem) -> config id`` for the pass's ``space.Problem`` (routing
``balanced``: the real histogram is on the device). The serving layer injects its dispatcher's
decision with ``set_decide``; kernels/ imports nothing from it. Without one, the fallback rule
``space.choose_problem``. A vendor pick (``grouped_mm``) where torch._grouped_mm cannot run (not
bf16, N or K not multiples of 8) falls back to the rule's Triton pick.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch

from . import impl as I
from . import space as S

_lock = threading.Lock()
_decide: Callable | None = None
_cache: dict = {}

# The torch.ops.gemm_costmodel names this module registers (tests/test_registry.py checks them).
CUSTOM_OPS = ("grouped_gemm_fwd", "grouped_gemm_dgrad", "grouped_gemm_wgrad")
# The names gemm_costmodel.serving.ops re-exports (its public API).
EXPORTS = ("grouped_linear",)


_host = None


def bind(host) -> None:
    """Called by serving.ops with its host for this op (registry ``torch_op``): every pass's pick is
    then the dispatcher's (tuned table, model, or its fallback rule), one decision per shape."""
    global _host
    _host = host
    dtypes = tuple(host.spec.dtypes)

    def decide(p):
        # The dispatcher serves the op's dtypes (bf16); fp16/fp32 passes (e.g. CPU checks) take the rule.
        if p.dtype not in dtypes:
            return default_decide(p)
        return host.select(p.m, p.n, p.k, p.dtype, e=p.e, stage=p.stage, routing=p.routing)

    set_decide(decide)


def set_decide(fn: Callable | None) -> None:
    """Install ``fn(problem) -> config id`` as the pick of every pass (None: the fallback rule);
    clears the cached picks."""
    global _decide
    if fn is not None and not callable(fn):
        raise ValueError(f"decide must be callable or None, got {type(fn).__name__}")
    with _lock:
        _decide = fn
        _cache.clear()


@contextlib.contextmanager
def using_decide(fn: Callable | None):
    """``set_decide(fn)`` for the duration of a ``with`` block (then the previous one again)."""
    prev = _decide
    set_decide(fn)
    try:
        yield
    finally:
        set_decide(prev)


def default_decide(problem: S.Problem) -> str:
    """The fallback rule's pick (no model): a Triton config."""
    return S.choose_problem(problem)


def _sm_arch(device: torch.device) -> str:
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        return "sm90" if major >= 9 else "sm80"
    return "sm90"


def pick(stage: str, m: int, n: int, k: int, e: int, dtype: torch.dtype, device: torch.device):
    """The config a pass runs (cached per shape): ``decide``'s, or the fallback rule's where the
    decision cannot run here."""
    key = (stage, m, n, k, e, dtype, device.type, _decide)
    cfg = _cache.get(key)
    if cfg is not None:
        return cfg
    problem = S.Problem(m, n, k, I.DTYPE_NAMES[dtype], e, stage, "balanced")
    fn = _decide or default_decide
    cfg = S.config_from_id(fn(problem))
    ok, _ = S.check_feasible(cfg, problem, _sm_arch(device))
    if not ok or (isinstance(cfg, S.VendorConfig) and (device.type != "cuda" or not hasattr(torch, "_grouped_mm"))):
        # The vendor's fast path is CUDA sm90 bf16; elsewhere the rule's Triton kernel runs.
        cfg = S.config_from_id(default_decide(problem))
    with _lock:
        _cache[key] = cfg
    return cfg


def _run(stage: str, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()
    msg = I.check_operands(stage, a, b, offs)
    if msg:
        raise ValueError(msg)
    if stage == "wgrad":
        (m, n), k, e = a.shape, b.shape[1], offs.shape[0]
    else:
        m = a.shape[0]
        e, n, k = b.shape
    cfg = pick(stage, m, n, k, e, a.dtype, a.device)
    return I.launch(cfg, stage, a, b, offs)


@torch.library.custom_op("gemm_costmodel::grouped_gemm_fwd", mutates_args=())
def grouped_gemm_fwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """y (M, N): y_g = x_g @ W_g^T."""
    return _run("fwd", x, w, offs)


@grouped_gemm_fwd.register_fake
def _(x, w, offs):
    return x.new_empty((x.shape[0], w.shape[1]))


@torch.library.custom_op("gemm_costmodel::grouped_gemm_dgrad", mutates_args=())
def grouped_gemm_dgrad(dy: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """dx (M, K): dx_g = dy_g @ W_g."""
    return _run("dgrad", dy, w, offs)


@grouped_gemm_dgrad.register_fake
def _(dy, w, offs):
    return dy.new_empty((dy.shape[0], w.shape[2]))


@torch.library.custom_op("gemm_costmodel::grouped_gemm_wgrad", mutates_args=())
def grouped_gemm_wgrad(dy: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """dW (G, N, K): dW_g = dy_g^T @ x_g (zeros for an empty group)."""
    return _run("wgrad", dy, x, offs)


@grouped_gemm_wgrad.register_fake
def _(dy, x, offs):
    return dy.new_empty((offs.shape[0], dy.shape[1], x.shape[1]))


def _setup_context(ctx, inputs, output):
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, grad):
    x, w, offs = ctx.saved_tensors
    grad = grad.contiguous()
    dx = grouped_gemm_dgrad(grad, w, offs) if ctx.needs_input_grad[0] else None
    dw = grouped_gemm_wgrad(grad, x, offs) if ctx.needs_input_grad[1] else None
    return dx, dw, None


grouped_gemm_fwd.register_autograd(_backward, setup_context=_setup_context)


def grouped_linear(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor) -> torch.Tensor:
    """y (M, N) with y_g = x_g @ W_g^T over the groups of ``group_offsets`` (int32 (G,) cumulative
    row ends, the last = M); differentiable in x and w (module doc)."""
    return grouped_gemm_fwd(x, w, group_offsets)
