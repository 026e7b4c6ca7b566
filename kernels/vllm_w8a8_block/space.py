"""Config space of the op ``vllm_w8a8_block``: vLLM's own w8a8 block-fp8 linear Triton kernel (torch-free).

The problem is the fp8_blockscale op's: y (M, N) bf16 = (A * As) @ (B * Bs).T with A fp8 (M, K) and
per-token 1x128 scales, B fp8 (N, K) with 128x128 block scales (vLLM's ``w8a8_block_fp8_matmul``,
block_shape [128, 128]). The candidates are vLLM's ``_w8a8_triton_block_scaled_mm`` configs, launched
through ``kernels/moe/vllm_kernels.w8a8_block_fp8_matmul`` (compiled from a vLLM source):

- ``tiled`` (``VllmBlockConfig``): vLLM's tuner search space (vLLM's
  ``benchmarks/kernels/benchmark_w8a8_block_fp8.py``, ``get_configs_compute_bound``): num_stages 2-5,
  BLOCK_SIZE_M 16-256, BLOCK_SIZE_K 64/128, BLOCK_SIZE_N 32-256, num_warps 4/8, GROUP_SIZE_M
  1/16/32/64 (1,280 configs), pruned as its tuner prunes them (the scale block's 128 columns a
  multiple of BLOCK_SIZE_K: both stay); vLLM's default (64x128x128, group 32, 4 warps, 2 stages) is
  among them. Configs that cannot compile (vLLM's tuner skips OutOfResources) leave by the static
  shared-memory rule.
- ``vendor`` (``cublas``, sm90, fp8): torch._scaled_mm with cuBLASLt's blockwise scaling (the
  fp8_blockscale op's vendor, with its rules); a reference point, never exported.

dtypes: "fp8"; fp16/fp32 operands (same scale layout) only for the Triton CPU interpreter.
"""
from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import ClassVar, Union

from ..fp8_blockscale import space as BS
from ..space_common import (ARCHS, PARAM_NAMES, ArchSpec, DenseProblem, VendorConfig, feasibility,  # noqa: F401
                            first_violation, nearest_log2, param_arrays, parse_config_id, rules_mask, space_hash,
                            uniform_params)

GROUP_N, GROUP_K = BS.GROUP_N, BS.GROUP_K
DTYPE_BYTES = dict(BS.DTYPE_BYTES)
DTYPES = tuple(DTYPE_BYTES)
VLLM_FILE_NAME_RE = BS.VLLM_FILE_NAME_RE


class Problem(DenseProblem):
    """One block-scaled GEMM: y (M, N) = (A * As) @ (B * Bs).T, nn.Linear layout."""

    DTYPES = DTYPES


@dataclass(frozen=True)
class VllmBlockConfig:
    """vLLM's ``_w8a8_triton_block_scaled_mm`` config: its JSON keys."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return (f"vbs_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


VENDOR = VendorConfig()  # "cublas": the fp8_blockscale op's blockwise torch._scaled_mm
VllmBlockCandidate = Union[VllmBlockConfig, VendorConfig]
VARIANTS = {"tiled": VllmBlockConfig, "vendor": VendorConfig}
_ID_RE = {"tiled": re.compile(r"^vbs_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$")}
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def config_from_id(cid: str) -> VllmBlockCandidate:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == VENDOR.id:
        return VENDOR
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: VllmBlockCandidate) -> dict:
    """Numeric parameters under the uniform names (PARAM_NAMES; 0 = n/a, split_k 1)."""
    return uniform_params(cfg, PARAM_NAMES)


def vllm_default() -> VllmBlockConfig:
    """vLLM's config when no tuned file exists (every M): 64 x 128 x 128, group 32, 4 warps, 2 stages."""
    d = BS.vllm_default()
    return VllmBlockConfig(d.block_m, d.block_n, d.block_k, d.group_m, d.num_warps, d.num_stages)


def from_vllm(entry: dict) -> VllmBlockConfig:
    """The config of one vLLM JSON entry; ValueError if a key is missing or unknown."""
    d = BS.from_vllm(entry)
    return VllmBlockConfig(d.block_m, d.block_n, d.block_k, d.group_m, d.num_warps, d.num_stages)


def to_vllm(cfg: VllmBlockConfig) -> dict:
    return dict(zip(VLLM_KEYS, (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps,
                                cfg.num_stages)))


# vLLM's tuner search space, in its loop order (num_stages, BLOCK_SIZE_M, BLOCK_SIZE_K, BLOCK_SIZE_N,
# num_warps, GROUP_SIZE_M outermost first).
TUNER_STAGES = (2, 3, 4, 5)
TUNER_BLOCK_M = (16, 32, 64, 128, 256)
TUNER_BLOCK_K = (64, 128)
TUNER_BLOCK_N = (32, 64, 128, 256)
TUNER_WARPS = (4, 8)
TUNER_GROUP_M = (1, 16, 32, 64)


def tuner_configs() -> list[VllmBlockConfig]:
    """vLLM's tuner search space, with its pruning (the scale block's K a multiple of BLOCK_SIZE_K)."""
    out = []
    for s, bm, bk, bn, w, g in itertools.product(TUNER_STAGES, TUNER_BLOCK_M, TUNER_BLOCK_K, TUNER_BLOCK_N,
                                                  TUNER_WARPS, TUNER_GROUP_M):
        if GROUP_K % bk == 0:
            out.append(VllmBlockConfig(bm, bn, bk, g, w, s))
    return out


