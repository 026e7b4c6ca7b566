"""Shape suites of the grouped-GEMM op ``grouped_gemm`` (torch-free).

A shape is one pass (fwd, dgrad, wgrad) of one expert GEMM of an MoE layer as one rank trains it
with expert parallelism: the rank holds E_local = experts / EP whole experts and receives M routed
tokens (the token-expert pairs after the all-to-all, already expert-contiguous). The two GEMMs of
an expert MLP:

- ``gate_up``: W (E_local, 2I, hidden): N = 2I, K = hidden;
- ``down``:    W (E_local, hidden, I):  N = hidden, K = I.

Every (layer, E_local, M, routing) gives both GEMMs in all three passes (6 problems), so the
evaluation can add them up to a training step of the layer.

Families: the MoE op's (``kernels/moe/suites.py``): ``TRAINING_MODELS`` give the training
suite, ``HELDOUT_MODELS`` (never trained on) the evaluation suite.

Suites (``suite(dtype) -> [ProblemShape]``):
- ``train`` (``training_suite``): every training family at two (E_local, M) points of its
  TRAIN_POINTS (E_local 4-64, M 4k-64k tokens per rank), routing ``balanced`` and one skewed
  routing (cycling through routing.SKEWED per point), 6 problems each;
- ``eval`` (``eval_suite``): every held-out family at its EVAL_POINT, ``balanced`` and ``zipf``;
- ``gate`` (``gate_suite``): the GPU correctness gate's odd shapes (M = 7, 33, 1000; N and K
  off the tiles, some off every multiple of 8 too; E = 1, 3, 8 with empty groups); never in the
  dataset.

``sweep_estimate`` says how long measuring every candidate of a suite takes on an H200 (a
roofline guess per launch plus a fixed cost per measurement); the counts are in
docs/ops/grouped_gemm.md.
"""
from __future__ import annotations

import math
from typing import Iterable

from ..moe import routing as R
from ..moe.suites import HELDOUT_MODELS, TRAINING_MODELS, MoeModel
from ..shapes import ProblemShape
from . import space

GEMMS = ("gate_up", "down")
# Weight bytes (bf16) of one GEMM's E_local experts above this: the point is skipped (the wgrad
# gate keeps an fp32 reference of the same size beside it).
WEIGHT_LIMIT_BYTES = 4 * 10**9

# (E_local, M) per training model: E_local = experts / EP for an EP degree the model would train
# with, M = tokens per rank after dispatch (top_k x the micro-batch's tokens). Two points per
# model, spread so that the suite covers 4-64 local experts and 4k-64k tokens, and few and many
# tokens per expert.
TRAIN_POINTS = {
    "mixtral-8x7b": ((4, 8192), (8, 16384)),
    "deepseek-v2-lite": ((16, 16384), (64, 65536)),
    "deepseek-v3": ((16, 32768), (32, 8192)),
    "qwen1.5-moe-a2.7b": ((15, 4096), (60, 32768)),
    "qwen2-57b-a14b": ((8, 16384), (32, 65536)),
    "qwen3-235b-a22b": ((16, 8192), (64, 32768)),
    "olmoe-1b-7b": ((8, 4096), (32, 16384)),
    "dbrx": ((4, 8192), (8, 4096)),
    "llama-4-scout": ((4, 4096), (16, 8192)),
}
# One point per held-out model (E_local, M).
EVAL_POINTS = {
    "mixtral-8x22b": (4, 8192),
    "phi-3.5-moe": (8, 8192),
    "gpt-oss-20b": (16, 32768),
    "granite-3.0-3b-a800m": (40, 16384),
    "qwen3-30b-a3b": (32, 65536),
    "deepseek-v2": (40, 8192),
    "kimi-k2": (48, 32768),
    "qwen3-next-80b-a3b": (64, 16384),
}
EVAL_ROUTINGS = ("balanced", "zipf")

GATE_ORIGIN = "gate/odd-shapes"


def _weight_bytes(e: int, n: int, k: int) -> int:
    return e * n * k * 2


def layer_shapes(model: MoeModel, e: int, m: int, dtype: str, routing: str) -> list[ProblemShape]:
    """The 6 problems of one (model, E_local, M, routing): gate_up and down, every pass."""
    i, h = model.intermediate, model.hidden
    origin = (f"{model.family}/{model.name}/ep{model.experts // e}",)
    out = []
    for gemm, (n, k) in zip(GEMMS, ((2 * i, h), (h, i))):
        if _weight_bytes(e, n, k) > WEIGHT_LIMIT_BYTES:
            continue
        for stage in space.STAGES:
            out.append(ProblemShape(space.Problem(m, n, k, dtype, e, stage, routing), origin))
    return out


