"""vLLM's Triton kernels as kernel families: ``fused_moe_kernel`` (fused MoE) and
``_w8a8_triton_block_scaled_mm`` (w8a8 block-fp8 linear), compiled from a vLLM source the user
supplies (``source.find_source``: COSTMODEL_VLLM_SRC, or an installed vllm; nothing of vLLM is in
this repository), launched by our own functions that mirror vLLM 0.33.0's host code:

- ``invoke_fused_moe`` mirrors ``invoke_fused_moe_triton_kernel`` (the pointer path: vLLM takes the
  tensor-descriptor path only on XPU or when VLLM_TRITON_USE_TD is set, and never for quantised
  weights): the grid ``cdiv(EM, BLOCK_SIZE_M) * cdiv(N, BLOCK_SIZE_N)`` with EM cut to
  ``M * top_k * BLOCK_SIZE_M`` when M < BLOCK_SIZE_M, BLOCK_SIZE_K capped by the block shape,
  SPLIT_K 1, and SWAP_AB from ``enable_swap_ab`` for fp8 (on compute capability 9.0,
  BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64);
- ``expert_assignment`` mirrors ``_prepare_expert_assignment``: the per-pair path (no sorting: one
  program row per token-expert pair) when ``M * top_k * 4 <= E``, else vLLM's
  ``moe_align_block_size``, here the project's own ``kernels/moe/impl.align`` (same layout and
  sentinel; its buffer length equals vLLM's ``max_num_tokens_padded``, so the grids are the same);
- ``fused_experts`` mirrors ``fused_experts_impl`` for bf16/fp16/fp32, fp8 w8a8 with per-tensor
  static scales, and fp8 w8a8 with 128x128 block weight scales (``block_shape`` [128, 128]: both
  GEMMs' inputs quantised per token and 128-column group with dynamic scales, vLLM's
  ``per_token_group_quant_fp8``) (one config for both GEMMs; silu-and-mul and the fp8
  quantisation of the inputs by the project's kernels; vLLM's ``ops.moe_sum`` as ``torch.sum``);
- ``w8a8_block_fp8_matmul`` mirrors ``w8a8_triton_block_scaled_mm`` (grid, strides, config).

Both take an ``out`` tensor to write the result into (the harness times them into a preallocated
output, as it does the project's kernels).

It lives with the MoE op (it uses the op's align, silu-and-mul and fp8 quantisation; the
kernels/vllm/ package below it holds only vLLM's names, folders, tables and source access). The
kernels' source is written to a module file (Triton reads a kernel's source from its file) in
a private temp folder and imported from there; ``compile_kernels`` caches one module per source.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import tempfile

from ..vllm import source as S

MOE_KERNEL = "fused_moe_kernel"
BLOCK_FP8_KERNEL = "_w8a8_triton_block_scaled_mm"
# Launch options of a config (the rest are the kernel's constexpr parameters).
LAUNCH_OPTIONS = ("num_warps", "num_stages")

_MODULES: dict = {}


def _is_triton_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and node.attr == "jit":
            return True
    return False


def extract_jit(text: str, roots, path: str = "") -> list[str]:
    """Source segments of the @triton.jit functions ``roots`` of a file and of every @triton.jit
    function of that file they call (helpers first), decorators included."""
    tree = ast.parse(text, filename=path)
    jit = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_triton_jit(n)}
    missing = [r for r in roots if r not in jit]
    if missing:
        raise RuntimeError(f"{path}: no @triton.jit function {', '.join(missing)} (another vLLM version?)")
    order, seen = [], set()

    def visit(name):
        if name in seen:
            return
        seen.add(name)
        for node in ast.walk(jit[name]):
            if isinstance(node, ast.Name) and node.id in jit and node.id != name:
                visit(node.id)
        order.append(name)

    for r in roots:
        visit(r)
    lines = text.splitlines(keepends=True)
    out = []
    for name in order:
        fn = jit[name]
        start = min([d.lineno for d in fn.decorator_list] + [fn.lineno]) - 1
        out.append("".join(lines[start:fn.end_lineno]))
    return out


def compile_kernels(src: "S.Source | None" = None):
    """The module holding vLLM's two kernels (and their helpers), from ``src`` (default:
    ``source.find_source()``); RuntimeError naming how to supply a source when there is none."""
    if src is None:
        src, why = S.find_source()
        if src is None:
            raise RuntimeError(why)
    moe = extract_jit(src.read(S.FUSED_MOE_PY), (MOE_KERNEL,), S.FUSED_MOE_PY)
    bs = extract_jit(src.read(S.FP8_UTILS_PY), (BLOCK_FP8_KERNEL,), S.FP8_UTILS_PY)
    text = ("# Generated at run time from vLLM's source (Apache-2.0): "
            f"{S.FUSED_MOE_PY}, {S.FP8_UTILS_PY}; vLLM {src.version()}.\n"
            "import triton\nimport triton.language as tl\n\n\n" + "\n\n".join(moe + bs))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    if key in _MODULES:
        return _MODULES[key]
    folder = tempfile.mkdtemp(prefix="costmodel-vllm-kernels-")
    path = os.path.join(folder, f"vllm_kernels_{key}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    name = f"_costmodel_vllm_kernels_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Triton resolves a kernel's globals through its module
    spec.loader.exec_module(mod)
    mod.VLLM_VERSION = src.version()
    _MODULES[key] = mod
    return mod


# -- host side, mirroring vLLM 0.33.0 ----------------------------------------------------------

def enable_swap_ab(block_m: int, block_n: int, capability) -> bool:
    """vLLM's ``enable_swap_ab`` (fused_moe/utils.py) for a device of compute capability
    ``capability`` ((major, minor) or None for no GPU)."""
    return tuple(capability or ()) == (9, 0) and block_m < 64 and block_n >= 64


def _capability(device):
    import torch

    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def naive_assignment(m: int, top_k: int, num_experts: int) -> bool:
    """vLLM's per-pair path (no expert map, weights on the device, not wNa16): M * top_k * 4 <= E."""
    return m * top_k * 4 <= num_experts