def _enumerate() -> list[VllmBlockConfig]:
    return list(dict.fromkeys([vllm_default()] + tuner_configs()))


def smem_bytes(cfg: VllmBlockCandidate, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles."""
    if isinstance(cfg, VendorConfig):
        return 0
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype]


def static_feasible(cfg: VllmBlockCandidate, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: the scale group, shared memory, the vendor's dtype."""
    if isinstance(cfg, VendorConfig):
        if dtype != "fp8":
            return False, "the vendor candidate (blockwise torch._scaled_mm) is fp8-only"
        return True, ""
    if GROUP_K % cfg.block_k:
        return False, f"BLOCK_SIZE_K {cfg.block_k} must divide the scale group {GROUP_K}"
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    return True, ""


def generate_configs(arch: str = "sm90", dtype: str = "fp8", include_vendor: bool = True) -> list[VllmBlockCandidate]:
    """All statically feasible candidates for (arch, dtype), in a stable order (vLLM's default first,
    then its tuner's order, the vendor last when ``include_vendor``)."""
    return list(_generate(arch, dtype, include_vendor))


@functools.lru_cache(maxsize=None)
def _generate(arch: str, dtype: str, include_vendor: bool) -> tuple:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    out = _enumerate() + ([VENDOR] if include_vendor and spec.name == "sm90" else [])
    return tuple(c for c in out if static_feasible(c, spec, dtype)[0])


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)


# vLLM's kernel masks M, N and K: its configs run every problem. The vendor's limits are the
# fp8_blockscale op's (cuBLASLt's blockwise scaling as probed on the H100).
PROBLEM_RULES = (
    (lambda p: bool(p.m % BS.VENDOR_M_MULTIPLE),
     lambda a, p: a.vendor,
     lambda p, c: f"blockwise torch._scaled_mm needs M divisible by {BS.VENDOR_M_MULTIPLE}"),
    (lambda p: bool(p.k % BS.VENDOR_K_MULTIPLE or p.n % BS.VENDOR_N_MULTIPLE),
     lambda a, p: a.vendor,
     lambda p, c: f"blockwise torch._scaled_mm needs K divisible by {BS.VENDOR_K_MULTIPLE} and N by "
                  f"{BS.VENDOR_N_MULTIPLE}"),
)

problem_mask, check_feasible, _feasible_one_by_one = feasibility(globals())


@functools.lru_cache(maxsize=None)
def _arrays(arch: str, dtype: str, include_vendor: bool):
    return ConfigArrays(_generate(arch, dtype, include_vendor))


def feasible_configs(problem, arch: str = "sm90", include_vendor: bool = True) -> list:
    """Candidates that can run ``problem`` on ``arch``: the space's rule list over the whole (cached)
    space at once (``problem_mask``; the same as ``check_feasible`` config by config, which the
    generic version calls ~1,500 times per problem: the harness asks for every problem of a suite)."""
    cfgs = _generate(arch, problem.dtype, include_vendor)
    mask = problem_mask(_arrays(arch, problem.dtype, include_vendor), problem)
    return [c for c, ok in zip(cfgs, mask) if ok]


def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict]) -> int:
    """The runtime's rule without a model: what vLLM runs without a tuned file, its default config
    (the index of the candidate nearest to it: itself, it is in the space)."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    want = config_params(vllm_default())

    def dist(c: dict) -> float:
        if c["variant"] != "tiled":
            return 1e9
        return sum(abs(math.log2(max(c[p], 1)) - math.log2(max(want[p], 1))) for p in PARAM_NAMES)

    return min(range(len(candidates)), key=lambda i: (dist(candidates[i]), i))


def choose_arrays(m: int, n: int, k: int, sm_count: int, cands) -> int:
    """``choose`` over the candidates as arrays (``space_common.nearest_log2``: ``.tiled``,
    ``.log2``): the same index, without a dict per candidate (the runtime's cold path: 4-12 ms
    of Python before)."""
    return nearest_log2(cands, config_params(vllm_default()))


# -- what vLLM's kernel is compiled for (benchmarks/precompile.py asks the space module) -------------
# _w8a8_triton_block_scaled_mm is a plain @triton.jit: it compiles per config and per class (== 1,
# divisible by 16) of its int arguments: M, N, K and the strides (K, N, and ceil(K/128) of the scales).

def _cls(v: int) -> tuple:
    return (v == 1, v % 16 == 0)


def specialisation(p: Problem) -> tuple:
    """The compile key of a problem: configs compile once per key."""
    return (p.dtype, _cls(p.m), _cls(p.n), _cls(p.k), _cls(-(-p.k // GROUP_K)))


def probe_problem(p: Problem) -> Problem:
    """A small problem with ``p``'s compile key (precompile launches each config on it)."""
    def small(v):
        return 1 if v == 1 else 16 if v % 16 == 0 else 17
    q = -(-p.k // GROUP_K)
    if q == 1:
        k = p.k if p.k <= GROUP_K else GROUP_K
    else:
        k = GROUP_K * (16 if q % 16 == 0 else 2) - (0 if p.k % 16 == 0 else 1)
    return Problem(small(p.m), small(p.n), k, p.dtype)
