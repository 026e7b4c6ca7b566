"""Config space of the grouped-GEMM op ``grouped_gemm`` (MoE training's expert GEMMs), as data
(torch-free).

G groups (the local experts), each with its own weight W_g (N, K) and its own contiguous range of
the M routed tokens (group sizes from a routing of ``kernels/moe/routing.py``; empty groups
included). One problem is one *pass* of a layer's expert GEMM, named by ``stage``:

- ``fwd``:   y_g  = x_g @ W_g^T    x (M, K), W (G, N, K) -> y (M, N)
- ``dgrad``: dx_g = dy_g @ W_g     dy (M, N), W (G, N, K) -> dx (M, K)
- ``wgrad``: dW_g = dy_g^T @ x_g   dy (M, N), x (M, K)    -> dW (G, N, K), reduced over each
  group's own tokens (an empty group's dW_g is zeros)

The pass is the problem field ``stage`` (the shared dataset, store keys and runtime already carry
a multi-pass op's pass under that name, as for MoE's gate_up/down); top_k is pinned to 1 (the
tokens arrive already permuted expert-contiguous, one row per token-expert pair).

Every config is a kernel that runs all three passes (the runtime's feasibility mask sees M, N, K
and the dtype only, so no config may be specific to one pass). A config's tile is uniform across
passes: ``block_m`` x ``block_n`` outputs, ``block_k`` deep along the reduction:

- fwd:   rows = tokens, cols = N, reduction = K;
- dgrad: rows = tokens, cols = K, reduction = N;
- wgrad: rows = N,      cols = K, reduction = the group's tokens.

Variants (the shared VARIANT_CODES names):
- ``tiled`` (``GgTiledConfig``): one program per output tile over a tile schedule across the
  groups (fwd/dgrad: every group's row tiles concatenated, then grouped order with ``group_m``;
  the group of a tile is found on the device from the offsets), idle programs of the worst-case
  grid exit at once;
- ``persistent`` (``GgPersistentConfig``): a fixed grid of one program per SM looping over the
  same tile schedule;
- ``splitk`` (``GgSplitKConfig``): ``split_k`` programs per output tile, each over a slice of the
  reduction (wgrad: of each group's token range), fp32 partials added atomically into a zeroed
  buffer, then cast;
- ``vendor`` (``grouped_mm``): ``torch._grouped_mm`` (bf16, sm90).

dtypes: bf16 (the op); fp16/fp32 exist only for the Triton CPU interpreter tests (it computes
garbage for bf16 dots).
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import ClassVar, Union

from ..moe import routing as R
from ..space_common import (ARCHS, PARAM_NAMES, ArchSpec, VendorConfig, check_dims, feasibility,  # noqa: F401
                            first_violation, param_arrays, parse_config_id, rules_mask, space_hash,
                            uniform_params)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DTYPES = tuple(DTYPE_BYTES)
STAGES = ("fwd", "dgrad", "wgrad")
MAX_GROUPS = 512


@dataclass(frozen=True)
class Problem:
    """One pass of a grouped GEMM: M routed tokens over E groups of W (E, N, K); ``stage`` is the
    pass (fwd, dgrad, wgrad), ``routing`` the group-size histogram (routing.expert_counts with
    top_k 1)."""

    m: int
    n: int
    k: int
    dtype: str
    e: int
    stage: str
    routing: str = "balanced"
    DTYPES: ClassVar[tuple] = DTYPES

    def __post_init__(self):
        check_dims(self, self.DTYPES)
        if isinstance(self.e, bool) or not isinstance(self.e, int):
            raise ValueError(f"e must be an int, got {type(self.e).__name__}")
        if not 1 <= self.e <= MAX_GROUPS:
            raise ValueError(f"e must be in 1..{MAX_GROUPS}, got {self.e}")
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        R.check_routing(self.routing)

    @property
    def key(self) -> str:
        return f"{self.dtype}:{self.m}x{self.n}x{self.k}:g{self.e}:{self.stage}:{self.routing}"

    def counts(self):
        """Tokens per group (E,) of this problem's routing (read-only int64 array)."""
        return R.expert_counts(self.routing, self.m, self.e, 1)

    @property
    def out_shape(self) -> tuple:
        return {"fwd": (self.m, self.n), "dgrad": (self.m, self.k), "wgrad": (self.e, self.n, self.k)}[self.stage]

    @property
    def tile_dims(self) -> tuple[int, int]:
        """(rows, cols) of the output tiles' index space per group: (tokens, N | K) or (N, K)."""
        return {"fwd": (self.m, self.n), "dgrad": (self.m, self.k), "wgrad": (self.n, self.k)}[self.stage]

    @property
    def reduction(self) -> int:
        """The reduction length: K (fwd), N (dgrad), or the mean tokens per group (wgrad)."""
        return {"fwd": self.k, "dgrad": self.n, "wgrad": self.m / self.e}[self.stage]


