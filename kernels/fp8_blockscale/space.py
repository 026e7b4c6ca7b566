"""Config space of the block-scaled fp8 GEMM op ``fp8_blockscale``, as data (torch-free).

The op (vLLM's ``w8a8_block_fp8_matmul``): y (M, N) bf16 = (A * As) @ (B * Bs).T with
A fp8 e4m3 (M, K), As fp32 (M, ceil(K/128)) per token and 128-wide K group, B fp8 e4m3
(N, K), Bs fp32 (ceil(N/128), ceil(K/128)) per 128x128 weight block. The same module
interface as ``kernels/gemm/space.py``: Problem, config dataclasses with stable ids,
generate_configs, config_from_id, config_params, PARAM_NAMES, ARCHS, ConfigArrays,
PROBLEM_RULES, problem_mask, check_feasible, feasible_configs, space_hash, static_feasible;
plus ``vllm_default()``, ``from_vllm(entry)`` and the fallback rule ``choose``.

The space contains vLLM's default config and every config of vLLM's H100 tuned files
(datasets/vllm/0.33.0/w8a8_block_fp8_configs/, tests/test_fp8_blockscale.py checks it).
dtypes: "fp8" is the op; "fp16"/"fp32" operands (same scale layout) exist only for the
Triton CPU interpreter tests, which compute garbage for fp8/bf16 dots.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, fields
from typing import ClassVar, Union

# The dense op's swap-AB token rules: the block-scaled swap-AB kernel follows them.
from gemm_costmodel.kernels.gemm.space import (SWAPAB_MAX_M, SWAPAB_TOKENS, split_rule_arrays,  # noqa: F401
                                                  swapab_tokens, token_mismatch)

from ..space_common import (ARCHS, PARAM_NAMES, ArchSpec, DenseProblem, VendorConfig, feasibility,  # noqa: F401
                            first_violation, param_arrays, parse_config_id, rules_mask, space_hash)

# The quantisation group: As has one scale per token per GROUP_K columns of K, Bs one per
# GROUP_N x GROUP_K block of B (vLLM's block_shape [128, 128]).
GROUP_N = 128
GROUP_K = 128

DTYPE_BYTES = {"fp8": 1, "fp16": 2, "fp32": 4}
OUT_DTYPE = {"fp8": "bf16", "fp16": "fp16", "fp32": "fp32"}
DTYPES = tuple(DTYPE_BYTES)


class Problem(DenseProblem):
    """One block-scaled GEMM: y (M, N) = (A * As) @ (B * Bs).T, nn.Linear layout."""

    DTYPES = tuple(DTYPE_BYTES)


@dataclass(frozen=True)
class BsTiledConfig:
    """vLLM's kernel: output tiles in grouped order, one As column and one Bs block per K tile.
    The fields are vLLM's JSON keys (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return (f"bstiled_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class BsSplitKConfig:
    """Split-K for decode: SPLIT_K programs per output tile each sum a slice of the K tiles
    (scaled per tile), the last to arrive adds the fp32 partials and stores y (one launch)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "splitk"

    @property
    def id(self) -> str:
        return (f"bssplitk_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class BsSwapABConfig:
    """Swap-AB for decode (M <= 64): y.T = B @ A.T, so a tile is ``block_n`` weight rows (the
    wgmma M side, 64) by ``block_m`` tokens (16/32/64: the smallest that covers M, tied by
    PROBLEM_RULES), each K tile scaled by its Bs block (per weight row) and As column (per
    token); optional split-K in one launch (last-arrival epilogue, as BsSplitKConfig)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "swapab"

    @property
    def id(self) -> str:
        return (f"bsswapab_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.split_k}_w{self.num_warps}s{self.num_stages}")


@dataclass(frozen=True)
class BsGemvConfig:
    """GEMV for M = 1 (impl.fp8_blockscale_gemv_kernel): CUDA-core products, no MMA; a program owns
    ``block_n`` weight rows (dividing the 128-row scale block) and streams (block_n, block_k)
    weight tiles, ``block_k`` a multiple of the 128-wide scale group. Not a vLLM config."""

    block_n: int
    block_k: int
    num_warps: int
    variant: ClassVar[str] = "gemv"
    # Compiled per weight shape (N and K are constants in the kernel): a precompile must probe
    # the problem's own N and K (benchmarks/precompile.py), as for the dense op's GEMV.
    shape_specialised: ClassVar[bool] = True

    @property
    def id(self) -> str:
        return f"bsgemv_n{self.block_n}k{self.block_k}_w{self.num_warps}"


