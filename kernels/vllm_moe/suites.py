"""Shape suites of the op ``vllm_moe`` (torch-free): the MoE op's layers, one problem per layer.

A problem is a whole MoE layer (``space.Problem``: M, vLLM's N = the per-shard intermediate size,
K = hidden, E, top_k, routing). The suites are the MoE op's (``kernels/moe/suites.py``) with each
layer's two stage shapes made one problem (its gate_up shape: N = 2 * intermediate, K = hidden),
so the families, the layer variants, the M grids, the routings and the held-out split are the MoE
op's own:

- ``train``: the training families (``moe.suites.TRAINING_MODELS``), every variant, M over
  TRAIN_M, balanced plus one skewed routing per (variant, M); without the ``vllm`` suite's layers;
- ``eval``: the held-out families' eval variants at EVAL_M (balanced) and EVAL_SKEWED_M (zipf);
- ``eval_core``: the evaluation problems a first campaign measures in full (``EVAL_CORE``, in
  priority order: a campaign takes the first few with ``--limit``; see below why these);
- ``vllm``: the training-family layers of vLLM's tuned files (the MoE op's ``vllm`` suite);
- ``gate``: the MoE op's odd layers (N and K off every multiple of 64, E = 3 to 512, M = 1, 7,
  4097, two routings); never in the dataset.
"""
from __future__ import annotations

from ..moe import suites as MS
from ..shapes import ProblemShape
from . import space

# The evaluation problems measured in full first, in priority order: (held-out family, M), balanced
# routing, the family's eval variant (``moe.suites.eval_variant``). Every candidate of vLLM's space on
# a problem is a few thousand runs, and vLLM's kernel compiles per config for each class of its int
# arguments (``space.specialisation``), so the first ones share compile keys: Qwen3-30B-A3B TP2 (E =
# 128, N = 384, vLLM has tuned it on the H200 for bf16 and block fp8) and Kimi-K2 TP8 (E = 384, N =
# 256, no tuned file) are both top-8 routings of sizes divisible by 16, so at M = 64 and 1024 they
# share one key and at M = 1 (vLLM's per-pair path) another; Mixtral-8x22B TP4 (E = 8, top-2, N =
# 4096, tuned) at M = 16 and 1024 a third. Decode (M = 1), the middle (64) and prefill (1024) of the
# range vLLM's files key on; other families and M follow.
EVAL_CORE = (
    ("qwen3-30b-a3b", 64), ("kimi-k2", 64), ("qwen3-30b-a3b", 1), ("kimi-k2", 1),
    ("qwen3-30b-a3b", 1024), ("kimi-k2", 1024), ("mixtral-8x22b", 16), ("mixtral-8x22b", 1024),
    ("granite-3.0-3b-a800m", 256), ("qwen3-next-80b-a3b", 256), ("phi-3.5-moe", 64), ("deepseek-v2", 16),
    ("gpt-oss-20b", 64),
)


def layer(shape) -> ProblemShape:
    """The layer problem of one of the MoE op's stage shapes (gate_up or down), with its origins."""
    return ProblemShape(space.Problem(shape.m, shape.intermediate, shape.hidden, shape.dtype, shape.e, shape.top_k,
                                      shape.routing), tuple(shape.origins))


def layers(shapes) -> list[ProblemShape]:
    """One problem per layer of the MoE op's stage shapes (first seen order, origins joined)."""
    out: dict[str, ProblemShape] = {}
    for s in shapes:
        p = layer(s)
        old = out.get(p.key)
        out[p.key] = p if old is None else ProblemShape(p.problem, tuple(dict.fromkeys(old.origins + p.origins)))
    return list(out.values())


def training_suite(dtype: str = "bf16") -> list[ProblemShape]:
    return layers(MS.training_suite(dtype))


def eval_suite(dtype: str = "bf16") -> list[ProblemShape]:
    return layers(MS.eval_suite(dtype))


def eval_core_suite(dtype: str = "bf16") -> list[ProblemShape]:
    """``EVAL_CORE``'s problems (those of a family with a variant for the dtype), in its order."""
    by_family = {m.family: m for m in MS.HELDOUT_MODELS}
    out = []
    for family, m in EVAL_CORE:
        v = MS.eval_variant(by_family[family], dtype)
        if v is not None:
            out.append(layer(v.shapes(m, dtype, "balanced")[0]))
    return out


def vllm_suite(dtype: str = "bf16") -> list[ProblemShape]:
    return layers(MS.vllm_suite(dtype))


def gate_suite(dtype: str = "bf16") -> list[ProblemShape]:
    return layers(MS.gate_suite(dtype))


SUITES = {"train": training_suite, "eval": eval_suite, "eval_core": eval_core_suite, "vllm": vllm_suite,
          "gate": gate_suite}
