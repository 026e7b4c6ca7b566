"""Config space of the fused-MoE op ``moe``, as data (torch-free).

The layer (vLLM's ``fused_experts``): each of M tokens goes to top_k of E experts; the
token-expert pairs are sorted by expert and padded per expert to BLOCK_SIZE_M rows, then two
grouped GEMMs run over them. They are two *stages* of one problem, each with its own config:

- ``gate_up``: (M * top_k, K = hidden) @ w1[e].T, w1 (E, N = 2 * I, hidden), then silu(gate) * up
  -> the intermediate (M * top_k, I);
- ``down``: (M * top_k, K = I) @ w2[e].T, w2 (E, N = hidden, I), times each pair's routing
  weight, summed over the top_k experts of a token -> y (M, hidden).

So a Problem's (n, k) are the stage's GEMM (n = weight rows, k = reduction): a dense GEMM's
meaning, with M tokens doing M * top_k rows over E weights. Its ``routing`` names the expert
histogram (``routing.py``): the same shape runs at another speed when the tokens crowd onto a
few experts.

Candidates (the same module interface as ``kernels/gemm/space.py``):
- ``tiled`` (``MoeTiledConfig``): vLLM's fused_moe kernel on vLLM's keys (BLOCK_SIZE_M/N/K,
  GROUP_SIZE_M, num_warps, num_stages). The space is every distinct config of vLLM's H100 tuned
  files for the dtype (``vllm_h100.py``: vLLM's exhaustive tuner picked each of them for some
  (E, N, M)) plus vLLM's default for every M (``vllm_default``): vLLM's default and tuned
  configs run in our kernel as candidates.
- ``swapab`` (``MoeSwapABConfig``, M <= 64): the same grouped GEMM with the operands swapped, so
  a tile is BLOCK_N weight rows (wgmma's M side, 64 or 128) by a 16-slot block of one expert's
  sorted pairs, with an optional split over K (fp32 partials added atomically). Not a vLLM
  config: it never enters a vLLM export. Measured on the H100 before it joined
  (``benchmarks/explore/moe_swapab.py``, ``benchmarks/results/moe/swapab/``): fastest on 55 of
  the 64 fp8 and 25 of the 64 bf16 held-out decode shapes.
- ``gemv`` (``MoeGemvConfig``, M <= GEMV_MAX_M): a CUDA-core GEMV per token-expert pair, its
  expert read from topk_ids (no align, no padding), the stage's epilogue fused: one launch per
  stage where the MMA variants take four. Not a vLLM config.
- ``vendor`` (``grouped_mm``): ``torch._grouped_mm`` (bf16, sm90) over the expert-contiguous
  layout, its permutation of the rows counted in its time.

dtypes: bf16; fp8 (w8a8, per-tensor activation scale and per-expert weight scale); fp8bs (w8a8 block
scales, as DeepSeek-V3/R1, Kimi-K2 and Qwen3-*-FP8 checkpoints run in vLLM: one fp32 scale per 128x128
block of every expert's weight, (E, ceil(N/128), ceil(K/128)), and one per token per 128 columns of the
activations, (rows, ceil(K/128)); vLLM's files ``...,dtype=fp8_w8a8,block_shape=[128,128].json``);
fp16/fp32 only for the Triton CPU interpreter tests (they compute garbage for bf16/fp8 dots).

fp8bs's space (``_enumerate``): vLLM's block-fp8 default for every M, every config of vLLM's
block-fp8 MoE tuned files (``vllm_blockfp8.py``), the per-tensor fp8 table, swap-AB and the GEMV.
Its rules (``static_feasible``): a K tile lies in one 128-column scale group (BLOCK_K divides 128,
vLLM's tuner's filter; vLLM's launch even caps BLOCK_SIZE_K at 128), the GEMV's K tile is whole
groups; BLOCK_N is free (the kernels read each weight row's block scale, as vLLM's does). No vendor:
torch._grouped_mm has no fp8 form, block-scaled or not.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar, Union


from ..space_common import (ARCHS, PARAM_NAMES, ArchSpec, VendorConfig, check_dims, feasibility,  # noqa: F401
                            first_violation, nearest_log2, param_arrays, parse_config_id, rules_mask, space_hash,
                            uniform_params)
from . import routing as R
from ..fp8_blockscale.space import GROUP_K, GROUP_N
from . import vllm_blockfp8, vllm_h100

DTYPE_BYTES = {"bf16": 2, "fp8": 1, "fp8bs": 1, "fp16": 2, "fp32": 4}
# The block-scaled fp8 dtype and its scale block [block_n, block_k] (vLLM's block_shape).
BLOCK_DTYPE = "fp8bs"
BLOCK_SHAPE = (GROUP_N, GROUP_K)
# Dtypes whose tensor cores are fp8 (the per-tensor and the block-scaled one).
FP8_DTYPES = ("fp8", BLOCK_DTYPE)
DTYPES = tuple(DTYPE_BYTES)
STAGES = ("gate_up", "down")
# How a shape id (dtype:MxNxK, as evaluation results and reports name shapes) spells the op's own
# problem fields (registry OpSpec.shape_id_suffix).
SHAPE_ID = ":e{e}k{top_k}:{stage}:{routing}"
MAX_EXPERTS = 512
# The align step numbers the token-expert pairs and their per-expert padding in int32 (vLLM's
# sorted_token_ids: M * top_k + E * (BLOCK_M - 1) slots, BLOCK_M <= 256): a problem with more
# pairs cannot be laid out, on any GPU (issue 57, row 2: M = 2**31 - 1 used to reach the features).
MAX_PAIRS = 2**31 - 1 - MAX_EXPERTS * 255


def check_experts(p) -> None:
    """The expert fields of an MoE problem (this op's and vLLM's layer op's): e and top_k ints,
    1 <= top_k <= e <= MAX_EXPERTS, and m * top_k pair ids that fit int32."""
    for name in ("e", "top_k"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {type(v).__name__}")
    if not 1 <= p.e <= MAX_EXPERTS:
        raise ValueError(f"e must be in 1..{MAX_EXPERTS}, got {p.e}")
    if not 1 <= p.top_k <= p.e:
        raise ValueError(f"top_k must be in 1..e={p.e}, got {p.top_k}")
    if p.m * p.top_k > MAX_PAIRS:
        raise ValueError(f"m * top_k must be <= {MAX_PAIRS} (the int32 token-expert pair ids), got "
                         f"m={p.m}, top_k={p.top_k}")


@dataclass(frozen=True)
class Problem:
    """One stage of an MoE layer: M tokens, top_k of E experts each, a GEMM of N x K weights per
    expert (gate_up: N = 2 * intermediate, K = hidden; down: N = hidden, K = intermediate)."""

    m: int
    n: int
    k: int
    dtype: str
    e: int
    top_k: int
    stage: str
    routing: str = "balanced"
    DTYPES: ClassVar[tuple] = DTYPES

    def __post_init__(self):
        check_dims(self, self.DTYPES)
        check_experts(self)
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if self.stage == "gate_up" and self.n % 2:
            raise ValueError(f"n must be even for stage gate_up (n = 2 * intermediate: gate and up), got {self.n}")
        R.check_routing(self.routing)

    @property
    def key(self) -> str:
        return f"{self.dtype}:{self.m}x{self.n}x{self.k}:e{self.e}k{self.top_k}:{self.stage}:{self.routing}"

    @property
    def pairs(self) -> int:
        """Token-expert pairs: the rows the grouped GEMM computes before padding."""
        return self.m * self.top_k

    def counts(self):
        """Tokens per expert (E,) of this problem's routing."""
        return R.expert_counts(self.routing, self.m, self.e, self.top_k)

    def row_stats(self) -> dict:
        """The routing's statistics a harness row carries (the registry's MoE columns)."""
        c = self.counts()
        return {"tpe_max": int(max(c)), "active_experts": int(sum(1 for v in c if v > 0))}


@dataclass(frozen=True)
class MoeTiledConfig:
    """vLLM's fused_moe kernel: programs over (BLOCK_SIZE_M rows of one expert's sorted pairs) x
    (BLOCK_SIZE_N weight rows), grouped order; the fields are vLLM's JSON keys."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return (f"moe_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class MoeSwapABConfig:
    """The swapped grouped GEMM: programs over (BLOCK_N weight rows of one expert) x (BLOCK_M of
    its sorted pairs) x (SPLIT_K slices of K). block_m is the pairs' padding unit, as for tiled."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "swapab"

    @property
    def id(self) -> str:
        return (f"moeswap_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class MoeGemvConfig:
    """The decode GEMV (impl.moe_gemv_*_kernel): a program owns ``block_n`` output columns of one
    pair (gate_up: its gate and up rows) or of one token (down: summing its top_k pairs), streaming
    (block_n, block_k) weight tiles into fp32 accumulators reduced after the loop."""

    block_n: int
    block_k: int
    num_warps: int
    variant: ClassVar[str] = "gemv"
    # Compiled per weight shape (N, K and strides constant; impl.moe_gemv_*_kernel): the
    # precompile probes it on the problem's own N and K (shape_probe below).
    shape_specialised: ClassVar[bool] = True

    @property
    def id(self) -> str:
        return f"moegemv_n{self.block_n}k{self.block_k}_w{self.num_warps}"


VENDOR = VendorConfig("grouped_mm")
MoeConfig = Union[MoeTiledConfig, MoeSwapABConfig, MoeGemvConfig, VendorConfig]
VARIANTS = {"tiled": MoeTiledConfig, "swapab": MoeSwapABConfig, "gemv": MoeGemvConfig, "vendor": VendorConfig}
_ID_RE = {"tiled": re.compile(r"^moe_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
          "swapab": re.compile(r"^moeswap_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
          "gemv": re.compile(r"^moegemv_n(\d+)k(\d+)_w(\d+)$")}


def config_from_id(cid: str) -> MoeConfig:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == VENDOR.id:
        return VENDOR
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: MoeConfig) -> dict:
    """Numeric parameters under the dense op's uniform names (PARAM_NAMES; 0 = n/a)."""
    out = uniform_params(cfg, PARAM_NAMES)
    if isinstance(cfg, VendorConfig):
        return out
    if isinstance(cfg, MoeGemvConfig):
        # One pair (or token) per program, no software pipeline: the dense GEMV's uniform view.
        out.update(block_m=1, num_stages=1)
    return out


# -- vLLM's configs ----------------------------------------------------------------------

VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def vllm_default(m: int, e: int, dtype: str = "bf16") -> MoeTiledConfig:
    """vLLM's ``get_default_config`` for M tokens and E experts (no tuned file; bf16, and fp8 w8a8
    without a block shape): BLOCK_SIZE_M 16/32/64/128 for M <= 32/96/512/else, BLOCK_SIZE_N 64 if
    M <= 64 else 128, BLOCK_SIZE_K 128 if fp8 or M <= 64 else 64, GROUP_SIZE_M 16 if M // E > 128
    else 1, num_warps 4 if M <= 128 else 8, num_stages 4 if M <= 32 else 3.

    fp8bs (block_shape [128, 128], vLLM's CUDA branch): BLOCK_SIZE_M 16 if M <= 64 else 64,
    BLOCK_SIZE_N 64 if M <= 8 else 128 (the block's rows), BLOCK_SIZE_K 128 (the block's columns),
    GROUP_SIZE_M 1 if M <= 16 else 32, num_warps 4, num_stages 4 if M <= 4, else 3."""
    if dtype == BLOCK_DTYPE:
        return MoeTiledConfig(16 if m <= 64 else 64, 64 if m <= 8 else GROUP_N, GROUP_K, 1 if m <= 16 else 32, 4,
                              4 if m <= 4 else 3)
    bm = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return MoeTiledConfig(bm, 64 if m <= 64 else 128, 128 if (dtype == "fp8" or m <= 64) else 64,
                          16 if m // e > 128 else 1, 4 if m <= 128 else 8, 4 if m <= 32 else 3)


def from_vllm(entry: dict) -> MoeTiledConfig:
    """The config of one vLLM JSON entry; ValueError naming a missing or unknown key."""
    if not isinstance(entry, dict):
        raise ValueError(f"not a vLLM fused-MoE config entry: {entry!r}")
    missing = [k for k in VLLM_KEYS if k not in entry]
    # vLLM 0.33's files may carry extra keys it ignores at launch (e.g. SPLIT_K 1 in older files).
    if missing:
        raise ValueError(f"not a vLLM fused-MoE config entry: missing {missing}")
    return MoeTiledConfig(*(int(entry[k]) for k in VLLM_KEYS))


def to_vllm(cfg: MoeTiledConfig) -> dict:
    """The vLLM JSON entry of a tiled config."""
    return dict(zip(VLLM_KEYS, (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps,
                                cfg.num_stages)))


# vLLM's defaults over its M grid and beyond, for E = 1 (the GROUP_SIZE_M 16 arm) and E >= 64; and
# the block-fp8 default's M steps.
_DEFAULT_M = (1, 32, 33, 64, 65, 96, 97, 128, 129, 512, 513, 8192)
_BLOCK_DEFAULT_M = (1, 5, 9, 17, 65)


# Largest M the swap-AB variant runs at (decode; a problem rule).
SWAPAB_MAX_M = 64
# The swap-AB grid, from its H100 exploration (benchmarks/results/moe/swapab/): every winner had a
# 16-slot pair block and 4 warps; 32-slot blocks won no shape and are left out.
SWAPAB_BLOCK_N = (64, 128)
SWAPAB_BLOCK_K = (128, 256)
SWAPAB_SPLIT_K = (1, 2, 4)
SWAPAB_STAGES = (3, 4)


# Largest M the GEMV runs at (a problem rule): each pair re-reads its expert's weights.
GEMV_MAX_M = 4
# The GEMV's configs (block_n, block_k, num_warps). Measured first as a grid of 28 (1-8 output
# columns by 256-2048 of K, 4 or 8 warps, at most 4096 fp32 accumulator elements per 4 warps) on
# every training problem with M <= 4; its configs were up to 4x apart on one problem with no
# smooth pattern (register pressure), and the ranker trained on all 28 picked a GEMV 1.04-1.07x
# off the best at M = 1. These 10 are the greedy cover of those training rows
# (benchmarks/explore/moe_gemv_grid.py): the best of them is 1.0018x the best of the 28 (M = 1:
# 1.0054x), worst 1.23x. The grid's other 18 configs' rows stay in the shards; the loader skips them.
GEMV_CONFIGS = ((8, 256, 4), (8, 512, 8), (1, 512, 4), (8, 512, 4), (4, 512, 4), (2, 1024, 4), (4, 256, 4),
                (8, 1024, 8), (4, 1024, 4), (1, 2048, 8))
GEMV_MIN_BLOCK_K = min(c[1] for c in GEMV_CONFIGS)
# The GEMV's K tile may be over twice K only at its smallest K tile (a problem rule): more
# masked lanes than real ones (the block-scale op's GEMV lost 1.19x to swap-AB that way).
GEMV_K_TILE_SLACK = 2


def _enumerate(dtype: str) -> list[MoeConfig]:
    if dtype == BLOCK_DTYPE:
        # vLLM's block default first (the rule's answer), then its block-fp8 and per-tensor fp8 picks
        # (those with K tiles over one scale group drop out in static_feasible).
        out = [vllm_default(m, 1, dtype) for m in _BLOCK_DEFAULT_M]
        out += [MoeTiledConfig(*t) for t in vllm_blockfp8.FP8_BLOCK + vllm_h100.FP8]
    else:
        table = vllm_h100.FP8 if dtype == "fp8" else vllm_h100.BF16
        dd = "fp8" if dtype == "fp8" else "bf16"
        out = [vllm_default(m, e, dd) for m in _DEFAULT_M for e in (1, 64)]
        out += [MoeTiledConfig(*t) for t in table]
    out += [MoeSwapABConfig(16, bn, bk, sk, 4, st) for bn in SWAPAB_BLOCK_N for bk in SWAPAB_BLOCK_K
            for sk in SWAPAB_SPLIT_K for st in SWAPAB_STAGES]
    out += [MoeGemvConfig(*c) for c in sorted(GEMV_CONFIGS, key=lambda c: (c[2], c[0], c[1]))]
    return list(dict.fromkeys(out))


# -- feasibility ---------------------------------------------------------------------------

def smem_bytes(cfg: MoeConfig, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles."""
    if isinstance(cfg, (VendorConfig, MoeGemvConfig)):
        return 0  # the GEMV keeps its tiles in registers
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype]


def static_feasible(cfg: MoeConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: shared memory, the vendor's dtype."""
    if isinstance(cfg, VendorConfig):
        if dtype == BLOCK_DTYPE:
            return False, "the vendor candidate (torch._grouped_mm) has no block-scaled fp8 form"
        if dtype != "bf16":
            return False, "the vendor candidate (torch._grouped_mm) is bf16-only"
        return True, ""
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    if dtype in FP8_DTYPES and cfg.block_k < 32:
        return False, "fp8 dot needs block_k >= 32"
    if dtype == BLOCK_DTYPE:
        if isinstance(cfg, MoeGemvConfig):
            if cfg.block_k % GROUP_K:
                return False, f"the block-scale GEMV's K tile must be whole {GROUP_K}-column scale groups"
        elif GROUP_K % cfg.block_k:
            return False, f"block_k={cfg.block_k} must divide the {GROUP_K}-column scale group (one scale per K tile)"
    return True, ""


def generate_configs(arch: str = "sm90", dtype: str = "bf16", include_vendor: bool = True) -> list[MoeConfig]:
    """All statically feasible candidates for (arch, dtype), in a stable order (vLLM's defaults
    first, the vendor last when ``include_vendor``)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    # torch._grouped_mm's bf16 kernels are sm90 (CUTLASS grouped GEMM).
    out = _enumerate(dtype) + ([VENDOR] if include_vendor and spec.name == "sm90" else [])
    return [c for c in out if static_feasible(c, spec, dtype)[0]]


# torch._grouped_mm needs 16-byte row strides of both operands (K % 8 for bf16); its output's row
# stride is N padded to 16 bytes, which impl reads through its stride, so N is free.
VENDOR_ALIGN = 8


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.swapab = variants == "swapab"
        self.gemv = variants == "gemv"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)


# (applies(problem), violated(arrays, problem), reason(problem, params)). The Triton kernel masks
# every dimension: it runs any problem.
PROBLEM_RULES = (
    (lambda p: bool(p.k % VENDOR_ALIGN),
     lambda a, p: a.vendor,
     lambda p, c: f"torch._grouped_mm needs K divisible by {VENDOR_ALIGN} (16-byte rows)"),
    (lambda p: p.m > SWAPAB_MAX_M,
     lambda a, p: a.swapab,
     lambda p, c: f"swap-AB is a decode variant (M <= {SWAPAB_MAX_M})"),
    (lambda p: p.m > GEMV_MAX_M,
     lambda a, p: a.gemv,
     lambda p, c: f"the GEMV is a decode variant (M <= {GEMV_MAX_M}), got M={p.m}"),
    (lambda p: True,
     lambda a, p: a.gemv & (a.params["block_k"] > GEMV_K_TILE_SLACK * p.k) & (a.params["block_k"] > GEMV_MIN_BLOCK_K),
     lambda p, c: f"GEMV block_k={c['block_k']} is over {GEMV_K_TILE_SLACK}x K={p.k}"),
)


# The three are the same for every op (space_common.feasibility): the static rules, then the
# per-problem rule list, over a whole space (problem_mask) or one config (check_feasible).
problem_mask, check_feasible, feasible_configs = feasibility(globals())


# -- the fallback rule -----------------------------------------------------------------------

def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict], e: int = 1, top_k: int = 1,
           dtype: str = "bf16") -> int:
    """The runtime's rule without a model: vLLM's default for (M, E) and the dtype (fp8bs: vLLM's
    block-fp8 default), i.e. the index of the candidate (dicts with 'variant' and PARAM_NAMES)
    nearest to it."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    # Only fp8bs takes its own default here: the bf16/fp8 rule has always been the bf16 default (what
    # the shipped evaluations' "heuristic" rows measured), and stays so.
    want = config_params(vllm_default(m, e, BLOCK_DTYPE if dtype == BLOCK_DTYPE else "bf16"))

    def dist(c: dict) -> float:
        if c["variant"] != "tiled":
            return 1e9
        return sum(abs(math.log2(max(c[p], 1)) - math.log2(max(want[p], 1))) for p in PARAM_NAMES)

    return min(range(len(candidates)), key=lambda i: (dist(candidates[i]), i))


def choose_arrays(m: int, n: int, k: int, sm_count: int, cands, e: int = 1, top_k: int = 1,
                  dtype: str = "bf16") -> int:
    """``choose`` over the candidates as arrays (``space_common.nearest_log2``: ``.tiled``,
    ``.log2``): the same index, without a dict per candidate (the runtime's cold path)."""
    return nearest_log2(cands, config_params(vllm_default(m, e, BLOCK_DTYPE if dtype == BLOCK_DTYPE else "bf16")))


# -- precompile (benchmarks/precompile.py asks the space module of a problem's op) -----------

def specialisation(p: Problem) -> tuple:
    """What the kernels compile per, besides the config: divisibility by 16 of N, K, N/2 (the
    intermediate of gate_up) and the expert stride N*K, top_k (a constexpr of the GEMM and the
    combine), and the align kernels' padded expert count (a constexpr: on the H100 a shape whose E
    differed from its probe's spent ~1 s per candidate compiling align in the measuring process)."""
    half = p.n // 2 if p.stage == "gate_up" else p.n
    e_pad = max(16, 1 << (p.e - 1).bit_length())
    return (p.dtype, p.stage, p.n % 16, p.k % 16, half % 16, (p.n * p.k) % 16, p.top_k, e_pad)


def probe_problem(p: Problem) -> Problem:
    """A tiny problem compiling to the same kernels as p: N congruent mod 32 (so N, N/2 and N*K
    keep their divisibility), the same K, E (the align kernels compile per padded E), stage and
    top_k."""
    return Problem(3, 32 + p.n % 32, p.k, p.dtype, p.e, p.top_k, p.stage, "balanced")


def shape_probe(p: Problem) -> Problem:
    """The probe of a config compiled per weight shape (the GEMV): the problem's own N, K, dtype,
    stage and top_k at M = 1, with only top_k experts (the expert stride N * K does not depend on
    E, so the kernel is the same and the probe's weights are a few experts, not E)."""
    return Problem(1, p.n, p.k, p.dtype, p.top_k, p.top_k, p.stage, "balanced")


# vLLM's fused-MoE tuned file names: E={E},N={N},device_name={gpu}[,dtype={d}][,block_shape=[bn,bk]].json
VLLM_FILE_NAME_RE = (r"^E=(?P<e>\d+),N=(?P<n>\d+),device_name=(?P<device>[^,/\\ ]+)"
                     r"(?:,dtype=(?P<dtype>[A-Za-z0-9_]+))?(?:,block_shape=\[(?P<block>\d+,\s?\d+)\])?\.json$")


def frame_check(cols) -> tuple[str, int, str] | None:
    """The registry's frame check of dataset rows (``cols``: column name -> array, every op's rows):
    (column, first bad row, what is wrong) for a row with more experts per token than experts."""
    import numpy as np

    bad = np.asarray(cols["top_k"]) > np.asarray(cols["e"])
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return "top_k", i, f"{cols['top_k'][i]} experts per token > e = {cols['e'][i]}"
