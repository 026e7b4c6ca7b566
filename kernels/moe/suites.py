"""Shape suites of the fused-MoE op ``moe`` (torch-free).

A shape is one *stage* of an MoE layer (``space.Problem``): M tokens, top_k of E experts, the
stage's grouped GEMM (gate_up: n = 2 * I, k = hidden; down: n = hidden, k = I; I = the
per-shard intermediate size, which is what vLLM's file names call N), and a routing
(``routing.py``). Every layer variant gives both stages at the same M and routing, so that the
evaluation can add them up to the layer's time.

Models: routed-expert dims from each model's published config.json (num_local_experts /
n_routed_experts / num_experts, num_experts_per_tok, moe_intermediate_size or intermediate_size,
hidden_size); shared experts are dense MLPs, not part of the fused-MoE op. Only
``TRAINING_MODELS`` may contribute training data; every other family is held out
(``HELDOUT_MODELS`` are the evaluation's families, ``OTHER_MODELS`` only name vLLM's files).

Layer variants, as vLLM shards the experts:
- ``tp{t}`` (t in TP_DEGREES): every rank holds all E experts, each split along the
  intermediate size: N = I / t (skipped when t does not divide I or N < MIN_N);
- ``ep{p}`` (p in EP_DEGREES): each rank holds E / p whole experts (skipped when p does not
  divide E, or when E / p < top_k: top_k distinct experts must exist locally). M counts the
  tokens as the rank's kernel sees them (after the dispatch), top_k stays the model's.
Variants whose w1 + w2 bf16 weights exceed WEIGHT_LIMIT_BYTES are skipped (the GPU must also
hold the activations and the harness's rotating copies).

fp8bs (block-scaled fp8) takes only the variants vLLM can load with 128x128 block scales: the
per-shard intermediate size a multiple of 128 (``block_ok``; vLLM's Fp8MoEMethod refuses others),
from the same training and held-out families; a held-out family whose eval variant is not such
takes its first variant that is (``eval_variant``), and one without any (gpt-oss-20b, I = 2880) has
no fp8bs eval shapes. vLLM's block-fp8 MoE files for the H100 serve no training variant; its H200
ones serve two (``VLLM_BLOCK_SUITE_FILES``), which make the fp8bs ``vllm`` suite.

Suites (``suite(dtype) -> [MoeShape]``):
- ``train`` (``training_suite``): the training families, every variant, M over TRAIN_M (vLLM's
  MoE M grid plus 8192); routing ``balanced`` plus one skewed routing per (variant, M), cycling
  through routing.SKEWED (``skewed=5`` takes all five: 12,790 bf16 shapes instead of 4,294; at
  M = 1 every routing is the same histogram up to a permutation of the experts: balanced only);
  both stages. Sampled candidates per shape. The ``vllm`` suite's shapes are left out (held out
  for the vLLM comparison).
- ``train_skewed`` (``skewed_suite``): a second skewed routing per (variant, M >= 256) of the
  training families, the next one in routing.SKEWED's cycle (944 shapes per dtype); sampled
  candidates, like ``train``.
- ``eval`` (``eval_suite``): the held-out families, one variant each (``MoeModel.eval_variant``),
  M in EVAL_M with ``balanced``, and ``zipf`` at EVAL_SKEWED_M; both stages; every candidate
  measured (128 shapes).
- ``vllm`` (``vllm_suite``): vLLM's tuned H100 files of the dtype whose (E, N) is a training
  family's layer variant (VLLM_SUITE_FILES, chosen from ``vllm_file_shapes``), at EVAL_M,
  balanced, both stages (72 bf16 shapes).
- ``gate`` (``gate_suite``): the GPU correctness gate's odd shapes (M = 1, 7, 4097; E = 3 to 512,
  top_k = E included; N and K not multiples of 64; experts without tokens), both stages, two
  routings (balanced, real2); never in the dataset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from . import routing as R
from . import space

TP_DEGREES = (1, 2, 4, 8)
EP_DEGREES = (2, 4, 8)
# A TP shard of the intermediate size below this is skipped (the rule).
MIN_N = 64
# w1 + w2 in bf16 (E * 3 * I * hidden * 2 bytes) above this: the variant is skipped.
WEIGHT_LIMIT_BYTES = 12 * 10**9

# vLLM's fused-MoE M grid (the keys of its tuned files), and the training grid.
VLLM_M_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
TRAIN_M = VLLM_M_GRID + (8192,)
EVAL_M = (1, 16, 64, 256, 1024, 4096)
EVAL_SKEWED = "zipf"
EVAL_SKEWED_M = (16, 1024)

GATE_ORIGIN = "gate/odd-shapes"


@dataclass(frozen=True)
class MoeShape:
    """One stage of an MoE layer to benchmark, with where it comes from (``space.Problem``'s fields)."""

    m: int
    n: int
    k: int
    dtype: str
    e: int
    top_k: int
    stage: str
    routing: str = "balanced"
    origins: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        self.problem  # noqa: B018 - validates every field (ValueError naming it)

    @property
    def problem(self) -> space.Problem:
        return space.Problem(self.m, self.n, self.k, self.dtype, self.e, self.top_k, self.stage, self.routing)

    @property
    def key(self) -> str:
        return self.problem.key

    @property
    def family(self) -> str:
        return self.origins[0].split("/")[0] if self.origins else "user"

    @property
    def intermediate(self) -> int:
        """The per-shard intermediate size I of the layer (vLLM's N)."""
        return self.n // 2 if self.stage == "gate_up" else self.k

    @property
    def hidden(self) -> int:
        return self.k if self.stage == "gate_up" else self.n


# -- models -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoeModel:
    """The routed experts of an MoE model (config.json): E experts, top_k per token, per-expert
    intermediate size I, hidden size."""

    name: str
    family: str
    experts: int
    top_k: int
    intermediate: int
    hidden: int
    eval_variant: str = ""  # held-out models: the variant the eval suite measures


TRAINING_MODELS = (
    # num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336, hidden_size 4096
    MoeModel("Mixtral-8x7B-v0.1", "mixtral-8x7b", 8, 2, 14336, 4096),
    # n_routed_experts 64, num_experts_per_tok 6, moe_intermediate_size 1408, hidden_size 2048
    MoeModel("DeepSeek-V2-Lite", "deepseek-v2-lite", 64, 6, 1408, 2048),
    # n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2048, hidden_size 7168
    MoeModel("DeepSeek-V3", "deepseek-v3", 256, 8, 2048, 7168),
    # num_experts 60, num_experts_per_tok 4, moe_intermediate_size 1408, hidden_size 2048
    MoeModel("Qwen1.5-MoE-A2.7B", "qwen1.5-moe-a2.7b", 60, 4, 1408, 2048),
    # num_experts 64, num_experts_per_tok 8, moe_intermediate_size 2560, hidden_size 3584
    MoeModel("Qwen2-57B-A14B", "qwen2-57b-a14b", 64, 8, 2560, 3584),
    # num_experts 128, num_experts_per_tok 8, moe_intermediate_size 1536, hidden_size 4096
    MoeModel("Qwen3-235B-A22B", "qwen3-235b-a22b", 128, 8, 1536, 4096),
    # num_experts 64, num_experts_per_tok 8, intermediate_size 1024, hidden_size 2048
    MoeModel("OLMoE-1B-7B-0924", "olmoe-1b-7b", 64, 8, 1024, 2048),
    # ffn_config: moe_num_experts 16, moe_top_k 4, ffn_hidden_size 10752; d_model 6144
    MoeModel("dbrx-base", "dbrx", 16, 4, 10752, 6144),
    # num_local_experts 16, num_experts_per_tok 1, intermediate_size 8192 (experts), hidden_size 5120
    MoeModel("Llama-4-Scout-17B-16E", "llama-4-scout", 16, 1, 8192, 5120),
)

# Held out: the evaluation's families (E from 8 to 512), one variant each in the eval suite.
HELDOUT_MODELS = (
    # num_local_experts 8, top 2, intermediate_size 16384, hidden 6144 (vLLM has E=8,N=4096 for TP4)
    MoeModel("Mixtral-8x22B-v0.1", "mixtral-8x22b", 8, 2, 16384, 6144, "tp4"),
    # num_local_experts 16, top 2, intermediate_size 6400, hidden 4096
    MoeModel("Phi-3.5-MoE-instruct", "phi-3.5-moe", 16, 2, 6400, 4096, "tp2"),
    # num_local_experts 32, experts_per_token 4, intermediate_size 2880, hidden 2880
    MoeModel("gpt-oss-20b", "gpt-oss-20b", 32, 4, 2880, 2880, "tp1"),
    # num_local_experts 40, num_experts_per_tok 8, intermediate_size 512, hidden 1536
    MoeModel("granite-3.0-3b-a800m", "granite-3.0-3b-a800m", 40, 8, 512, 1536, "tp1"),
    # num_experts 128, top 8, moe_intermediate_size 768, hidden 2048 (vLLM has E=128,N=384 for TP2)
    MoeModel("Qwen3-30B-A3B", "qwen3-30b-a3b", 128, 8, 768, 2048, "tp2"),
    # n_routed_experts 160, top 6, moe_intermediate_size 1536, hidden 5120
    MoeModel("DeepSeek-V2", "deepseek-v2", 160, 6, 1536, 5120, "tp8"),
    # n_routed_experts 384, top 8, moe_intermediate_size 2048, hidden 7168 (TP1/TP2 exceed the guard)
    MoeModel("Kimi-K2-Instruct", "kimi-k2", 384, 8, 2048, 7168, "tp8"),
    # num_experts 512, top 10, moe_intermediate_size 512, hidden 2048 (vLLM has E=512,N=512 for TP1)
    MoeModel("Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b", 512, 10, 512, 2048, "tp1"),
)

# Held out too (never training data), not in the eval suite: they only name vLLM's tuned files.
OTHER_MODELS = (
    # num_experts 16, num_experts_per_tok 2, intermediate_size 14336, hidden 4096
    MoeModel("AI21-Jamba-1.5-Mini", "jamba-1.5-mini", 16, 2, 14336, 4096),
    # num_local_experts 128, experts_per_token 4, intermediate_size 2880, hidden 2880
    MoeModel("gpt-oss-120b", "gpt-oss-120b", 128, 4, 2880, 2880),
    # n_routed_experts 128, top 8, moe_intermediate_size 1408, hidden 4096
    MoeModel("GLM-4.5-Air", "glm-4.5-air", 128, 8, 1408, 4096),
    # num_local_experts 128, top 1, intermediate_size 8192, hidden 5120
    MoeModel("Llama-4-Maverick-17B-128E", "llama-4-maverick", 128, 1, 8192, 5120),
)

TRAINING_FAMILIES = tuple(sorted({m.family for m in TRAINING_MODELS}))
HELDOUT_FAMILIES = tuple(sorted({m.family for m in HELDOUT_MODELS + OTHER_MODELS}))
ALL_MODELS = TRAINING_MODELS + HELDOUT_MODELS + OTHER_MODELS


@dataclass(frozen=True)
class LayerVariant:
    """One MoE layer of a model as one rank runs it: ``tp{t}`` or ``ep{p}`` (module doc)."""

    model: MoeModel
    kind: str  # 'tp' or 'ep'
    degree: int

    @property
    def name(self) -> str:
        return f"{self.kind}{self.degree}"

    @property
    def e(self) -> int:
        return self.model.experts // self.degree if self.kind == "ep" else self.model.experts

    @property
    def inter(self) -> int:
        """The per-shard intermediate size I (vLLM's N)."""
        return self.model.intermediate // self.degree if self.kind == "tp" else self.model.intermediate

    @property
    def hidden(self) -> int:
        return self.model.hidden

    @property
    def top_k(self) -> int:
        return self.model.top_k

    @property
    def family(self) -> str:
        return self.model.family

    @property
    def origin(self) -> str:
        return f"{self.model.family}/{self.model.name}/{self.name}"

    @property
    def weight_bytes(self) -> int:
        """w1 (E, 2I, hidden) + w2 (E, hidden, I) in bf16."""
        return self.e * 3 * self.inter * self.hidden * 2

    def shapes(self, m: int, dtype: str = "bf16", routing: str = "balanced") -> tuple[MoeShape, MoeShape]:
        """(gate_up, down) at M tokens."""
        o = (self.origin,)
        return (MoeShape(m, 2 * self.inter, self.hidden, dtype, self.e, self.top_k, "gate_up", routing, o),
                MoeShape(m, self.hidden, self.inter, dtype, self.e, self.top_k, "down", routing, o))


def variants(model: MoeModel, guard: bool = True, dtype: str = "bf16") -> list[LayerVariant]:
    """The model's TP and EP variants (module doc); ``guard``: drop those over WEIGHT_LIMIT_BYTES;
    fp8bs: only those vLLM loads with block scales (``block_ok``)."""
    out = [LayerVariant(model, "tp", t) for t in TP_DEGREES
           if model.intermediate % t == 0 and model.intermediate // t >= MIN_N]
    out += [LayerVariant(model, "ep", p) for p in EP_DEGREES
            if model.experts % p == 0 and model.experts // p >= model.top_k]
    return [v for v in out if (not guard or v.weight_bytes <= WEIGHT_LIMIT_BYTES) and block_ok(v, dtype)]


def block_ok(v: LayerVariant, dtype: str) -> bool:
    """Whether vLLM runs the variant in dtype: for fp8bs, its per-shard intermediate size must be a
    multiple of the 128-row scale block (vLLM 0.33.0's Fp8MoEMethod raises otherwise: w13's gate and
    up halves and w2's K groups must each be whole blocks); every variant for the other dtypes."""
    return dtype != space.BLOCK_DTYPE or v.inter % space.BLOCK_SHAPE[0] == 0


def eval_variant(model: MoeModel, dtype: str = "bf16") -> LayerVariant | None:
    """The variant the eval suite measures: the model's ``eval_variant``; for fp8bs, when that one
    is not block-scalable, its first variant that is (None: the model has none)."""
    v = variant(model, model.eval_variant)
    if block_ok(v, dtype):
        return v
    return next(iter(variants(model, dtype=dtype)), None)


def variant(model: MoeModel, name: str) -> LayerVariant:
    """The variant of this name (e.g. 'tp4'); ValueError if the model has none such."""
    for v in variants(model, guard=False):
        if v.name == name:
            return v
    raise ValueError(f"{model.name} has no variant {name!r}")


def _merge(shapes: Iterable[MoeShape]) -> list[MoeShape]:
    """One shape per key (first seen order), the origins of duplicates joined."""
    out: dict[str, MoeShape] = {}
    for s in shapes:
        old = out.get(s.key)
        if old is None:
            out[s.key] = s
        else:
            out[s.key] = MoeShape(s.m, s.n, s.k, s.dtype, s.e, s.top_k, s.stage, s.routing,
                                  tuple(dict.fromkeys(old.origins + s.origins)))
    return list(out.values())


# -- vLLM's tuned files ---------------------------------------------------------------------

# (E, N) of vLLM 0.33.0's fused-MoE files tuned for NVIDIA_H100_80GB_HBM3, as its loader reads
# them: bf16 = no dtype part (vLLM's get_config_dtype_str is None for bf16/fp16), fp8 =
# ``dtype=fp8_w8a8`` without a block_shape (per-tensor scales). Not read by vLLM, so not here:
# ``dtype=bf16`` (E=64/128, N=8960), ``dtype=float8`` (E=16, N=3072/7168). Checked against
# datasets/vllm/0.33.0/fused_moe_configs/MANIFEST.csv by tests/test_moe_suites.py.
VLLM_H100_FILES = {
    "bf16": ((1, 3072), (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (16, 1344), (16, 1792),
             (16, 2688), (32, 1792), (62, 256), (62, 512), (64, 320), (64, 640), (64, 1280), (64, 1536),
             (72, 384), (72, 768), (128, 192), (128, 384), (128, 512), (128, 928), (128, 1856), (128, 2880),
             (256, 512), (512, 128), (512, 256), (512, 512)),
    "fp8": ((8, 2048), (8, 3584), (8, 4096), (8, 7168), (8, 8192), (8, 14336), (16, 800), (16, 3200),
            (16, 6400), (64, 320), (64, 640), (64, 1280), (64, 2560), (64, 8960), (128, 352), (128, 704),
            (128, 8960)),
}
VLLM_DEVICE = "NVIDIA_H100_80GB_HBM3"
_VLLM_DTYPE_PART = {"bf16": "", "fp8": ",dtype=fp8_w8a8"}

# What the files no model of ours explains probably are (a guess, not used by anything).
UNMAPPED_NOTES = {
    (1, 3072): "E = 1: not an MoE layer",
    (32, 1792): "no known model (one M key, 512)",
    (62, 256): "no known model (E = 62)",
    (62, 512): "no known model (E = 62)",
    (72, 384): "probably IBM Granite-4.0-H-Small (72 experts, I = 768) at TP2; not in the tables",
    (72, 768): "probably IBM Granite-4.0-H-Small (72 experts, I = 768) at TP1; not in the tables",
    (128, 928): "probably NVIDIA Nemotron-3-Nano-30B-A3B (128 experts, I = 1856) at TP2; not in the tables",
    (128, 1856): "probably NVIDIA Nemotron-3-Nano-30B-A3B (128 experts, I = 1856) at TP1; not in the tables",
    (64, 8960): "no known model (N = 8960)",
    (128, 8960): "no known model (N = 8960)",
}

# The files the vllm suite measures: training-family files spread over E and N (<= ~80 shapes).
VLLM_SUITE_FILES = {
    "bf16": ((8, 1792), (8, 7168), (16, 2688), (64, 640), (128, 384), (256, 512)),
    "fp8": ((8, 3584), (8, 14336), (64, 640), (64, 2560)),
}


@dataclass(frozen=True)
class VllmFile:
    """One of vLLM's tuned files and the layer variants whose (E, N) it serves. vLLM looks a file
    up by (E, N, GPU, dtype) only, so every variant with that local E and I runs its configs; the
    first training variant (else the first held-out one) is the file's mapping."""

    e: int
    n: int
    dtype: str
    matches: tuple[LayerVariant, ...] = ()
    note: str = ""

    @property
    def file_name(self) -> str:
        return f"E={self.e},N={self.n},device_name={VLLM_DEVICE}{_VLLM_DTYPE_PART[self.dtype]}.json"

    @property
    def variant(self) -> LayerVariant | None:
        train = [v for v in self.matches if v.model in TRAINING_MODELS]
        return (train or list(self.matches) or [None])[0]

    @property
    def mapped(self) -> bool:
        return self.variant is not None

    @property
    def training(self) -> bool:
        return self.mapped and self.variant.model in TRAINING_MODELS

    def row(self) -> tuple:
        """(E, N, family, model, variant, hidden K, top_k); None past N when unmapped."""
        v = self.variant
        if v is None:
            return (self.e, self.n, None, None, None, None, None)
        return (self.e, self.n, v.family, v.model.name, v.name, v.hidden, v.top_k)


def _variant_index() -> dict[tuple[int, int], list[LayerVariant]]:
    idx: dict[tuple[int, int], list[LayerVariant]] = {}
    for model in ALL_MODELS:
        for v in variants(model, guard=False):
            idx.setdefault((v.e, v.inter), []).append(v)
    return idx


def vllm_file_shapes(dtype: str = "bf16") -> list[VllmFile]:
    """Every H100 tuned file of vLLM for dtype (bf16 or fp8) with the layer variants it serves
    (``VllmFile.row()``: E, N, family, model, variant, hidden K, top_k); an unmapped file has no
    match and a ``note``."""
    if dtype not in VLLM_H100_FILES:
        raise ValueError(f"vLLM's fused-MoE files are listed for {', '.join(VLLM_H100_FILES)}, got {dtype!r}")
    idx = _variant_index()
    return [VllmFile(e, n, dtype, tuple(idx.get((e, n), ())), "" if (e, n) in idx else UNMAPPED_NOTES.get((e, n), ""))
            for e, n in VLLM_H100_FILES[dtype]]


def unmapped_vllm_files(dtype: str = "bf16") -> list[VllmFile]:
    return [f for f in vllm_file_shapes(dtype) if not f.mapped]


# -- suites -------------------------------------------------------------------------------

# fp8bs: vLLM 0.33.0's block-fp8 MoE files ``E=..,N=..,device_name=NVIDIA_H200,dtype=fp8_w8a8,
# block_shape=[128,128].json`` whose (E, N) is a training variant: DeepSeek-V3 TP8 and Qwen3-235B-A22B
# TP2 (its H100 block files, E=256/512 with N=128..384, serve none).
VLLM_BLOCK_SUITE_FILES = ((256, 256), (128, 768))


def vllm_suite(dtype: str = "bf16") -> list[MoeShape]:
    """vLLM's tuned H100 files of VLLM_SUITE_FILES (each a training family's variant) at EVAL_M,
    balanced, both stages; every candidate measured; held out of ``training_suite``. fp8bs: its
    H200 block-fp8 files of VLLM_BLOCK_SUITE_FILES."""
    if dtype == space.BLOCK_DTYPE:
        idx = _variant_index()
        out = []
        for en in VLLM_BLOCK_SUITE_FILES:
            v = next(v for v in idx[en] if v.model in TRAINING_MODELS)
            out += [s for m in EVAL_M for s in v.shapes(m, dtype, "balanced")]
        return _merge(out)
    files = {(f.e, f.n): f for f in vllm_file_shapes(dtype)}
    out = []
    for en in VLLM_SUITE_FILES[dtype]:
        v = files[en].variant
        out += [s for m in EVAL_M for s in v.shapes(m, dtype, "balanced")]
    return _merge(out)


def training_suite(dtype: str = "bf16", ms: Iterable[int] = TRAIN_M, skewed: int = 1) -> list[MoeShape]:
    """Every variant of the training families over ``ms``, balanced plus ``skewed`` skewed routings
    per (variant, M > 1), cycling through routing.SKEWED (module doc; 5 = all of them), both
    stages; without the vllm suite's shapes."""
    if not 0 <= skewed <= len(R.SKEWED):
        raise ValueError(f"skewed must be in 0..{len(R.SKEWED)}, got {skewed}")
    held = {s.key for s in vllm_suite(dtype)} if dtype in VLLM_SUITE_FILES or dtype == space.BLOCK_DTYPE else set()
    out, vi = [], 0
    for model in TRAINING_MODELS:
        for v in variants(model, dtype=dtype):
            for mi, m in enumerate(ms):
                extra = () if m == 1 else tuple(R.SKEWED[(vi + mi + j) % len(R.SKEWED)] for j in range(skewed))
                out += [s for r in ("balanced", *extra) for s in v.shapes(m, dtype, r)]
            vi += 1
    return [s for s in _merge(out) if s.key not in held]


# The skewed suite's M: from here up, the held-out skewed geomean was weakest (M = 1024: 1.012-1.017
# per stage against 1.008-1.012 at M = 16), and one extra routing per (variant, M) over the whole
# grid would cost about 2.5x the device time.
SKEWED_EXTRA_MIN_M = 256


def skewed_suite(dtype: str = "bf16", min_m: int = SKEWED_EXTRA_MIN_M) -> list[MoeShape]:
    """A second skewed routing per (variant, M >= min_m) of the training families: the shapes of
    ``training_suite(skewed=2)`` at those M that ``training_suite()`` (one skewed routing) lacks;
    the next routing of routing.SKEWED's cycle, so all five kinds stay equally common. Both
    stages; sampled candidates, like ``train``."""
    have = {s.key for s in training_suite(dtype)}
    # Over the whole grid, then cut: the routing cycle's position depends on M's index in TRAIN_M.
    return [s for s in training_suite(dtype, skewed=2) if s.m >= min_m and s.key not in have]


def eval_suite(dtype: str = "bf16") -> list[MoeShape]:
    """The held-out families' eval variants at EVAL_M (balanced) and EVAL_SKEWED_M (zipf), both
    stages; every candidate measured."""
    out = []
    for model in HELDOUT_MODELS:
        v = eval_variant(model, dtype)
        if v is None:
            continue
        out += [s for m in EVAL_M for s in v.shapes(m, dtype, "balanced")]
        out += [s for m in EVAL_SKEWED_M for s in v.shapes(m, dtype, EVAL_SKEWED)]
    return _merge(out)


# (E, top_k, I, hidden): N and K off every multiple of 64 (2I = 666, 400, 208, 260); E = 3 with
# top_k = E; E = 512 leaves most experts without a token at M = 1 and 7.
GATE_LAYERS = ((8, 2, 333, 517), (64, 6, 200, 1000), (512, 10, 104, 200), (3, 3, 130, 260))
GATE_M = (1, 7, 4097)
# real2 (a Dirichlet draw) leaves experts without tokens even at M = 4097 (E = 8, 64, 512) and
# crowds up to 85% of the pairs onto one expert.
GATE_ROUTINGS = ("balanced", "real2")


def gate_suite(dtype: str = "bf16") -> list[MoeShape]:
    """The correctness gate's odd shapes (not model layers: never in the dataset)."""
    out = []
    for e, top_k, inter, hidden in GATE_LAYERS:
        for m in GATE_M:
            for r in GATE_ROUTINGS:
                out += [MoeShape(m, 2 * inter, hidden, dtype, e, top_k, "gate_up", r, (GATE_ORIGIN,)),
                        MoeShape(m, hidden, inter, dtype, e, top_k, "down", r, (GATE_ORIGIN,))]
    return out


SUITES = {"train": training_suite, "train_skewed": skewed_suite, "eval": eval_suite, "vllm": vllm_suite, "gate": gate_suite}
