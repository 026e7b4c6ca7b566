"""The linear layers of LLM families, the shapes the ops' suites draw from (the dense GEMM's
suites: kernels/gemm/suites.py; the block-scaled fp8 op's: kernels/fp8_blockscale/suites.py).

Dims are written from each model's published config.json (hidden_size,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size; MLA
ranks for DeepSeek-V3). Tensor parallelism follows vLLM's rules:
column-parallel layers (fused qkv, fused gate_up, DeepSeek q_b/kv_b) split N,
row-parallel layers (o_proj, down_proj) split K; KV heads are replicated when
there are fewer of them than TP ranks; a TP degree that does not divide the
heads (or the intermediate size) is skipped, as vLLM refuses it.

Only the TRAINING_FAMILIES below may be used to collect training data; every
other family is reserved for held-out evaluation.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from typing import Iterable

from .space_common import DTYPE_BYTES, DenseProblem

TP_DEGREES = (1, 2, 4, 8)

# M grid: dense in decode (1-256, including non-powers of two), then prefill up to 16384.
M_DECODE = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 16, 20, 24, 28, 32, 33, 40, 48, 56, 64,
            72, 80, 96, 100, 112, 128, 144, 160, 192, 200, 224, 256)
M_PREFILL = (320, 384, 512, 640, 768, 1000, 1024, 1536, 2048, 3072, 4096, 4097, 6144, 8192, 12288, 16384)
M_GRID = M_DECODE + M_PREFILL


@dataclass(frozen=True)
class DenseModel:
    """Attention + MLP dims of a decoder with GQA."""

    name: str
    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@dataclass(frozen=True)
class MLAModel:
    """DeepSeek-V3 style multi-head latent attention plus dense MLPs."""

    name: str
    family: str
    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate: int  # dense layers
    shared_expert_intermediate: int


TRAINING_MODELS = (
    DenseModel("Llama-3.1-8B", "llama-3.1", 4096, 32, 8, 128, 14336),
    DenseModel("Llama-3.1-70B", "llama-3.1", 8192, 64, 8, 128, 28672),
    DenseModel("Llama-3.1-405B", "llama-3.1", 16384, 128, 8, 128, 53248),
    DenseModel("Llama-3.2-1B", "llama-3.2", 2048, 32, 8, 64, 8192),
    DenseModel("Llama-3.2-3B", "llama-3.2", 3072, 24, 8, 128, 8192),
    DenseModel("Qwen2.5-0.5B", "qwen2.5", 896, 14, 2, 64, 4864),
    DenseModel("Qwen2.5-1.5B", "qwen2.5", 1536, 12, 2, 128, 8960),
    DenseModel("Qwen2.5-3B", "qwen2.5", 2048, 16, 2, 128, 11008),
    DenseModel("Qwen2.5-7B", "qwen2.5", 3584, 28, 4, 128, 18944),
    DenseModel("Qwen2.5-14B", "qwen2.5", 5120, 40, 8, 128, 13824),
    DenseModel("Qwen2.5-32B", "qwen2.5", 5120, 40, 8, 128, 27648),
    DenseModel("Qwen2.5-72B", "qwen2.5", 8192, 64, 8, 128, 29568),
    DenseModel("Mistral-7B-v0.3", "mistral", 4096, 32, 8, 128, 14336),
    DenseModel("Mistral-Nemo-12B", "mistral", 5120, 32, 8, 128, 14336),
    DenseModel("Mistral-Small-24B", "mistral", 5120, 32, 8, 128, 32768),
    DenseModel("Gemma-2-2B", "gemma-2", 2304, 8, 4, 256, 9216),
    DenseModel("Gemma-2-9B", "gemma-2", 3584, 16, 8, 256, 14336),
    DenseModel("Phi-3-mini", "phi", 3072, 32, 32, 96, 8192),
    DenseModel("Phi-4", "phi", 5120, 40, 10, 128, 17920),
    DenseModel("Yi-1.5-34B", "yi-1.5", 7168, 56, 8, 128, 20480),
    MLAModel("DeepSeek-V3", "deepseek-v3", 7168, 128, 1536, 512, 128, 64, 128, 18432, 2048),
)
TRAINING_FAMILIES = tuple(sorted({m.family for m in TRAINING_MODELS}))


@dataclass(frozen=True)
class Layer:
    """One GEMM of a model at one TP degree: y (M, n) = x (M, k) @ w (n, k).T."""

    model: str
    family: str
    layer: str
    tp: int
    n: int
    k: int


def _tp_ok(heads: int, kv_heads: int, inter: int, tp: int) -> bool:
    if heads % tp or inter % tp:
        return False
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0


def model_layers(model, tp: int) -> list[Layer]:
    """The distinct GEMMs of one model at TP degree tp (empty if tp is invalid for it)."""
    L = lambda name, n, k: Layer(model.name, model.family, name, tp, n, k)  # noqa: E731
    if isinstance(model, DenseModel):
        if not _tp_ok(model.heads, model.kv_heads, model.intermediate, tp):
            return []
        q = model.heads // tp * model.head_dim
        kv = max(1, model.kv_heads // tp) * model.head_dim
        return [
            L("qkv_proj", q + 2 * kv, model.hidden),
            L("o_proj", model.hidden, model.heads // tp * model.head_dim),
            L("gate_up_proj", 2 * model.intermediate // tp, model.hidden),
            L("down_proj", model.hidden, model.intermediate // tp),
        ]
    m = model
    if m.heads % tp or m.intermediate % tp or m.shared_expert_intermediate % tp:
        return []
    h = m.heads // tp
    return [
        # q_a and kv_a are replicated (not sharded) and fused into one GEMM.
        L("fused_qkv_a_proj", m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, m.hidden),
        L("q_b_proj", h * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank),
        L("kv_b_proj", h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        L("o_proj", m.hidden, h * m.v_head_dim),
        L("gate_up_proj", 2 * m.intermediate // tp, m.hidden),
        L("down_proj", m.hidden, m.intermediate // tp),
        L("shared_expert_gate_up_proj", 2 * m.shared_expert_intermediate // tp, m.hidden),
        L("shared_expert_down_proj", m.hidden, m.shared_expert_intermediate // tp),
    ]


def training_layers(tps: Iterable[int] = TP_DEGREES) -> list[Layer]:
    """Every (model, layer, TP) GEMM of the training families."""
    return [layer for model in TRAINING_MODELS for tp in tps for layer in model_layers(model, tp)]


@dataclass(frozen=True)
class Shape:
    """A shape to benchmark, with where it comes from."""

    m: int
    n: int
    k: int
    dtype: str
    origins: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.dtype}:{self.m}x{self.n}x{self.k}"

    @property
    def family(self) -> str:
        return self.origins[0].split("/")[0] if self.origins else "user"


def nk_pairs(tps: Iterable[int] = TP_DEGREES) -> dict[tuple[int, int], list[str]]:
    """Distinct (N, K) of the training layers, each with its origins 'family/model/layer/tpX'."""
    out: dict[tuple[int, int], list[str]] = {}
    for ly in training_layers(tps):
        out.setdefault((ly.n, ly.k), []).append(f"{ly.family}/{ly.model}/{ly.layer}/tp{ly.tp}")
    return out


class _DenseDims(DenseProblem):
    """(M, N, K, dtype) checked as a dense GEMM's Problem checks them (the dtypes every op's space
    knows), without importing an op's folder."""

    DTYPES = tuple(DTYPE_BYTES)


