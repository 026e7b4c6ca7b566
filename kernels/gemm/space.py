"""Config spaces of the dense GEMM kernel family, as data.

Every candidate the dispatcher can choose is a frozen dataclass with a stable
string id. ``generate_configs(arch, dtype)`` lists the statically feasible
candidates of an architecture (shared memory, register pressure), and
``check_feasible(cfg, problem)`` applies the per-problem rules (TMA alignment,
split-K limits, workspace size). Nothing here touches CUDA.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, fields
from typing import ClassVar, Iterator, Union

# What every op's space shares (dtypes, archs, the vendor config, the parameter and variant
# tables) lives in space_common; this module re-exports it as part of the op interface.
from ..space_common import (ARCHS, DTYPE_BYTES, OUT_DTYPE, PARAM_NAMES, VARIANT_CODES,  # noqa: F401
                            ArchSpec, DenseProblem, VendorConfig, feasibility, first_violation, param_arrays,
                            parse_config_id, rules_mask, space_hash)

DTYPES = tuple(DTYPE_BYTES)


class Problem(DenseProblem):
    """One dense GEMM: y (M, N) = x (M, K) @ w (N, K).T, nn.Linear layout."""

    DTYPES = tuple(DTYPE_BYTES)


@dataclass(frozen=True)
class TiledConfig:
    """Classic output-tiled kernel with grouped (L2-friendly) tile ordering."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return (f"tiled_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class SplitKConfig:
    """Split-K kernel for decode/skinny shapes: fp32 partials, then a reduce kernel."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "splitk"

    @property
    def id(self) -> str:
        return (f"splitk_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class PersistentConfig:
    """Persistent kernel (one program per SM) over TMA tensor descriptors (Hopper)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "persistent"

    @property
    def id(self) -> str:
        return (f"persistent_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class SwapABConfig:
    """Decode kernel computing y.T = w @ x.T: a tile is BLOCK_N weight rows (the MMA's
    M side, so Hopper's wgmma applies) by BLOCK_M tokens, over one of SPLIT_K slices
    of K (summed in the same launch). Pointer loads, any K."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "swapab"
    prefix: ClassVar[str] = "swapab"

    @property
    def id(self) -> str:
        return (f"{self.prefix}_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class SwapABTmaConfig(SwapABConfig):
    """SwapABConfig loading through TMA tensor descriptors (Hopper; 16-byte aligned K rows)."""

    variant: ClassVar[str] = "swapab_tma"
    prefix: ClassVar[str] = "swapabtma"


@dataclass(frozen=True)
class GemvConfig:
    """Decode GEMV for M <= 4 (kernels/gemm/gemv.py): CUDA-core dot products, no MMA. A
    program owns BLOCK_N weight rows and one of SPLIT_K slices of K and streams
    (BLOCK_N, BLOCK_K) weight tiles; BLOCK_M is the token rows it computes (1, 2 or 4, tied
    to M by check_feasible). NUM_STAGES is the weight tiles each thread has in flight (the
    kernel's loop unrolled that many times; Triton does not software-pipeline a loop without
    a dot, so this is the GEMV's own pipeline depth, and the feature keeps its meaning: loads
    in flight)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "gemv"
    # Compiled per weight shape (N, K and the strides are constants in the kernel): a
    # precompile must probe the problem's own N and K (benchmarks/precompile.py).
    shape_specialised: ClassVar[bool] = True

    @property
    def id(self) -> str:
        return (f"gemv_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


GemmConfig = Union[TiledConfig, SplitKConfig, PersistentConfig, SwapABConfig, SwapABTmaConfig, GemvConfig,
                   VendorConfig]
VARIANTS = {c.variant: c for c in (TiledConfig, SplitKConfig, PersistentConfig, SwapABConfig, SwapABTmaConfig,
                                   GemvConfig, VendorConfig)}

_ID_RE = {
    "tiled": re.compile(r"^tiled_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
    "splitk": re.compile(r"^splitk_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
    "persistent": re.compile(r"^persistent_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
    "swapab": re.compile(r"^swapab_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
    "swapab_tma": re.compile(r"^swapabtma_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
    "gemv": re.compile(r"^gemv_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
}


def config_from_id(cid: str) -> GemmConfig:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == "cublas":
        return VendorConfig()
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: GemmConfig) -> dict:
    """Numeric parameters of any config under the uniform names of PARAM_NAMES (0 = n/a)."""
    names = {f.name for f in fields(cfg)}
    out = {p: getattr(cfg, p) if p in names else 0 for p in PARAM_NAMES}
    if isinstance(cfg, (TiledConfig, PersistentConfig)):
        out["split_k"] = 1
    if isinstance(cfg, (SplitKConfig, SwapABConfig, GemvConfig)):
        out["group_m"] = 1
    return out


def smem_bytes(cfg: GemmConfig, dtype: str) -> int:
    """Shared memory a config needs: the pipelined A and B tiles, plus the TMA store tile."""
    if isinstance(cfg, VendorConfig):
        return 0
    e = DTYPE_BYTES[dtype]
    if isinstance(cfg, GemvConfig):
        return 0  # registers only: the weight tiles are used once, straight from the loads
    total = cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * e
    if isinstance(cfg, PersistentConfig):
        total += cfg.block_m * cfg.block_n * DTYPE_BYTES[OUT_DTYPE[dtype]]
    return total


def static_feasible(cfg: GemmConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: shared memory, registers, instruction shapes."""
    if isinstance(cfg, VendorConfig):
        return True, ""
    if isinstance(cfg, (PersistentConfig, SwapABTmaConfig)) and not arch.has_tma:
        return False, f"{cfg.variant} (TMA) needs an arch with TMA"
    if isinstance(cfg, GemvConfig):
        return _gemv_static(cfg, arch, dtype)
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    acc_per_thread = cfg.block_m * cfg.block_n // (cfg.num_warps * 32)
    if acc_per_thread > arch.max_acc_per_thread:
        return False, f"{acc_per_thread} accumulator registers per thread would spill"
    if dtype == "fp8" and cfg.block_k < 32:
        return False, "fp8 dot needs block_k >= 32"
    # wgmma needs a warpgroup per 64 rows; 8 warps on a 16- or 32-row tile idle half of them.
    if cfg.num_warps == 8 and cfg.block_m * cfg.block_n < 64 * 64:
        return False, "8 warps on a tile smaller than 64x64"
    return True, ""


# Registers a GEMV thread may hold live: its fp32 accumulators plus the weight tiles in flight (as
# loaded: 2 bytes an element in bf16/fp16, 1 in fp8), below the 255 a thread can address, with room
# for the addresses, x and the loop.
GEMV_MAX_LIVE_REGS = 192


def _gemv_static(cfg: GemvConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    # Each thread holds BLOCK_M x (its share of the BLOCK_N x BLOCK_K tile) fp32 accumulators
    # until the final reduction, and should load at least one 16-byte vector of weight per step.
    per_thread = cfg.block_n * cfg.block_k // (cfg.num_warps * 32)
    if cfg.block_m * per_thread > arch.max_acc_per_thread:
        return False, f"{cfg.block_m * per_thread} accumulator registers per thread would spill"
    if per_thread * DTYPE_BYTES[dtype] < 16:
        return False, f"{per_thread * DTYPE_BYTES[dtype]} weight bytes per thread per step < one 16-byte load"
    live = cfg.block_m * per_thread + cfg.num_stages * per_thread * DTYPE_BYTES[dtype] // 4
    if live > GEMV_MAX_LIVE_REGS:
        return False, f"{live} live registers per thread (accumulators + tiles in flight) > {GEMV_MAX_LIVE_REGS}"
    return True, ""


# The sm_90 search space. Chosen around the Hopper wgmma shapes: tiles of
# 64/128 rows for compute-bound work, 16/32 rows for decode, split-K up to 16.
# Swap-AB (decode only): 64 weight rows per tile (the wgmma M side); its token
# count is tied to M by check_feasible. Chosen from a 288-config exploration on
# the 40 decode shapes of the foundation suite (benchmarks/explore/explore_swapab.py):
# 128 weight rows, 8 tokens or BLOCK_K 64-only added < 0.1%.
SWAPAB_TOKENS = (16, 32, 64)
SWAPAB_MAX_M = SWAPAB_TOKENS[-1]
# GEMV (M <= 4): token rows 1, 2 or 4.
# The first grid (rows 1-2, one tile in flight): tiles from benchmarks/explore/explore_gemv.py,
# 1-16 weight rows by 512-2048 of K; a split of K (4) only for the few shapes whose N alone cannot
# fill the SMs (no split was ever the best at M = 1-2 on the 94 training shapes with N >= 512).
# A 4-row GEMV of that grid lost every M = 3-4 evaluation shape to swap-AB on the H100 (0.33-0.93x;
# benchmarks/results/gemv/README.md), so 4 rows come only with the deeper loop below.
# The space serves 1-2 rows until the 4-row configs below are measured on a card (the kernel takes 4).
GEMV_ROWS = (1, 2, 4)
GEMV_MAX_M = GEMV_ROWS[-1]
# Issue 63 (the H200: the GEMV at about 0.79 of the copy bandwidth, Inductor's reduction faster on 3
# of 5 held-out M = 1 weights), a targeted few per token-row count:
# - 2 or 4 weight tiles in flight per thread (num_stages: the loop unrolled), on the first grid's
#   winning tiles (2-8 rows by 512-1024 of K): more bytes in flight per SM, for a bandwidth-latency
#   product 1.4x the H100's, without the accumulators of a longer BLOCK_K;
# - Inductor's own shape of the M = 1 reduction (torch/_inductor/runtime/triton_heuristics.py,
#   _reduction_configs: XBLOCK 1-2 rows by R0_BLOCK min(K, 2048), num_warps R0_BLOCK // 128 = 16,
#   then coordinate descent doubles or halves each): 1-2 rows by 2048-4096 of K with 16 warps, the
#   ones with a 16-byte load per thread.
GEMV_DEEP = dict(block_m=(1, 2, 4), block_n=(2, 4, 8), block_k=(512, 1024), split_k=(1,),
                 warps_stages=((4, 2), (4, 4), (8, 4)))
GEMV_WIDE = dict(block_m=(1, 2, 4), block_n=(1, 2), block_k=(2048, 4096), split_k=(1,),
                 warps_stages=((16, 1),))
# Deeper pipelines for mid M (issue 63; issue 18's open loss 128x4096x14336, where Inductor's 5-stage
# 64x64x128 template beat cuBLAS and every config of the space by 5-7%): the tiles that won or came
# within 6% of cuBLAS with 5-6 stages on the 18 mid-M shapes of benchmarks/explore/deep_stages.py
# (benchmarks/results/peers/deep_stages/: persistent 64x64x128 s6 46.3 us on 128x4096x14336 against
# the space's best 48.2+; tiled 64x32x128 s6 and 64x64x128 s6, persistent 128x128x64 s6 the next
# best on six more). Static feasibility (shared memory) is smem_bytes's: 6 stages of 64x64x128
# bf16 take 192 KiB, of 128x128x64 192 KiB plus the 32 KiB TMA store tile, under the 227 KiB.
TILED_DEEP = dict(block_m=(64,), block_n=(32, 64), block_k=(128,), group_m=(8,), warps_stages=((4, 5), (4, 6)))
PERSISTENT_DEEP = (dict(block_m=(64,), block_n=(64,), block_k=(128,), group_m=(8,), warps_stages=((4, 5), (4, 6))),
                   dict(block_m=(128,), block_n=(128,), block_k=(64,), group_m=(8,), warps_stages=((4, 6),)))
# The first grid of each variant, as the first shards measured it.
_BASE_SM90 = {
    "tiled": dict(block_m=(16, 32, 64, 128), block_n=(32, 64, 128, 256), block_k=(64, 128),
                  group_m=(8,), warps_stages=((4, 3), (4, 4), (8, 3), (8, 4))),
    "splitk": dict(block_m=(16, 32, 64), block_n=(32, 64, 128), block_k=(64, 128, 256),
                   split_k=(2, 4, 8, 16), warps_stages=((4, 3), (4, 4))),
    "persistent": dict(block_m=(64, 128), block_n=(64, 128, 256), block_k=(64, 128),
                       group_m=(8,), warps_stages=((4, 3), (4, 4), (8, 3), (8, 4))),
    "swapab": dict(block_m=SWAPAB_TOKENS, block_n=(64,), block_k=(64, 128, 256), split_k=(1, 2, 4, 8),
                   warps_stages=((4, 3), (4, 4), (4, 6))),
    "swapab_tma": dict(block_m=SWAPAB_TOKENS, block_n=(64,), block_k=(64, 128, 256), split_k=(1, 2, 4, 8),
                       warps_stages=((4, 3), (4, 4), (4, 6))),
    "gemv": dict(block_m=(1, 2), block_n=(1, 2, 4, 8, 16), block_k=(512, 1024, 2048), split_k=(1, 4),
                 warps_stages=((4, 1), (8, 1))),
}
# Grids added to existing variants later, by the generation (issue) that added them. They joined
# the space with their H200 rows (benchmarks/campaigns/dense-decode-h200.txt; docs/decisions/067).
# The harness samples each generation on a random stream of its own (config_generation), so the
# committed training shards' samples, drawn before, stay what they were.
LATER_GRIDS_SM90 = {"63": {"tiled": (TILED_DEEP,), "persistent": PERSISTENT_DEEP, "gemv": (GEMV_DEEP, GEMV_WIDE)}}
# Grids defined but not measured on any card yet (they would be ranked blind): none now.
PENDING_SM90: dict = {}
_SPACE_SM90 = {v: (grid, *(g for later in LATER_GRIDS_SM90.values() for g in later.get(v, ())))
               for v, grid in _BASE_SM90.items()}


def _generations() -> dict:
    base = {c for v, grid in _BASE_SM90.items() for c in _enumerate(v, grid)}
    out = {}
    for tag, grids in LATER_GRIDS_SM90.items():
        for v, gs in grids.items():
            for g in gs:
                for cfg in _enumerate(v, g):
                    if cfg not in base:
                        out.setdefault(cfg.id, tag)
    return out


_GENERATION: dict = {}


def config_generation(cfg: GemmConfig) -> str:
    """"" for a config of its variant's first grid, else the tag of the LATER_GRIDS_SM90 generation
    that added it."""
    if not _GENERATION:
        _GENERATION.update(_generations() or {"": ""})
    return _GENERATION.get(cfg.id, "")


def swapab_tokens(m: int) -> int:
    """The swap-AB tile's token count for M: the smallest of SWAPAB_TOKENS >= M, so one
    tile column covers every token and the weight is read once."""
    return next((t for t in SWAPAB_TOKENS if t >= m), 0)


def gemv_rows(m: int) -> int:
    """The GEMV's token rows for M: the smallest of GEMV_ROWS >= M (0: M is too large)."""
    return next((r for r in GEMV_ROWS if r >= m), 0)


def _enumerate(variant: str, space) -> Iterator[GemmConfig]:
    """A variant's configs: the product of its parameter tuples (or of each of several such
    grids, in order, a config listed once)."""
    if isinstance(space, tuple):
        seen = set()
        for grid in space:
            for cfg in _enumerate(variant, grid):
                if cfg not in seen:
                    seen.add(cfg)
                    yield cfg
        return
    cls = VARIANTS[variant]
    ws = space["warps_stages"]
    keys = [k for k in space if k != "warps_stages"]
    for combo in itertools.product(*(space[k] for k in keys)):
        for w, s in ws:
            yield cls(**dict(zip(keys, combo)), num_warps=w, num_stages=s)


def generate_configs(arch: str = "sm90", dtype: str = "bf16", include_vendor: bool = True) -> list[GemmConfig]:
    """All statically feasible candidates for (arch, dtype), in a stable order."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    out: list[GemmConfig] = []
    for variant, space in _SPACE_SM90.items():
        for cfg in _enumerate(variant, space):
            if static_feasible(cfg, spec, dtype)[0]:
                out.append(cfg)
    if include_vendor and dtype != "fp32":
        out.append(VendorConfig())
    return out


def pending_configs(arch: str = "sm90", dtype: str = "bf16") -> list[GemmConfig]:
    """The statically feasible configs of PENDING_SM90 that the space does not hold yet (what the
    decode benchmark times beside the space's, and what the H200 campaign measures)."""
    have = set(generate_configs(arch, dtype, include_vendor=False))
    out: list[GemmConfig] = []
    for variant, grids in PENDING_SM90.items():
        for grid in (grids if isinstance(grids, tuple) else (grids,)):
            for cfg in _enumerate(variant, grid):
                if cfg not in have and static_feasible(cfg, ARCHS[arch], dtype)[0]:
                    have.add(cfg)
                    out.append(cfg)
    return out


# Split-K partials are fp32 (SPLIT_K, M, N); above this they cost more memory
# traffic than they save and may not fit next to a serving engine's KV cache.
SPLITK_WORKSPACE_LIMIT = 256 * 1024 * 1024


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns): what the
    per-problem rules below are evaluated on, for one config or a whole space at once."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.persistent = variants == "persistent"
        self.splitk = variants == "splitk"
        self.swapab_tma = variants == "swapab_tma"
        self.swapab = (variants == "swapab") | self.swapab_tma  # either swap-AB kernel
        self.gemv = variants == "gemv"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)
        # Problem-independent parts of the rules, computed once (the runtime applies them per decision):
        # each rule is then at most one numpy call per problem (issue 18: the cold decision).
        self.split = self.splitk | ((self.swapab | self.gemv) & (self.params["split_k"] > 1))
        self.block_k = np.maximum(self.params["block_k"], 1)
        self.split_short_k, self.split_sk = split_rule_arrays(self.split, self.params["split_k"], self.block_k)
        # A GEMV with several tiles in flight needs K to hold that many (else it is its own one-tile config).
        self.gemv_span = np.where(self.gemv & (self.params["num_stages"] > 1),
                                  self.params["num_stages"] * self.block_k, 0)
        # The token-count rules' masks, one per value that swapab_tokens / gemv_rows can return.
        self.swapab_mismatch = token_mismatch(self.swapab, self.params["block_m"], SWAPAB_TOKENS)
        self.gemv_mismatch = token_mismatch(self.gemv, self.params["block_m"], GEMV_ROWS)


def split_rule_arrays(split, split_k, block_k):
    """(short_k, sk) for the split-K rules of a space, as one comparison per problem each:
    ceil(K / block_k) < split_k  <=>  K <= (split_k - 1) * block_k  =  short_k (0 on rows that do
    not split), and split_k * M * N * 4 > limit  <=>  sk > limit // (M * N * 4) with sk = split_k
    (0 on rows that do not split); both exact for positive ints, and the second never forms the
    int64 product of the problem's sizes (which wraps for M * N near 2**60)."""
    import numpy as np

    return np.where(split, (split_k - 1) * block_k, 0), np.where(split, split_k, 0)


def token_mismatch(flag, block_m, counts) -> dict:
    """{count: flag & (block_m != count)} for every count a token rule can ask (``counts`` and
    0, the 'too large' answer): the rule looks its mask up instead of computing it per problem."""
    return {t: flag & (block_m != t) for t in (*counts, 0)}


# The per-problem feasibility rules, the ONE source of them: (applies(problem) -> bool,
# violated(arrays, problem) -> bool array, reason(problem, params of one config) -> str).
# ``problem_mask`` applies them to a whole space at once (the runtime), ``check_feasible``
# to one config (its reason is the first violated rule's). ``applies`` is the rule's
# problem-only condition, so that most rules cost nothing on most shapes.
# Problem-independent limits are ``static_feasible``'s.
_E = DTYPE_BYTES
PROBLEM_RULES = (
    (lambda p: p.dtype == "fp8" and bool(p.k % 16 or p.n % 16),
     lambda a, p: a.vendor,
     lambda p, c: "torch._scaled_mm needs K and N divisible by 16"),
    (lambda p: p.dtype == "fp32",
     lambda a, p: a.vendor,
     lambda p, c: "vendor candidate is for bf16/fp16/fp8"),
    # TMA descriptors need 16-byte aligned row strides for x, w and y.
    (lambda p: bool((p.k * _E[p.dtype]) % 16),
     lambda a, p: a.persistent,
     lambda p, c: "TMA needs K * element size divisible by 16"),
    (lambda p: bool((p.n * _E[OUT_DTYPE[p.dtype]]) % 16),
     lambda a, p: a.persistent,
     lambda p, c: "TMA needs N * output element size divisible by 16"),
    (lambda p: p.m > SWAPAB_MAX_M,
     lambda a, p: a.swapab,
     lambda p, c: f"swap-AB is a decode kernel: M={p.m} > {SWAPAB_MAX_M}"),
    # One tile column covers every token: the one token count that covers M.
    (lambda p: True,
     lambda a, p: a.swapab_mismatch[swapab_tokens(p.m)],
     lambda p, c: f"swap-AB tile has {c['block_m']} tokens; M={p.m} takes {swapab_tokens(p.m)}"),
    (lambda p: p.m > GEMV_MAX_M,
     lambda a, p: a.gemv,
     lambda p, c: f"GEMV is for M <= {GEMV_MAX_M}: M={p.m}"),
    (lambda p: True,
     lambda a, p: a.gemv_mismatch[gemv_rows(p.m)],
     lambda p, c: f"GEMV computes {c['block_m']} token rows; M={p.m} takes {gemv_rows(p.m)}"),
    (lambda p: True,
     lambda a, p: a.gemv_span > p.k,
     lambda p, c: f"GEMV with {c['num_stages']} tiles in flight of {c['block_k']} needs K >= "
                  f"{c['num_stages'] * c['block_k']}, K={p.k}"),
    (lambda p: bool((p.k * _E[p.dtype]) % 16),
     lambda a, p: a.swapab_tma,
     lambda p, c: "TMA needs K * element size divisible by 16"),
    (lambda p: True,
     lambda a, p: a.split_short_k >= p.k,  # ceil(K / block_k) < split_k (split_rule_arrays)
     lambda p, c: f"K={p.k} has {-(-p.k // c['block_k'])} k-tiles < split_k={c['split_k']}"),
    (lambda p: True,
     lambda a, p: a.split_sk > SPLITK_WORKSPACE_LIMIT // (p.m * p.n * 4),  # split_k * M * N * 4 > limit
     lambda p, c: "split-K workspace above limit"),
)


# The three are the same for every op (space_common.feasibility): the static rules, then the
# per-problem rule list, over a whole space (problem_mask) or one config (check_feasible).
problem_mask, check_feasible, feasible_configs = feasibility(globals())