def expert_assignment(topk_ids, block_m: int, num_experts: int):
    """(sorted_token_ids or None, expert_ids, num_tokens_post_padded) as vLLM's
    ``_prepare_expert_assignment`` returns them."""
    import torch

    from . import impl

    m, top_k = topk_ids.shape
    if naive_assignment(m, top_k, num_experts):
        return (None, topk_ids.reshape(-1),
                torch.full((1,), topk_ids.numel() * block_m, dtype=torch.int32, device=topk_ids.device))
    return impl.align(topk_ids, num_experts, block_m)


def _tl_dtype(t):
    import torch
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[t]


def invoke_fused_moe(mod, A, B, C, A_scale, B_scale, topk_weights, sorted_token_ids, expert_ids,
                     num_tokens_post_padded, mul_routed_weight: bool, top_k: int, config: dict,
                     compute_type, use_fp8_w8a8: bool, block_shape=None, swap_ab: bool | None = None):
    """One launch of vLLM's ``fused_moe_kernel`` as ``invoke_fused_moe_triton_kernel`` makes it.
    ``config``: vLLM's entry (the six keys; SPLIT_K is set here). ``swap_ab`` None: vLLM's rule on
    A's device (an explicit bool forces it, for the CPU interpreter's tests of that path)."""
    import triton

    if swap_ab is None:
        swap_ab = use_fp8_w8a8 and enable_swap_ab(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"],
                                                   _capability(A.device))
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_token_ids is not None:
        EM = sorted_token_ids.size(0)
        if M < config["BLOCK_SIZE_M"]:
            # vLLM: at most M * top_k blocks hold pairs when M < BLOCK_SIZE_M.
            EM = min(EM, M * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    cfg = dict(config)
    cfg["SPLIT_K"] = 1
    block_k = cfg.pop("BLOCK_SIZE_K")
    if block_shape is not None:
        block_k = min(block_k, min(block_shape[0], block_shape[1]))
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)
    grid = (triton.cdiv(EM, cfg["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), cfg["BLOCK_SIZE_N"]),)
    a2 = A_scale is not None and A_scale.ndim == 2
    mod.fused_moe_kernel[grid](
        A, B, C, None, A_scale, B_scale, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        A_scale.stride(0) if a2 else 0, A_scale.stride(1) if a2 else 0,
        B_scale.stride(0) if B_scale is not None else 0,
        B_scale.stride(2) if B_scale is not None and B_scale.ndim == 3 else 0,
        B_scale.stride(1) if B_scale is not None and B_scale.ndim >= 2 and B_scale.size(1) > 1 else 0,
        0, 0,
        0 if block_shape is None else block_shape[0], 0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=compute_type,
        use_fp8_w8a8=use_fp8_w8a8, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=sorted_token_ids is None, HAS_BIAS=False, BLOCK_SIZE_K=block_k,
        SWAP_AB=bool(swap_ab), USE_TD=False, **cfg)


def fused_experts(mod, x, w1, w2, topk_weights, topk_ids, config: dict, *, w1_scale=None, w2_scale=None,
                  a1_scale=None, a2_scale=None, swap_ab: bool | None = None, out=None):
    """The MoE layer as vLLM's ``fused_experts_impl`` runs it with one ``config`` for both GEMMs:
    y (M, hidden). bf16/fp16/fp32 weights; fp8 e4m3 weights with per-expert scales (E,) and
    per-tensor static activation scales a1_scale, a2_scale (1,) (x in bf16, quantised here); or
    block-scaled weights (3-D scales (E, ceil(N/128), ceil(K/128)), fp8 e4m3, or fp16/fp32 stand-ins
    for the CPU interpreter) whose inputs are quantised per token group here (a1_scale and
    a2_scale None), vLLM's block_shape [128, 128]. ``out``: an (M, hidden) tensor of x's dtype to
    write y into (default: a new one)."""
    import torch

    from . import impl

    block = impl.is_block_scaled(w1_scale)
    fp8 = w1.dtype == torch.float8_e4m3fn or block
    block_shape = [impl.GROUP_N, impl.GROUP_K] if block else None
    M, hidden = x.shape
    E, two_n, _ = w1.shape
    top_k = topk_ids.size(1)
    out_dtype = x.dtype
    compute_type = _tl_dtype(out_dtype)
    sorted_ids, expert_ids, ntpp = expert_assignment(topk_ids, config["BLOCK_SIZE_M"], E)
    cache1 = torch.empty((M, top_k, two_n), dtype=out_dtype, device=x.device)
    cache3 = torch.empty((M, top_k, hidden), dtype=out_dtype, device=x.device)
    if block:
        qx, a1q = impl.quantize_fp8_groups(x, w1.dtype)
    else:
        qx, a1q = (impl.quantize_fp8(x, a1_scale), a1_scale) if fp8 else (x, None)
    invoke_fused_moe(mod, qx, w1, cache1, a1q, w1_scale, topk_weights, sorted_ids, expert_ids, ntpp,
                     False, top_k, config, compute_type, fp8, block_shape=block_shape, swap_ab=swap_ab)
    cache2 = impl.silu_and_mul(cache1.view(-1, two_n))
    if block:
        q2, a2q = impl.quantize_fp8_groups(cache2, w2.dtype)
    else:
        q2, a2q = (impl.quantize_fp8(cache2, a2_scale), a2_scale) if fp8 else (cache2, None)
    invoke_fused_moe(mod, q2, w2, cache3, a2q, w2_scale, topk_weights, sorted_ids, expert_ids, ntpp,
                     True, 1, config, compute_type, fp8, block_shape=block_shape, swap_ab=swap_ab)
    return torch.sum(cache3, dim=1) if out is None else torch.sum(cache3, dim=1, out=out)


def w8a8_block_fp8_matmul(mod, A, B, As, Bs, block_size, config: dict, output_dtype=None, out=None):
    """vLLM's ``w8a8_triton_block_scaled_mm`` with a given config: C = (A * As) @ (B * Bs).T, into
    ``out`` (a contiguous tensor of A's leading shape by N) when given."""
    import torch
    import triton

    block_n, block_k = block_size
    M = A.numel() // A.shape[-1]
    N, K = B.shape
    C = out if out is not None else A.new_empty(A.shape[:-1] + (N,), dtype=output_dtype or torch.bfloat16)
    grid = (triton.cdiv(M, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    mod._w8a8_triton_block_scaled_mm[grid](
        A, B, C, As, Bs, M, N, K, block_n, block_k,
        A.stride(-2), A.stride(-1), B.stride(1), B.stride(0), C.stride(-2), C.stride(-1),
        As.stride(-2), As.stride(-1), Bs.stride(1), Bs.stride(0), **config)
    return C
