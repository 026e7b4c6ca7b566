"""The fused MoE layer's torch custom op (op ``moe``, vLLM's ``fused_experts``): ``fused_moe`` runs
both stages (gate_up, down) on their dispatched configs; ``route`` makes the top-k routing from
router logits; ``load_vllm_moe_configs`` loads vLLM's tuned files as exact-hit tables.

Registered as ``torch.ops.gemm_costmodel.fused_moe`` with a fake implementation (torch.compile,
CUDA graphs: the decision reads host-side shapes only). Serving binds the decision (``bind``; the
registry's ``torch_op`` field names this module), so this folder imports nothing from serving;
users call these through ``gemm_costmodel.serving.ops``.
"""
from __future__ import annotations

import json
import os
import re

import torch

from ..common import rel_diff
from . import impl as MOE
from . import space as MS

# The torch.ops.gemm_costmodel names this module registers (tests/test_registry.py checks them).
CUSTOM_OPS = ("fused_moe",)
# The names gemm_costmodel.serving.ops re-exports: its public API, and the exact-hit tables
# (tests fill them directly).
EXPORTS = ("fused_moe", "choose_moe", "route", "load_vllm_moe_configs", "clear_vllm_moe_configs", "_moe_tables")
# serving.ops.enable_unsure_mode's keyword for a bench of this op's stages only.
UNSURE_BENCH = "moe_bench"

_host = None


def bind(host) -> None:
    """Called by serving.ops with its host for this op (serving/ops.py ``_Host``)."""
    global _host
    _host = host


def _bound():
    if _host is None:
        raise RuntimeError("no dispatcher bound: import gemm_costmodel.serving.ops (it binds the dispatcher)")
    return _host


# The MoE dispatcher serves bf16, fp8 and fp8bs (block-scaled fp8: until a model serves it, the
# fallback rule, vLLM's block-fp8 default); fp16/fp32 (the CPU interpreter's stand-ins, with or
# without block scales) are decided as fp16, which has no model: the fallback rule decides.
_MOE_DISPATCH_DTYPE = {"bf16": "bf16", "fp8": "fp8", MS.BLOCK_DTYPE: MS.BLOCK_DTYPE, "fp16": "fp16", "fp32": "fp16"}
# Exact-hit tables in vLLM's fused-MoE format: {(E, N = intermediate, dtype): {M: config id}}.
_moe_tables: dict[tuple[int, int, str], dict[int, str]] = {}
_VLLM_MOE_DTYPES = {None: "bf16", "fp8_w8a8": "fp8", "float8": "fp8"}


def load_vllm_moe_configs(folder: str, gpu_name: str | None = None) -> int:
    """Load vLLM-format fused-MoE tuned files (``E=..,N=..,device_name=..[,dtype=..].json``) for
    this GPU (default: the current CUDA device) as exact-hit tables: an M that is a key of the file
    of (E, N, dtype) launches that entry's config for both stages, before any model decision
    (vLLM's precedence; other M go to the model, not to vLLM's nearest key). Files of other GPUs,
    block-scaled or int8 dtypes are skipped (vLLM's own block-fp8 files hold BLOCK_SIZE_M 8 entries,
    which only its Hopper swap-AB path runs: no config of this op's fp8bs space). Returns the number of tables loaded; ValueError naming
    the file for an entry that is not a vLLM config or not in this op's space."""
    gpu = gpu_name
    if gpu is None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    if gpu is None:
        raise ValueError("no CUDA device: name the GPU (gpu_name=) whose files to load")
    want = gpu.replace(" ", "_")
    loaded = 0
    space_of: dict[str, set] = {}  # the space per dtype, built once per call
    for name in sorted(os.listdir(folder)):
        mt = re.match(MS.VLLM_FILE_NAME_RE, name)
        if not mt or mt.group("device") != want or mt.group("block") or mt.group("dtype") not in _VLLM_MOE_DTYPES:
            continue
        dt = _VLLM_MOE_DTYPES[mt.group("dtype")]
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            body = json.load(fh)
        table = {}
        for m, entry in body.items():
            if not str(m).isdigit():
                continue  # vLLM files may carry metadata keys (triton_version)
            try:
                cfg = MS.from_vllm(entry)
            except ValueError as exc:
                raise ValueError(f"{name}: M={m}: {exc}") from None
            if cfg not in space_of.setdefault(dt, set(MS.generate_configs("sm90", dt))):
                raise ValueError(f"{name}: M={m}: {cfg.id} is not in the moe space for {dt}")
            table[int(m)] = cfg.id
        _moe_tables[(int(mt.group("e")), int(mt.group("n")), dt)] = table
        loaded += 1
    return loaded