def read_shape_csv(path: str, default_dtype: str = "bf16") -> list[Shape]:
    """User shape list: a CSV with columns M, N, K and optionally dtype (any case)."""
    shapes = []
    # utf-8-sig: spreadsheet exports often start with a byte-order mark.
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty shape file")
        cols = {c.strip().lower(): c for c in reader.fieldnames}
        for need in ("m", "n", "k"):
            if need not in cols:
                raise ValueError(f"{path}:1: missing column {need.upper()} (have {reader.fieldnames})")
        for rec in reader:
            lineno = reader.line_num
            try:
                m, n, k = (int(rec[cols[c]]) for c in ("m", "n", "k"))
                dtype = (rec.get(cols["dtype"]) if "dtype" in cols else None) or default_dtype
                _DenseDims(m, n, k, dtype.strip())
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            shapes.append(Shape(m, n, k, dtype.strip(), (f"user/{path}",)))
    return shapes


@dataclass(frozen=True)
class ProblemShape:
    """A user's problem of an op with fields beyond (M, N, K, dtype) (e.g. MoE's E, top_k, stage,
    routing), in the harness's shape interface: the problem's fields read through, plus origins.
    Equal (and hashed) by the problem alone, like ``Shape``."""

    problem: object
    origins: tuple[str, ...] = field(default=(), compare=False)

    def __getattr__(self, name):
        # Only reached for what the dataclass lacks: the problem's fields (m, n, k, dtype, e, ...).
        # 'problem' and dunders are refused so that copy/pickle never recurse before __init__.
        if name == "problem" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.problem, name)

    @property
    def key(self) -> str:
        return self.problem.key

    @property
    def family(self) -> str:
        return self.origins[0].split("/")[0] if self.origins else "user"


