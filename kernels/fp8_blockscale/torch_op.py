"""The block-scaled fp8 op's torch custom ops (vLLM's w8a8 block-fp8 linear, op ``fp8_blockscale``):
``gemm_fp8_blockscale(x, w, x_scale, w_scale)`` computes y = (x * x_scale) @ (w * w_scale).T in
bf16, with per-token 128-wide K group scales x_scale (M, ceil(K/128)) and 128x128 block scales
w_scale (ceil(N/128), ceil(K/128)); ``quantize_fp8_per_token_group(x)`` makes (x, x_scale) from a
bf16/fp16/fp32 activation.

Registered as ``torch.ops.gemm_costmodel.gemm_fp8_blockscale`` / ``quantize_fp8_per_token_group``
with fake implementations (torch.compile, CUDA graphs: the decision reads shapes only). Serving
binds the decision (``bind``; the registry's ``torch_op`` field names this module), so this folder
imports nothing from serving; users call these through ``gemm_costmodel.serving.ops``.
"""
from __future__ import annotations

import torch

from ..common import rel_diff
from . import impl as BS
from .space import Problem

# The torch.ops.gemm_costmodel names this module registers (tests/test_registry.py checks them).
CUSTOM_OPS = ("gemm_fp8_blockscale", "quantize_fp8_per_token_group")
# The names gemm_costmodel.serving.ops re-exports (its public API).
EXPORTS = ("gemm_fp8_blockscale", "quantize_fp8_per_token_group", "choose_fp8_blockscale")
# serving.ops.enable_unsure_mode's keyword for a bench of this op's candidates only.
UNSURE_BENCH = "blockscale_bench"

_host = None


def bind(host) -> None:
    """Called by serving.ops with its host for this op (serving/ops.py ``_Host``)."""
    global _host
    _host = host


def _bound():
    if _host is None:
        raise RuntimeError("no dispatcher bound: import gemm_costmodel.serving.ops (it binds the dispatcher)")
    return _host


# The dtype the dispatcher decides for, by operand dtype. fp16/fp32 operands (same scale
# layout) exist for the Triton CPU interpreter, which computes garbage for fp8 dots; the
# dispatcher serves bf16/fp16/fp8, so fp32 is decided as fp16. The interpreter has no
# shared-memory limit, and nothing serves fp32 on a GPU.
_BS_DISPATCH_DTYPE = {"fp8": "fp8", "fp16": "fp16", "fp32": "fp16"}
# The op's argument names, in impl.check_operands' order (a, b, as_, bs).
_BS_ARGS = ("x", "w", "x_scale", "w_scale")