@dataclass(frozen=True)
class GgTiledConfig:
    """One program per output tile, grouped order over the tile schedule of all groups."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return f"gg_m{self.block_m}n{self.block_n}k{self.block_k}_g{self.group_m}_w{self.num_warps}s{self.num_stages}"


@dataclass(frozen=True)
class GgPersistentConfig:
    """One program per SM, each looping over the tile schedule (stride = the grid)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "persistent"

    @property
    def id(self) -> str:
        return (f"ggpers_m{self.block_m}n{self.block_n}k{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class GgSplitKConfig:
    """``split_k`` programs per output tile over slices of the reduction, fp32 atomics."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "splitk"

    @property
    def id(self) -> str:
        return (f"ggsplit_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.split_k}"
                f"_w{self.num_warps}s{self.num_stages}")


VENDOR = VendorConfig("grouped_mm")
GgConfig = Union[GgTiledConfig, GgPersistentConfig, GgSplitKConfig, VendorConfig]
VARIANTS = {"tiled": GgTiledConfig, "persistent": GgPersistentConfig, "splitk": GgSplitKConfig,
            "vendor": VendorConfig}
_ID_RE = {"tiled": re.compile(r"^gg_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
          "persistent": re.compile(r"^ggpers_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
          "splitk": re.compile(r"^ggsplit_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$")}


def config_from_id(cid: str) -> GgConfig:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == VENDOR.id:
        return VENDOR
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: GgConfig) -> dict:
    """Numeric parameters under the shared uniform names (PARAM_NAMES; 0 = n/a)."""
    out = uniform_params(cfg, PARAM_NAMES)
    if isinstance(cfg, VendorConfig):
        return out
    if isinstance(cfg, GgSplitKConfig):
        out["group_m"] = 1
    return out


# -- the space ------------------------------------------------------------------------------
# Kept small (every candidate of every problem is measured; docs/ops/grouped_gemm.md): the
# Hopper bf16 tiles that matter at training scale, (block_m, block_n, block_k, num_warps). 64-row
# tiles for the few-token groups of fwd/dgrad (a skewed routing's tail), 128 x 256 and 256 x 128
# for the large ones, 128-deep K for the short-N/K passes.
TILES = ((64, 128, 64, 4), (128, 64, 64, 4), (128, 128, 64, 4), (128, 128, 64, 8), (128, 256, 64, 8),
         (256, 128, 64, 8), (128, 128, 128, 8))
STAGES_GRID = (3, 4)
TILED_GROUP_M = (1, 8)
PERSISTENT_GROUP_M = (8,)
# Split of the reduction: for wgrad with few tokens per program's tile column... and the few-tile
# problems (small N, K) where the grid would otherwise underfill the SMs.
SPLITK_TILES = ((64, 128, 64, 4), (128, 128, 64, 4), (128, 128, 64, 8))
SPLITK_SPLITS = (2, 4)
SPLITK_STAGES = (3,)


def _enumerate() -> list[GgConfig]:
    out: list[GgConfig] = []
    for (bm, bn, bk, w), s, g in itertools.product(TILES, STAGES_GRID, TILED_GROUP_M):
        out.append(GgTiledConfig(bm, bn, bk, g, w, s))
    for (bm, bn, bk, w), s, g in itertools.product(TILES, STAGES_GRID, PERSISTENT_GROUP_M):
        out.append(GgPersistentConfig(bm, bn, bk, g, w, s))
    for (bm, bn, bk, w), sk, s in itertools.product(SPLITK_TILES, SPLITK_SPLITS, SPLITK_STAGES):
        out.append(GgSplitKConfig(bm, bn, bk, sk, w, s))
    return list(dict.fromkeys(out))


# -- feasibility ---------------------------------------------------------------------------

def smem_bytes(cfg: GgConfig, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles."""
    if isinstance(cfg, VendorConfig):
        return 0
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype]