def clear_vllm_moe_configs() -> None:
    _moe_tables.clear()


def _moe_dims(x, w1, w2, topk_ids, w1_scale=None) -> tuple[int, int, int, int, int, str]:
    """(M, hidden, intermediate, E, top_k, problem dtype) of checked operands (fp8 weights with block
    scales: fp8bs)."""
    m, hidden = x.shape
    e, n1, _ = w1.shape
    return m, hidden, n1 // 2, e, topk_ids.shape[1], MOE.problem_dtype(w1, w1_scale)


def _check_block_shape(w1_scale, block_shape) -> str:
    """'' when block_shape is None or vLLM's [128, 128] with block scales (a 3-D w1_scale)."""
    if block_shape is None:
        return ""
    if list(block_shape) != list(MS.BLOCK_SHAPE):
        return f"block_shape must be {list(MS.BLOCK_SHAPE)} (the op's scale block), got {list(block_shape)}"
    if not MOE.is_block_scaled(w1_scale):
        return "block_shape needs block scales: w1_scale of shape (E, ceil(2I/128), ceil(hidden/128))"
    return ""


def choose_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
               topk_ids: torch.Tensor, routing: str = "balanced", *, w1_scale: torch.Tensor | None = None,
               w2_scale: torch.Tensor | None = None, a1_scale: torch.Tensor | None = None,
               a2_scale: torch.Tensor | None = None) -> tuple[str, str]:
    """(gate_up config id, down config id) ``fused_moe`` would launch (validates the operands).

    The decision reads host-side shapes only (M, hidden, intermediate, E, top_k, dtype): an exact
    M hit in a loaded vLLM table wins (one config for both stages, as vLLM runs it); else the
    model ranks each stage's candidates for the routing named here (default 'balanced': during
    CUDA-graph capture the expert histogram exists only on the GPU, so it is never read)."""
    msg = MOE.check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale)
    if msg:
        raise ValueError(msg)
    return _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)


def _tune_moe(host, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing, keys):
    """Unsure mode's (gate_up, down) for a validated layer: each stage's persisted winner, else its
    top k checked on these operands (gate_up first, then down on the winner's output) and timed
    (``moe_bench``, or CUDA graphs over synthetic copies of the stage for ``routing``)."""
    m, hidden, inter, e, top_k, dt = _moe_dims(x, w1, w2, topk_ids, w1_scale)
    ddt = _MOE_DISPATCH_DTYPE[dt]
    bound = 2 * MOE.ERROR_BOUNDS.get(dt, 1e-2)

    def agree(y, ref):
        return rel_diff(y, ref) <= bound

    fp8 = dt == "fp8"
    a1 = a1_scale if a1_scale is not None or not fp8 else MOE.dynamic_scale(x)
    picks = {}
    h = None
    for stage, (n, kk, inp, w, a_s, w_s) in (("gate_up", (2 * inter, hidden, x, w1, a1, w1_scale)),
                                             ("down", (hidden, inter, None, w2, a2_scale, w2_scale))):
        if stage == "down":
            inp = h
            if fp8 and a_s is None:
                a_s = MOE.dynamic_scale(h)

        def run(cid, stage=stage, inp=inp, w=w, a_s=a_s, w_s=w_s):
            return MOE.launch(host.config(cid), stage, inp, w, topk_weights, topk_ids, None, a_s, w_s)

        picks[stage] = host.decide(m, n, kk, ddt, key=keys[stage], run=run, agree=agree,
                                   problem=lambda n=n, kk=kk, stage=stage: MS.Problem(m, n, kk, dt, e, top_k, stage,
                                                                                       routing),
                                   note={"routing": routing}, e=e, top_k=top_k, stage=stage, routing=routing)
        if stage == "gate_up":
            h = MOE.launch(host.config(picks[stage]), "gate_up", x, w1, topk_weights, topk_ids, None, a1, w1_scale)
    return picks["gate_up"], picks["down"]