def _model(models, family: str) -> MoeModel:
    return next(mo for mo in models if mo.family == family)


def _merge(shapes: Iterable[ProblemShape]) -> list[ProblemShape]:
    """One shape per key (first seen order), the origins of duplicates joined."""
    out: dict[str, ProblemShape] = {}
    for s in shapes:
        old = out.get(s.key)
        out[s.key] = s if old is None else ProblemShape(s.problem, tuple(dict.fromkeys(old.origins + s.origins)))
    return list(out.values())


def training_suite(dtype: str = "bf16") -> list[ProblemShape]:
    """The training families at TRAIN_POINTS, balanced and one skewed routing each."""
    out, j = [], 0
    for family, points in TRAIN_POINTS.items():
        model = _model(TRAINING_MODELS, family)
        for e, m in points:
            out += layer_shapes(model, e, m, dtype, "balanced")
            out += layer_shapes(model, e, m, dtype, R.SKEWED[j % len(R.SKEWED)])
            j += 1
    return _merge(out)


def eval_suite(dtype: str = "bf16") -> list[ProblemShape]:
    """The held-out families at EVAL_POINTS, balanced and zipf; every candidate measured."""
    out = []
    for family, (e, m) in EVAL_POINTS.items():
        model = _model(HELDOUT_MODELS, family)
        for routing in EVAL_ROUTINGS:
            out += layer_shapes(model, e, m, dtype, routing)
    return _merge(out)


# (E, N, K): off the tiles; (3, 333, 517) and (8, 1000, 260) off every multiple of 8 too (no
# vendor), (1, 200, 136) and (8, 512, 256) the vendor's, so it is gated on a dense GEMM and on
# empty groups; E = 1 (a dense GEMM), E = 3 and 8 with real2, whose Dirichlet draw leaves groups
# without tokens at these M.
GATE_LAYERS = ((1, 200, 136), (3, 333, 517), (8, 1000, 260), (8, 512, 256))
GATE_M = (7, 33, 1000)
GATE_ROUTINGS = ("balanced", "real2")


def gate_suite(dtype: str = "bf16") -> list[ProblemShape]:
    """The correctness gate's odd shapes (not model layers: never in the dataset)."""
    out = []
    for e, n, k in GATE_LAYERS:
        for m in GATE_M:
            for r in GATE_ROUTINGS if e > 1 else ("balanced",):
                out += [ProblemShape(space.Problem(m, n, k, dtype, e, st, r), (GATE_ORIGIN,)) for st in space.STAGES]
    return _merge(out)


SUITES = {"train": training_suite, "eval": eval_suite, "gate": gate_suite}


# -- how long a full sweep takes ---------------------------------------------------------------
# H200 bf16: ~990 TFLOP/s dense peak, 4.8 TB/s; a grouped kernel reaches ~60% / ~75% of them.
_EFF_FLOPS = 0.6 * 990e12
_EFF_BYTES = 0.75 * 4.8e12
# Per measurement: the gate's launch and norm, ~2 warm-up launches, 15 graph replays (the
# harness's GraphTimer; one launch per replay above its 250 us target), plus fixed host time.
_LAUNCHES_PER_MEASUREMENT = 18
_FIXED_S = 0.03


def launch_seconds(p: space.Problem) -> float:
    """A roofline guess of one launch: 2 M N K flops, operands and output read or written once."""
    b = space.DTYPE_BYTES[p.dtype]
    traffic = (p.m * p.k + p.m * p.n + p.e * p.n * p.k) * b
    return max(2.0 * p.m * p.n * p.k / _EFF_FLOPS, traffic / _EFF_BYTES) + 5e-6


def sweep_estimate(shapes, arch: str = "sm90") -> dict:
    """{'problems', 'measurements', 'seconds'} of measuring every feasible candidate of ``shapes``."""
    n_meas, secs = 0, 0.0
    for s in shapes:
        p = s.problem
        c = len(space.feasible_configs(p, arch))
        n_meas += c
        t = launch_seconds(p)
        # A short launch is replayed n_inner times per graph replay: ~250 us per replay.
        per = max(t, 250e-6) * _LAUNCHES_PER_MEASUREMENT + _FIXED_S
        secs += c * per
    return {"problems": len(shapes), "measurements": n_meas, "seconds": math.ceil(secs)}
