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
- ``vendor`` (``grouped_mm``): ``torch._grouped_mm`` (bf16, sm90);
- ``persistent_tma`` (``GgPersistentTmaConfig``, pending: out of the served space until measured,
  ``PENDING_SM90``): the persistent schedule with every operand loaded, and the output stored,
  through TMA tensor descriptors made on the device (per tile where a ragged group's rows end:
  the output's rows in fwd/dgrad, the tokens in wgrad; W and dW as 3-D descriptors, one per
  program).

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


@dataclass(frozen=True)
class GgPersistentTmaConfig:
    """The persistent schedule (one program per SM) with TMA loads and stores through tensor
    descriptors made on the device (sm90)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "persistent_tma"

    @property
    def id(self) -> str:
        return (f"ggptma_m{self.block_m}n{self.block_n}k{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}s{self.num_stages}")


VENDOR = VendorConfig("grouped_mm")
GgConfig = Union[GgTiledConfig, GgPersistentConfig, GgSplitKConfig, GgPersistentTmaConfig, VendorConfig]
VARIANTS = {"tiled": GgTiledConfig, "persistent": GgPersistentConfig, "splitk": GgSplitKConfig,
            "persistent_tma": GgPersistentTmaConfig, "vendor": VendorConfig}
_ID_RE = {"tiled": re.compile(r"^gg_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
          "persistent": re.compile(r"^ggpers_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
          "splitk": re.compile(r"^ggsplit_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
          "persistent_tma": re.compile(r"^ggptma_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$")}


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
# The first grid of each variant, as the first H200 sweep measured it (issue 60).
_BASE_SM90 = {"tiled": dict(tiles=TILES, stages=STAGES_GRID, group_m=TILED_GROUP_M),
              "persistent": dict(tiles=TILES, stages=STAGES_GRID, group_m=PERSISTENT_GROUP_M),
              "splitk": dict(tiles=SPLITK_TILES, split_k=SPLITK_SPLITS, stages=SPLITK_STAGES)}
# TMA (issue 60: our dgrad ran at 0.96-1.01x and wgrad at 0.94-0.97x of torch._grouped_mm with
# pointer loads): the persistent variant's tiles, stages and order, every operand through tensor
# descriptors, so the two variants compare tile for tile. Shared memory adds the output tile the
# TMA store stages (static_feasible): 128 x 256 and 256 x 128 fit 3 stages only, 128 x 128 x 128
# 3 stages (224 KiB, as the dense op's 6-stage persistent tile, which ran on the H200).
TMA_GRID = dict(tiles=TILES, stages=STAGES_GRID, group_m=PERSISTENT_GROUP_M)
# Grids added to the space after the first sweep, by the generation (issue) that added them: the
# harness samples each on a random stream of its own (config_generation), so the committed
# training shards' samples stay what they were, and an evaluation problem measured before a
# generation existed is complete without it (dataset.demote_incomplete_eval_shapes). None yet.
LATER_GRIDS_SM90: dict = {}
# Grids defined but not measured on any card yet, out of the space (a model would rank them blind,
# and growing the space changes its hash: the runtime would refuse the shipped model). The harness's
# 'variant:persistent_tma' mode measures them (benchmarks/campaigns/grouped-gemm-tma-h200.txt); they
# move to LATER_GRIDS_SM90 under the same tag in the commit that brings their rows and the retrained
# model.
PENDING_SM90 = {"60-tma": {"persistent_tma": TMA_GRID}}


def _grid_configs(variant: str, grid: dict) -> list[GgConfig]:
    cls = VARIANTS[variant]
    if variant == "splitk":
        return [cls(bm, bn, bk, sk, w, s)
                for (bm, bn, bk, w), sk, s in itertools.product(grid["tiles"], grid["split_k"], grid["stages"])]
    return [cls(bm, bn, bk, g, w, s)
            for (bm, bn, bk, w), s, g in itertools.product(grid["tiles"], grid["stages"], grid["group_m"])]


def _enumerate(grids=None) -> list[GgConfig]:
    """The configs of the first grids, then of each later generation (a config listed once)."""
    out: list[GgConfig] = []
    for variant, grid in _BASE_SM90.items():
        out += _grid_configs(variant, grid)
    for later in (LATER_GRIDS_SM90 if grids is None else grids).values():
        for variant, grid in later.items():
            out += _grid_configs(variant, grid)
    return list(dict.fromkeys(out))


def _generations() -> dict:
    base = {c for v, grid in _BASE_SM90.items() for c in _grid_configs(v, grid)}
    out: dict = {}
    for tag, grids in (*LATER_GRIDS_SM90.items(), *PENDING_SM90.items()):
        for variant, grid in grids.items():
            for cfg in _grid_configs(variant, grid):
                if cfg not in base:
                    out.setdefault(cfg.id, tag)
    return out


_GENERATION: dict = {}


def config_generation(cfg: GgConfig) -> str:
    """"" for a config of its variant's first grid (and the vendor), else the tag of the generation
    that added it (LATER_GRIDS_SM90; a pending grid's configs carry the tag they will join under)."""
    if not _GENERATION:
        _GENERATION.update(_generations() or {"": ""})
    return _GENERATION.get(cfg.id, "")


# -- feasibility ---------------------------------------------------------------------------

def smem_bytes(cfg: GgConfig, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles (and of the output tile a TMA store stages)."""
    if isinstance(cfg, VendorConfig):
        return 0
    out = cfg.block_m * cfg.block_n * DTYPE_BYTES[dtype] if isinstance(cfg, GgPersistentTmaConfig) else 0
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype] + out


def static_feasible(cfg: GgConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: the vendor's dtype, TMA on the arch, shared memory,
    accumulator registers."""
    if isinstance(cfg, VendorConfig):
        if dtype != "bf16":
            return False, "the vendor candidate (torch._grouped_mm) is bf16-only"
        return True, ""
    if isinstance(cfg, GgPersistentTmaConfig) and not arch.has_tma:
        return False, f"{arch.name} has no TMA"
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


def pending_configs(arch: str = "sm90", dtype: str = "bf16") -> list[GgConfig]:
    """The statically feasible configs of PENDING_SM90 that the space does not hold yet (what the
    harness's 'variant:' mode measures beside the space's configs of the variants it names)."""
    if arch not in ARCHS or dtype not in DTYPE_BYTES:
        return []
    have = set(generate_configs(arch, dtype, include_vendor=False))
    return [c for c in _enumerate(PENDING_SM90)
            if c not in have and static_feasible(c, ARCHS[arch], dtype)[0]]


# torch._grouped_mm needs 16-byte strides of both operands in every pass: fwd reads x (K-strided
# rows), dgrad dy (N) and W (K), wgrad dy^T (N) and x (K): N and K multiples of 8 in bf16.
VENDOR_ALIGN = 8
# Split-K partials go to a zeroed fp32 buffer of the output's size: a reduction shorter than this
# many of the config's K tiles per slice is not split (each slice would be mostly its epilogue).
SPLITK_MIN_TILES_PER_SLICE = 2
# TMA: global strides (all but the last, contiguous dimension) and base addresses in 16-byte units.
TMA_ALIGN_BYTES = 16


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.splitk = variants == "splitk"
        self.tma = variants == "persistent_tma"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)
        # The shortest reduction (in elements) a split config still splits: SPLIT_K slices of
        # SPLITK_MIN_TILES_PER_SLICE K tiles each (0 for the others: no rule).
        self.split_min_red = np.where(self.splitk, self.params["split_k"] * self.params["block_k"]
                                      * SPLITK_MIN_TILES_PER_SLICE, 0)


# (applies(problem), violated(arrays, problem), reason(problem, params)). The rules read M, N, K
# and the dtype only: the runtime's mask sees nothing else. Every pointer-load Triton kernel masks
# every dimension and runs any problem and any routing; the TMA kernel's descriptors need the rule
# below (ragged groups need none: a descriptor's rows end where its group's do, and TMA zero-fills
# the loads and drops the stores past them).
PROBLEM_RULES = (
    (lambda p: bool(p.k % VENDOR_ALIGN or p.n % VENDOR_ALIGN),
     lambda a, p: a.vendor,
     lambda p, c: f"torch._grouped_mm needs N and K divisible by {VENDOR_ALIGN} (16-byte strides)"),
    # A TMA descriptor's row stride must be a multiple of 16 bytes. Every pass's operands and output
    # are row-major with rows of N or K elements (fwd: x K, W_g K, y N; dgrad: dy N, W_g K, dx K;
    # wgrad: dy N, x K, dW_g K), so N and K times the element size must both be multiples of 16
    # (bf16/fp16: multiples of 8; fp32: of 4). The base pointers' 16-byte alignment is checked at
    # launch (impl.tma_operands_ok), which falls back to the persistent pointer kernel of the same
    # tile for an unaligned view; the box rules (inner box >= 16 bytes, <= 256 elements a side)
    # hold for every tile of TMA_GRID.
    (lambda p: bool((p.n * DTYPE_BYTES[p.dtype]) % TMA_ALIGN_BYTES or (p.k * DTYPE_BYTES[p.dtype]) % TMA_ALIGN_BYTES),
     lambda a, p: a.tma,
     lambda p, c: (f"TMA descriptors need 16-byte row strides: N x {DTYPE_BYTES[p.dtype]} B and K x "
                   f"{DTYPE_BYTES[p.dtype]} B multiples of {TMA_ALIGN_BYTES} (N = {p.n}, K = {p.k})")),
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