def static_feasible(cfg: GgConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: the vendor's dtype, shared memory, accumulator registers."""
    if isinstance(cfg, VendorConfig):
        if dtype != "bf16":
            return False, "the vendor candidate (torch._grouped_mm) is bf16-only"
        return True, ""
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    acc = cfg.block_m * cfg.block_n // (cfg.num_warps * 32)
    if acc > arch.max_acc_per_thread:
        return False, f"{acc} accumulator registers per thread would spill"
    return True, ""


def generate_configs(arch: str = "sm90", dtype: str = "bf16", include_vendor: bool = True) -> list[GgConfig]:
    """All statically feasible candidates for (arch, dtype), in a stable order (the vendor last
    when ``include_vendor``)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    # torch._grouped_mm's bf16 fast path (CUTLASS grouped GEMM) is sm90+; elsewhere it copies offs
    # to the host per call (not capturable) or refuses.
    out = _enumerate() + ([VENDOR] if include_vendor and spec.name == "sm90" else [])
    return [c for c in out if static_feasible(c, spec, dtype)[0]]


# torch._grouped_mm needs 16-byte strides of both operands in every pass: fwd reads x (K-strided
# rows), dgrad dy (N) and W (K), wgrad dy^T (N) and x (K): N and K multiples of 8 in bf16.
VENDOR_ALIGN = 8
# Split-K partials go to a zeroed fp32 buffer of the output's size: a reduction shorter than this
# many of the config's K tiles per slice is not split (each slice would be mostly its epilogue).
SPLITK_MIN_TILES_PER_SLICE = 2


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.splitk = variants == "splitk"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)
        # The shortest reduction (in elements) a split config still splits: SPLIT_K slices of
        # SPLITK_MIN_TILES_PER_SLICE K tiles each (0 for the others: no rule).
        self.split_min_red = np.where(self.splitk, self.params["split_k"] * self.params["block_k"]
                                      * SPLITK_MIN_TILES_PER_SLICE, 0)


# (applies(problem), violated(arrays, problem), reason(problem, params)). The rules read M, N, K
# and the dtype only: the runtime's mask sees nothing else. Every Triton kernel masks every
# dimension and runs any problem and any routing.
PROBLEM_RULES = (
    (lambda p: bool(p.k % VENDOR_ALIGN or p.n % VENDOR_ALIGN),
     lambda a, p: a.vendor,
     lambda p, c: f"torch._grouped_mm needs N and K divisible by {VENDOR_ALIGN} (16-byte strides)"),
    # A split of the reduction needs a reduction to split in every pass: fwd's K, dgrad's N and
    # wgrad's tokens (M over the groups: at least M / E, bounded here by M alone, as E is not
    # seen), each at least SPLIT_K slices of two K tiles.
    (lambda p: True,
     lambda a, p: a.split_min_red > min(p.m, p.n, p.k),
     lambda p, c: (f"split_k={c['split_k']} x block_k={c['block_k']} x {SPLITK_MIN_TILES_PER_SLICE} is more than "
                   f"the shortest reduction min(M, N, K) = {min(p.m, p.n, p.k)}")),
)


# The three are the same for every op (space_common.feasibility): the static rules, then the
# per-problem rule list, over a whole space (problem_mask) or one config (check_feasible).
problem_mask, check_feasible, feasible_configs = feasibility(globals())


# -- the fallback rule -----------------------------------------------------------------------

DEFAULT_CONFIG = GgPersistentConfig(128, 128, 64, 8, 8, 4)


def _ideal(m: int, n: int, k: int, sm_count: int, e: int | None = None, stage: str | None = None) -> dict:
    """The config a rule of thumb runs: 128 x 128 x 64 tiles on 8 warps, 4 stages, persistent over
    the SMs when the tiles fill several waves; 64-row tiles when fwd/dgrad groups hold few tokens
    (< 128 on average); 128 x 256 when there are many tiles per SM."""
    rows, cols = (n, k) if stage == "wgrad" else (m, k if stage == "dgrad" else n)
    groups = e or 1
    bm, bn, warps = 128, 128, 8
    if stage != "wgrad" and e and m / e < 128:
        bm, warps = 64, 4
    tiles = math.ceil(rows / bm) * math.ceil(cols / bn) * (groups if stage == "wgrad" else 1)
    if bm == 128 and tiles >= 8 * sm_count and cols >= 256:
        bn = 256
        tiles = math.ceil(rows / bm) * math.ceil(cols / bn) * (groups if stage == "wgrad" else 1)
    variant = "persistent" if tiles >= 2 * sm_count else "tiled"
    return dict(variant=variant, block_m=bm, block_n=bn, block_k=64, group_m=8, split_k=1, num_warps=warps,
                num_stages=4 if bn == 128 else 3)


def _nearest(want: dict, candidates: list[dict]) -> int:
    def dist(c: dict) -> float:
        d = 0.0 if c["variant"] == want["variant"] else (50.0 if c["variant"] != "vendor" else 1e6)
        for p in ("block_m", "block_n", "block_k", "split_k", "group_m"):
            d += abs(math.log2(max(c[p], 1)) - math.log2(max(want[p], 1))) * (0.2 if p == "group_m" else 1.0)
        return d + 0.1 * (c["num_warps"] != want["num_warps"]) + 0.1 * (c["num_stages"] != want["num_stages"])

    return min(range(len(candidates)), key=lambda i: (dist(candidates[i]), i))


def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict], e: int | None = None,
           top_k: int = 1, stage: str | None = None, **_) -> int:
    """The runtime's rule without a model (signature of serving.heuristic.choose; the runtime passes
    no E or pass for an op that pins top_k): index into ``candidates`` (dicts with 'variant' and
    PARAM_NAMES) of the one nearest ``_ideal``."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    return _nearest(_ideal(m, n, k, sm_count, e, stage), candidates)