# How a problem field is spelled in messages (the CSV header is read in any case).
_COLUMN_LABELS = {"m": "M", "n": "N", "k": "K", "e": "E"}


def _label(name: str) -> str:
    return _COLUMN_LABELS.get(name, name)


def read_problem_csv(path: str, op: str, default_dtype: str = "bf16") -> list:
    """A user's problem list of an op: a CSV with one column per problem field the op declares
    (registry ``problem_fields``, any case; MoE: M, N, K, E, top_k, stage, routing), ``dtype``
    optional (else ``default_dtype``), so are fields whose Problem has a default (MoE: routing,
    balanced) and the fields the op pins (a dense GEMM's E, top_k: checked). Unknown columns and
    bad values raise a ValueError naming the file, the line and the column.

    Ops whose problem is (M, N, K, dtype) give ``Shape``s, others ``ProblemShape``s; both are
    what the harness measures a suite's shapes from."""
    import dataclasses

    from gemm_costmodel import registry

    spec = registry.get(op)
    problem_type = spec.space_module().Problem
    pfields = {f.name: f for f in dataclasses.fields(problem_type)}
    has_default = {n for n, f in pfields.items()
                   if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    known = list(spec.problem_fields) + [f for f in spec.fixed if f not in spec.problem_fields]
    required = [f for f in spec.problem_fields if f != "dtype" and f not in has_default]
    # Integer fields: the Problem's int annotations (a string under postponed annotations).
    ints = {n for n, f in pfields.items() if f.type in (int, "int")} | {f for f, v in spec.fixed.items()
                                                                       if isinstance(v, int)}
    dense = tuple(spec.problem_fields) == ("m", "n", "k", "dtype")
    shapes = []
    # utf-8-sig: spreadsheet exports often start with a byte-order mark.
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty shape file")
        cols: dict[str, str] = {}
        for c in reader.fieldnames:
            name = (c or "").strip().lower()
            if name not in known:
                raise ValueError(f"{path}:1: unknown column {c!r} for op {op} (its columns: "
                                 f"{', '.join(_label(f) for f in known)})")
            if name in cols:
                raise ValueError(f"{path}:1: column {_label(name)} given twice")
            cols[name] = c
        for need in required:
            if need not in cols:
                raise ValueError(f"{path}:1: missing column {_label(need)} (op {op} needs "
                                 f"{', '.join(_label(f) for f in required)}; have {reader.fieldnames})")
        for rec in reader:
            line = reader.line_num
            values = {}
            for name, col in cols.items():
                text = rec.get(col)
                text = text.strip() if isinstance(text, str) else ""
                if not text:
                    if name in required:
                        raise ValueError(f"{path}:{line}: column {_label(name)}: empty")
                    continue  # dtype, a defaulted or a pinned field: its default
                if name in ints:
                    try:
                        values[name] = int(text)
                    except ValueError:
                        raise ValueError(f"{path}:{line}: column {_label(name)}: not an integer: {text!r}") from None
                else:
                    values[name] = text
            values.setdefault("dtype", default_dtype)
            try:
                problem = spec.problem(**values)
            except (TypeError, ValueError) as exc:
                # The Problem's messages start with the field they reject ("e must be in 1..512").
                first = str(exc).split(" ", 1)[0].split("=", 1)[0].lower()
                where = f" column {_label(first)}:" if first in known else ""
                raise ValueError(f"{path}:{line}:{where} {exc}") from None
            origin = (f"user/{path}",)
            if dense:
                shapes.append(Shape(problem.m, problem.n, problem.k, problem.dtype, origin))
            else:
                shapes.append(ProblemShape(problem, origin))
    return shapes