def _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale,
                routing) -> tuple[str, str]:
    host = _bound()
    m, hidden, inter, e, top_k, dt = _moe_dims(x, w1, w2, topk_ids, w1_scale)
    hit = _moe_tables.get((e, inter, dt), {}).get(m)
    if hit is not None:
        return hit, hit
    if host.tuning():
        # Unsure mode keys each stage as <dtype>:<stage>:<M>x<N>x<K>:e<E>k<top_k>.
        keys = {"gate_up": f"{dt}:gate_up:{m}x{2 * inter}x{hidden}:e{e}k{top_k}",
                "down": f"{dt}:down:{m}x{hidden}x{inter}:e{e}k{top_k}"}
        tuned = [host.tuned(keys[s]) for s in MS.STAGES]
        if all(tuned):
            return tuned[0], tuned[1]
        # During CUDA-graph capture of a layer not tuned yet, the model decides both stages.
        if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return _tune_moe(host, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale,
                             routing, keys)
    if not x.is_cuda and host.dispatcher().space_arch is None:
        if MOE.is_block_scaled(w1_scale):
            # torch's grouped GEMM has no block-scaled form: vLLM's block-fp8 default runs them.
            cid = MS.vllm_default(m, e, MS.BLOCK_DTYPE).id
            return cid, cid
        # CPU tensors and no GPU to rank for: torch's own grouped GEMM runs them on the CPU.
        vendor = host.spec.vendor_ids[0]
        return vendor, vendor
    ddt = _MOE_DISPATCH_DTYPE[dt]
    up = host.select(m, 2 * inter, hidden, ddt, e=e, top_k=top_k, stage="gate_up", routing=routing)
    down = host.select(m, hidden, inter, ddt, e=e, top_k=top_k, stage="down", routing=routing)
    return up, down


def _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing,
               block_shape=None):
    # Validated once per call (here), not again by impl.fused_moe.
    msg = MOE.check_layer(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale) or \
        _check_block_shape(w1_scale, block_shape)
    if msg:
        raise ValueError(msg)
    up, down = _choose_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing)
    host = _bound()
    return MOE.fused_moe(x, w1, w2, topk_weights, topk_ids, host.config(up), host.config(down),
                         w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale, check=False)


@torch.library.custom_op("gemm_costmodel::fused_moe", mutates_args=())
def _fused_moe_op(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
                  routing: str = "balanced", block_shape: list[int] | None = None) -> torch.Tensor:
    return _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing,
                      block_shape)


@_fused_moe_op.register_fake
def _(x, w1, w2, topk_weights, topk_ids, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None,
      routing="balanced", block_shape=None):
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError("x must be 2-D (M, hidden), w1 and w2 3-D (E, 2I, hidden), (E, hidden, I)")
    if w1.dtype not in MOE.DTYPE_NAMES:
        raise ValueError(f"w1 must be bfloat16 or float8_e4m3fn (fp16/fp32 for the CPU interpreter), got {w1.dtype}")
    return x.new_empty((x.shape[0], w1.shape[2]), dtype=MOE.OUT_TORCH_DTYPES[MOE.DTYPE_NAMES[w1.dtype]])


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
              a1_scale: torch.Tensor | None = None, a2_scale: torch.Tensor | None = None,
              routing: str = "balanced", block_shape: list[int] | None = None) -> torch.Tensor:
    """The MoE layer on the dispatched kernels (vLLM's ``fused_experts``):
    y (M, hidden) = sum_j topk_weights[t, j] * (silu(x w1_e[:I].T) * (x w1_e[I:].T)) w2_e.T, e = topk_ids[t, j].

    x (M, hidden) bf16 (or fp8 with a1_scale); w1 (E, 2I, hidden), w2 (E, hidden, I) bf16, or fp8
    with per-expert fp32 scales w1_scale, w2_scale (E,) and optional static activation scales
    a1_scale, a2_scale (1,) (dynamic per-tensor when None); topk_ids int32 (M, top_k),
    topk_weights fp32 (M, top_k) (``route(router_logits, top_k)`` makes both). Each stage runs
    its own dispatched config (``choose_moe``). ValueError naming the bad argument.

    Block-scaled fp8 (dtype fp8bs; DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8 in vLLM): w1, w2 fp8 with
    fp32 128x128 block scales w1_scale (E, ceil(2I/128), ceil(hidden/128)) and w2_scale
    (E, ceil(hidden/128), ceil(I/128)), ``block_shape`` [128, 128] (optional: the scales' shape says
    it); x bf16 (quantised per token group here) or fp8 with a1_scale (M, ceil(hidden/128)); the
    intermediate is always quantised per token group with dynamic scales (a2_scale None), as vLLM's
    fused_experts does with a block_shape."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale,
                                                  a1_scale, a2_scale, routing, block_shape)
    return _fused_moe(x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, routing,
                      block_shape)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32 (M, top_k), topk_ids int32 (M, top_k)) from router logits (M, E): softmax
    over experts, the top_k largest, renormalised to sum 1 per token with ``renormalize``."""
    return MOE.route(router_logits, top_k, renormalize)