def _check_blockscale(x, w, x_scale, w_scale) -> str:
    """ValueError naming the bad argument (x, w, x_scale, w_scale); returns the dtype name.

    The same conditions as impl.check_operands (what the kernels accept), with messages in
    the op's argument names; run once per call (the eager path validates on every call)."""
    for label, t in zip(_BS_ARGS, (x, w, x_scale, w_scale)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{label} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{label} must be 2-D, got {t.dim()}-D (shape {tuple(t.shape)})")
        if not t.is_contiguous():
            raise ValueError(f"{label} must be contiguous (row-major)")
        if t.device != x.device:
            raise ValueError(f"{label} is on {t.device}, x on {x.device}: all operands must be on one device")
    if x.dtype not in BS.DTYPE_NAMES:
        raise ValueError(f"x must be float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {x.dtype}")
    if w.dtype != x.dtype:
        raise ValueError(f"w must have x's dtype {x.dtype}, got {w.dtype}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w must be (N, K) with x's K = {x.shape[1]}, got shape {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"M, N and K must be >= 1, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    want_x, want_w = BS.scale_shapes(m, n, k)
    for label, s, want, form in (("x_scale", x_scale, want_x, "(M, ceil(K/128))"),
                                 ("w_scale", w_scale, want_w, "(ceil(N/128), ceil(K/128))")):
        if s.dtype != torch.float32:
            raise ValueError(f"{label} must be float32, got {s.dtype}")
        if tuple(s.shape) != want:
            raise ValueError(f"{label} must have shape {form} = {want} (128-wide groups), got {tuple(s.shape)}")
    return BS.DTYPE_NAMES[x.dtype]


def choose_fp8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> str:
    """The config id ``gemm_fp8_blockscale`` would launch for these operands (validates them)."""
    host = _bound()
    name = _check_blockscale(x, w, x_scale, w_scale)
    m, k = x.shape
    n = w.shape[0]
    ddt = _BS_DISPATCH_DTYPE[name]
    if not host.tuning():
        return host.select(m, n, k, ddt)
    bound = 2 * BS.ERROR_BOUNDS.get(name, 1e-2)

    def run(cid):
        return BS.launch(host.config(cid), x, w, x_scale, w_scale)

    # Unsure mode keys a shape as <operand dtype>:<M>x<N>x<K>, the model deciding for ``ddt``.
    return host.decide(m, n, k, ddt, key=f"{name}:{m}x{n}x{k}", run=run, agree=lambda y, ref: rel_diff(y, ref) <= bound,
                       problem=lambda: Problem(m, n, k, name), operand=x)


def _run_blockscale(x, w, x_scale, w_scale) -> torch.Tensor:
    cfg = _bound().config(choose_fp8_blockscale(x, w, x_scale, w_scale))
    return BS.launch(cfg, x, w, x_scale, w_scale)


@torch.library.custom_op("gemm_costmodel::gemm_fp8_blockscale", mutates_args=())
def _gemm_fp8_blockscale_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                            w_scale: torch.Tensor) -> torch.Tensor:
    return _run_blockscale(x, w, x_scale, w_scale)


@_gemm_fp8_blockscale_op.register_fake
def _(x, w, x_scale, w_scale):
    # Shapes and dtypes only: comparing symbolic sizes here would add guards (or specialise
    # dynamic shapes); the real op validates everything on its first call.
    for label, t in zip(_BS_ARGS, (x, w, x_scale, w_scale)):
        if t.dim() != 2:
            raise ValueError(f"{label} must be 2-D, got {t.dim()}-D (shape {tuple(t.shape)})")
    if x.dtype not in BS.DTYPE_NAMES:
        raise ValueError(f"x must be float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {x.dtype}")
    return x.new_empty((x.shape[0], w.shape[0]), dtype=BS.OUT_TORCH_DTYPES[BS.DTYPE_NAMES[x.dtype]])


def _check_quantize(x, group) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got {x.dim()}-D (shape {tuple(x.shape)})")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if type(group) is not int or group < 1:
        raise ValueError(f"group must be an int >= 1, got {group!r}")


def _quantize(x, group):
    _check_quantize(x, group)
    if x.shape[0] == 0 or x.shape[1] == 0:  # impl's group reshape needs elements; no groups to scale
        return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
                x.new_zeros((x.shape[0], -(-x.shape[1] // group)), dtype=torch.float32))
    return BS.quantize_per_token_group(x, group, torch.float8_e4m3fn)


@torch.library.custom_op("gemm_costmodel::quantize_fp8_per_token_group", mutates_args=())
def _quantize_op(x: torch.Tensor, group: int = BS.GROUP_K) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, group)


@_quantize_op.register_fake
def _(x, group=BS.GROUP_K):
    _check_quantize(x, group)
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), x.new_empty((m, -(-k // group)), dtype=torch.float32)


# Eager calls skip the custom-op dispatcher (~20 us of host time per call); tracing needs it.

def gemm_fp8_blockscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """y (M, N) = (x * x_scale) @ (w * w_scale).T on the dispatched kernel (vLLM's w8a8 block-fp8 linear).

    x: float8_e4m3fn (M, K) activations; x_scale: float32 (M, ceil(K/128)), one scale per token
    per 128-wide K group (``quantize_fp8_per_token_group(x_bf16)`` makes both); w: float8_e4m3fn
    (N, K); w_scale: float32 (ceil(N/128), ceil(K/128)), one per 128x128 weight block. Returns
    bf16 (for fp16/fp32 operands, the CPU interpreter's stand-ins: the input dtype). Any M >= 1;
    N and K need not be multiples of 128. ValueError naming the bad argument."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm_fp8_blockscale(x, w, x_scale, w_scale)
    return _run_blockscale(x, w, x_scale, w_scale)


def quantize_fp8_per_token_group(x: torch.Tensor, group: int = BS.GROUP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q, x_scale): x (M, K) bf16/fp16/fp32 -> float8_e4m3fn (M, K) and float32 (M, ceil(K/group)),
    with x ~= x_q * x_scale repeated over each group of ``group`` columns; each group's largest |x|
    maps to 448 (an all-zero group gets a tiny positive scale and zeros, never NaN).
    ``gemm_fp8_blockscale`` needs group = 128 (its x_scale is per 128 columns); other groups are
    for other consumers."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.quantize_fp8_per_token_group(x, group)
    return _quantize(x, group)