def choose_problem(problem: Problem, sm_count: int = 132, arch: str = "sm90", include_vendor: bool = False) -> str:
    """The fallback pick for a whole Problem (E and the pass known): the config id the torch op runs
    without a model. The vendor is left out by default: the rule is about the Triton kernels."""
    feas = feasible_configs(problem, arch, include_vendor)
    cands = [{"variant": c.variant, **config_params(c)} for c in feas]
    return feas[_nearest(_ideal(problem.m, problem.n, problem.k, sm_count, problem.e, problem.stage), cands)].id


# -- precompile (benchmarks/precompile.py asks the space module of a problem's op) -----------

# The largest block_k: EVEN_K (fwd: K % block_k == 0, dgrad: N % block_k) is a constexpr.
_K_ALIGN = 128


def specialisation(p: Problem) -> tuple:
    """What the kernels compile per, besides the config: the pass, the dtype, N and K modulo the
    largest block_k (Triton specialises the integer arguments and strides on divisibility by 16;
    EVEN_K on block_k), and the padded group count (a constexpr of the tile schedule; M and G
    themselves are not specialised on)."""
    return (p.dtype, p.stage, p.n % _K_ALIGN, p.k % _K_ALIGN, _pad_groups(p.e))


def _pad_groups(e: int) -> int:
    return max(16, 1 << (e - 1).bit_length())


def probe_problem(p: Problem) -> Problem:
    """A small problem compiling to the same kernels as p: N and K congruent modulo the largest
    block_k, the same E (padded group count), pass and dtype."""
    return Problem(3, _K_ALIGN + p.n % _K_ALIGN, _K_ALIGN + p.k % _K_ALIGN, p.dtype, p.e, p.stage, "balanced")