# The vendor candidate is the dense op's VendorConfig (id "cublas"): torch._scaled_mm with
# cuBLASLt's blockwise 1x128 (A) / 128x128 (B) scaling (impl._vendor).
BlockScaleConfig = Union[BsTiledConfig, BsSplitKConfig, BsSwapABConfig, BsGemvConfig, VendorConfig]
VARIANTS = {c.variant: c for c in (BsTiledConfig, BsSplitKConfig, BsSwapABConfig, BsGemvConfig, VendorConfig)}

_ID_RE = {
    "tiled": re.compile(r"^bstiled_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$"),
    "splitk": re.compile(r"^bssplitk_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
    "swapab": re.compile(r"^bsswapab_m(\d+)n(\d+)k(\d+)_s(\d+)_w(\d+)s(\d+)$"),
    "gemv": re.compile(r"^bsgemv_n(\d+)k(\d+)_w(\d+)$"),
}


def config_from_id(cid: str) -> BlockScaleConfig:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == VendorConfig().id:
        return VendorConfig()
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: BlockScaleConfig) -> dict:
    """Numeric parameters under the dense op's uniform names (PARAM_NAMES; 0 = n/a)."""
    names = {f.name for f in fields(cfg)}
    out = {p: getattr(cfg, p) if p in names else 0 for p in PARAM_NAMES}
    if isinstance(cfg, VendorConfig):
        return out
    if isinstance(cfg, BsTiledConfig):
        out["split_k"] = 1
    elif isinstance(cfg, BsGemvConfig):
        # One token row, no split, no software pipeline (the dense GEMV's uniform view).
        out.update(block_m=1, group_m=1, split_k=1, num_stages=1)
    else:
        out["group_m"] = 1
    return out


# -- vLLM's configs ----------------------------------------------------------------------

_VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def vllm_default() -> BsTiledConfig:
    """vLLM's config when no tuned file exists (every M): 64 x 128 x 128, group 32, 4 warps, 2 stages."""
    return BsTiledConfig(64, 128, 128, 32, 4, 2)


def from_vllm(entry: dict) -> BsTiledConfig:
    """The config of one vLLM JSON entry ({BLOCK_SIZE_M, ..., num_stages}); ValueError if a key
    is missing or unknown."""
    missing = [k for k in _VLLM_KEYS if k not in entry]
    extra = sorted(set(entry) - set(_VLLM_KEYS))
    if missing or extra:
        raise ValueError(f"not a vLLM block-fp8 config entry: missing {missing}, unknown {extra}")
    return BsTiledConfig(*(int(entry[k]) for k in _VLLM_KEYS))


def to_vllm(cfg: BsTiledConfig) -> dict:
    """The vLLM JSON entry of a tiled config."""
    return dict(zip(_VLLM_KEYS, (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps,
                                 cfg.num_stages)))


# Every distinct config of vLLM 0.33.0's 23 H100 tuned files (block_m, block_n, block_k,
# group_m, num_warps, num_stages) that the regular grid below misses: 256-row, 8-warp
# small-tile and 2-stage picks, and the one BLOCK_SIZE_K 64. The test reads the files and
# checks that all 87 distinct configs are in the space.
_VLLM_H100_EXTRA = (
    (16, 32, 128, 16, 8, 3), (16, 64, 128, 1, 8, 3), (16, 64, 128, 1, 8, 4), (16, 64, 128, 1, 8, 5),
    (16, 64, 128, 16, 4, 2), (16, 64, 128, 16, 8, 5), (16, 128, 128, 1, 8, 3), (16, 128, 128, 16, 4, 2),
    (16, 256, 128, 16, 8, 3), (16, 256, 128, 32, 8, 3), (16, 256, 128, 32, 8, 4),
    (64, 32, 128, 1, 4, 2), (64, 32, 128, 16, 4, 2), (64, 32, 128, 32, 4, 2), (64, 64, 128, 16, 4, 2),
    (64, 64, 128, 16, 8, 2), (64, 128, 64, 64, 4, 3), (64, 128, 128, 16, 4, 2), (64, 256, 128, 32, 8, 3),
    (128, 32, 128, 1, 4, 5), (128, 64, 128, 1, 4, 2), (128, 64, 128, 1, 4, 3), (128, 64, 128, 1, 4, 4),
    (128, 64, 128, 16, 4, 5), (256, 64, 128, 1, 8, 5),
)

# The regular grid: vLLM's tuned values of each key (BLOCK_SIZE_K 128 = one scale group per
# tile), num_warps tied to the tile (4 up to 64x128 outputs, 8 above), stages 3-5.
_TILED_GRID = dict(block_m=(16, 32, 64, 128, 256), block_n=(32, 64, 128, 256), block_k=(128,),
                   group_m=(1, 16, 32, 64), num_stages=(3, 4, 5))
# Split-K (decode): small row tiles, the split bringing a few tiles up to the SM count.
_SPLITK_GRID = dict(block_m=(16, 32, 64), block_n=(32, 64, 128), block_k=(128,), split_k=(2, 4, 8),
                    warps_stages=((4, 3), (4, 4)))
# Swap-AB (decode): 64 weight rows per tile as in the dense op's swap-AB space (chosen there
# over 128 rows on the H100); K tiles of 64 or 128 (both divide the scale group).
_SWAPAB_GRID = dict(block_m=(16, 32, 64), block_n=(64,), block_k=(64, 128), split_k=(1, 2, 4, 8),
                    warps_stages=((4, 3), (4, 4), (4, 6)))
# GEMV (M = 1), from benchmarks/explore/fp8bs_gemv.py (benchmarks/results/fp8_blockscale/gemv/):
# on 10 DeepSeek-V3 weights at M = 1 its best config was 1.00-1.26x faster than the space's best
# (geomean 1.10x), with 1-8 rows by 512-2048 of K and 4 or 8 warps winning; no split of K won.
# A 2-row version lost all 10 of those weights at M = 2 to the MMA configs (0.69-0.98x): M = 1 only.
_GEMV_GRID = dict(block_n=(1, 2, 4, 8), block_k=(512, 1024, 2048), num_warps=(4, 8))


def _warps_for(block_m: int, block_n: int) -> int:
    return 4 if block_m * block_n <= 64 * 128 else 8


def _enumerate() -> list[BlockScaleConfig]:
    g = _TILED_GRID
    out: list[BlockScaleConfig] = [vllm_default()]
    for bm, bn, bk, gm, s in itertools.product(g["block_m"], g["block_n"], g["block_k"], g["group_m"],
                                               g["num_stages"]):
        out.append(BsTiledConfig(bm, bn, bk, gm, _warps_for(bm, bn), s))
    out += [BsTiledConfig(*t) for t in _VLLM_H100_EXTRA]
    g = _SPLITK_GRID
    for bm, bn, bk, sk in itertools.product(g["block_m"], g["block_n"], g["block_k"], g["split_k"]):
        for w, s in g["warps_stages"]:
            out.append(BsSplitKConfig(bm, bn, bk, sk, w, s))
    g = _SWAPAB_GRID
    for bm, bn, bk, sk in itertools.product(g["block_m"], g["block_n"], g["block_k"], g["split_k"]):
        for w, s in g["warps_stages"]:
            out.append(BsSwapABConfig(bm, bn, bk, sk, w, s))
    g = _GEMV_GRID
    out += [BsGemvConfig(*t) for t in itertools.product(g["block_n"], g["block_k"], g["num_warps"])]
    return list(dict.fromkeys(out))


# -- feasibility ---------------------------------------------------------------------------

def smem_bytes(cfg: BlockScaleConfig, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles (the scales are a few bytes per stage)."""
    if isinstance(cfg, (VendorConfig, BsGemvConfig)):
        return 0  # the GEMV keeps its tiles in registers
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype]


def static_feasible(cfg: BlockScaleConfig, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: the scale groups, shared memory, registers, fp8 dots."""
    if isinstance(cfg, VendorConfig):
        # cuBLASLt's blockwise scaling is fp8-only (the fp16/fp32 interpreter dtypes have none).
        if dtype != "fp8":
            return False, "the vendor candidate (blockwise torch._scaled_mm) is fp8-only"
        return True, ""
    if isinstance(cfg, BsGemvConfig):
        if cfg.block_n <= 0 or GROUP_N % cfg.block_n:
            return False, f"GEMV block_n {cfg.block_n} must divide the scale block {GROUP_N} (one Bs row per program)"
        if cfg.block_k <= 0 or cfg.block_k % GROUP_K or cfg.block_k & (cfg.block_k - 1):
            return False, f"GEMV block_k {cfg.block_k} must be a power-of-two multiple of the scale group {GROUP_K}"
        return True, ""
    if cfg.block_k <= 0 or GROUP_K % cfg.block_k:
        return False, f"BLOCK_SIZE_K {cfg.block_k} must divide the scale group {GROUP_K} (one As/Bs column per K tile)"
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    acc_per_thread = cfg.block_m * cfg.block_n // (cfg.num_warps * 32)
    if acc_per_thread > arch.max_acc_per_thread:
        return False, f"{acc_per_thread} accumulator registers per thread would spill"
    if dtype == "fp8" and cfg.block_k < 32:
        return False, "fp8 dot needs block_k >= 32"
    return True, ""


def generate_configs(arch: str = "sm90", dtype: str = "fp8", include_vendor: bool = True) -> list[BlockScaleConfig]:
    """All statically feasible candidates for (arch, dtype), in a stable order (vLLM's default
    first, the vendor candidate last when ``include_vendor``)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    # cuBLASLt's blockwise fp8 scaling exists on sm90 only (PyTorch refuses it elsewhere).
    out = _enumerate() + ([VendorConfig()] if include_vendor and spec.name == "sm90" else [])
    return [c for c in out if static_feasible(c, spec, dtype)[0]]


# Largest M the GEMV runs at (a problem rule).
GEMV_MAX_M = 1
# The GEMV's K tile may be at most this many times K (a problem rule).
GEMV_K_TILE_SLACK = 2

# Where cuBLASLt's blockwise scaling runs (VENDOR_RULE below).
VENDOR_M_MULTIPLE = 4
VENDOR_K_MULTIPLE = 4 * GROUP_K
VENDOR_N_MULTIPLE = 16

# Split-K partials are fp32 (SPLIT_K, M, N), as for the dense op.
SPLITK_WORKSPACE_LIMIT = 256 * 1024 * 1024


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.splitk = variants == "splitk"
        self.swapab = variants == "swapab"
        self.vendor = variants == "vendor"
        self.gemv = variants == "gemv"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)
        self.block_k = np.maximum(self.params["block_k"], 1)
        # Programs that sum K slices (split-K, or swap-AB with split_k > 1).
        self.split = self.splitk | (self.swapab & (self.params["split_k"] > 1))
        # As in gemm_configs: each rule at most one numpy call per problem.
        self.split_short_k, self.split_sk = split_rule_arrays(self.split, self.params["split_k"], self.block_k)
        self.swapab_mismatch = token_mismatch(self.swapab, self.params["block_m"], SWAPAB_TOKENS)


# The per-problem rules, (applies(problem), violated(arrays, problem), reason(problem, params)),
# as in gemm.space. The tiled kernel masks M, N and K: it runs every problem.
PROBLEM_RULES = (
    (lambda p: True,
     lambda a, p: a.split_short_k >= p.k,  # ceil(K / block_k) < split_k (split_rule_arrays)
     lambda p, c: f"K={p.k} has {-(-p.k // c['block_k'])} k-tiles < split_k={c['split_k']}"),
    (lambda p: True,
     lambda a, p: a.split_sk > SPLITK_WORKSPACE_LIMIT // (p.m * p.n * 4),  # split_k * M * N * 4 > limit
     lambda p, c: "split-K workspace above limit"),
    (lambda p: p.m > SWAPAB_MAX_M,
     lambda a, p: a.swapab,
     lambda p, c: f"swap-AB is a decode kernel: M={p.m} > {SWAPAB_MAX_M}"),
    # Each token row re-reads the weight: past M = 1 the MMA configs win (_GEMV_GRID above).
    (lambda p: p.m > GEMV_MAX_M,
     lambda a, p: a.gemv,
     lambda p, c: f"the GEMV is for M <= {GEMV_MAX_M}, got M={p.m}"),
    # A K tile over twice K loads more masked lanes than real ones: at 1x7168x128 the GEMV's
    # 512-wide tile lost to swap-AB by 1.19x (fp8bs-evalgemv-h100), and on no measured shape
    # (149 with M = 1) did a config that this rule removes run fastest.
    (lambda p: True,
     lambda a, p: a.gemv & (a.block_k > GEMV_K_TILE_SLACK * p.k),
     lambda p, c: f"GEMV block_k={c['block_k']} is over {GEMV_K_TILE_SLACK}x K={p.k}"),
    # One tile column covers every token: the one token count that covers M.
    (lambda p: True,
     lambda a, p: a.swapab_mismatch[swapab_tokens(p.m)],
     lambda p, c: f"swap-AB tile has {c['block_m']} tokens; M={p.m} takes {swapab_tokens(p.m)}"),
    # cuBLASLt's blockwise fp8 GEMM, as probed on the H100 (torch 2.11, CUDA 13.0;
    # benchmarks/results/fp8_blockscale/vendor_probe.jsonl): M not a multiple of 4 is refused
    # (CUBLAS_STATUS_NOT_SUPPORTED: As's column stride is M floats), and with K/128 groups not
    # a multiple of 4 it returns wrong results (K = 128, 896, 2304) while PyTorch refuses the
    # padded scale layout that would fix it.
    (lambda p: bool(p.m % VENDOR_M_MULTIPLE),
     lambda a, p: a.vendor,
     lambda p, c: f"blockwise torch._scaled_mm needs M divisible by {VENDOR_M_MULTIPLE}"),
    (lambda p: bool(p.k % VENDOR_K_MULTIPLE or p.n % VENDOR_N_MULTIPLE),
     lambda a, p: a.vendor,
     lambda p, c: f"blockwise torch._scaled_mm needs K divisible by {VENDOR_K_MULTIPLE} and N by {VENDOR_N_MULTIPLE}"),
)


# The three are the same for every op (space_common.feasibility): the static rules, then the
# per-problem rule list, over a whole space (problem_mask) or one config (check_feasible).
problem_mask, check_feasible, feasible_configs = feasibility(globals())


# -- the fallback rule -----------------------------------------------------------------------

def _ideal(m: int, n: int, k: int, sm_count: int) -> dict:
    """vLLM's default, with row tiles fitted to M and split-K when the decode tiles are few."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    if m > 64 and math.ceil(m / 128) * math.ceil(n / 128) >= sm_count:
        bm = 128
    want = dict(variant="tiled", block_m=bm, block_n=128, block_k=128, group_m=32, split_k=1,
                num_warps=4 if bm <= 64 else 8, num_stages=3)
    if m <= 64:
        want["block_n"] = 64
        tiles = math.ceil(m / bm) * math.ceil(n / 64)
        k_tiles = math.ceil(k / 128)
        best, gap = 1, abs(tiles - sm_count)
        for s in (2, 4, 8):
            if s <= k_tiles and abs(tiles * s - sm_count) < gap:
                best, gap = s, abs(tiles * s - sm_count)
        if best > 1:
            want.update(variant="splitk", split_k=best, group_m=1)
    return want


def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict]) -> int:
    """The runtime's rule without a model (signature of serving.heuristic.choose): index into
    ``candidates`` (dicts with 'variant' and PARAM_NAMES) of the one nearest ``_ideal``."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    want = _ideal(m, n, k, sm_count)

    def dist(c: dict) -> float:
        d = 0.0 if c["variant"] == want["variant"] else 100.0
        for p in ("block_m", "block_n", "block_k", "split_k", "group_m"):
            d += abs(math.log2(max(c[p], 1)) - math.log2(max(want[p], 1))) * (0.2 if p == "group_m" else 1.0)
        return d + 0.1 * (c["num_warps"] != want["num_warps"]) + 0.1 * (c["num_stages"] != want["num_stages"])

    return min(range(len(candidates)), key=lambda i: (dist(candidates[i]), i))


# vLLM's w8a8 block-fp8 tuned file names (the exporter writes them, the baselines read them): N, K,
# device name.
VLLM_FILE_NAME_RE = r"^N=(\d+),K=(\d+),device_name=([^,/\\ ]+),dtype=fp8_w8a8,block_shape=\[128,128\]\.json$"
