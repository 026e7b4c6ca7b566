"""Config space of the op ``vllm_moe``: vLLM's own fused-MoE Triton kernel, as vLLM runs a layer (torch-free).

The problem is one MoE layer as vLLM's ``fused_experts`` runs it, with ONE config for both grouped
GEMMs (vLLM's tuned file ``E=..,N=..,device_name=..[,dtype=..][,block_shape=..].json`` maps M to a
single config per layer): M tokens, each routed to top_k of E experts, gate_up (M * top_k pairs)
x w1 (E, 2N, K) then silu-and-mul, then down x w2 (E, K, N), times the routing weights, summed
per token. ``n`` is the per-shard intermediate size N of vLLM's file name (w2.shape[2]) and ``k``
the hidden size (w1.shape[2]); the ``routing`` names the expert histogram (kernels/moe/routing.py).
The MoE op ``moe`` measures each stage with its own config; vLLM's file cannot express that, so
this op's problem is the layer (docs/decisions/069-vllm-kernels-as-ops-of-their-own.md).

Candidates:
- ``tiled`` (``VllmMoeConfig``): vLLM's six keys, launched through ``kernels/moe/vllm_kernels.py``
  (vLLM's kernel compiled from a vLLM source, our mirror of its host code). The space is vLLM's
  own tuner search space (vLLM's ``benchmarks/kernels/benchmark_moe.py``,
  ``get_configs_compute_bound``, the CUDA branch): BLOCK_SIZE_M 16-256, BLOCK_SIZE_N 32-256,
  BLOCK_SIZE_K 64-256, GROUP_SIZE_M 1/16/32/64, num_warps 4/8, num_stages 2-5 (1,920 configs);
  for block-scaled fp8 its pruning (BLOCK_SIZE_K and BLOCK_SIZE_N multiples of the 128x128
  block), with BLOCK_SIZE_K 256 written as the 128 vLLM's launch caps it to (the same kernel);
  plus vLLM's ``get_default_config`` picks for every M (the fallback rule's answers; the
  block-fp8 default's 64-wide N tile is outside the pruned grid), and for block fp8 the configs
  of vLLM's shipped block-fp8 files (``kernels/moe/vllm_blockfp8.py``; several have that 64-wide
  N tile). vLLM's tuner drops a config that fails to compile (Triton's OutOfResources): here the
  static shared-memory rule (the project's: num_stages x the A and B tiles), which is stricter
  than the compiler: one config of vLLM's H200 bf16 files (16x256x128, 8 warps, 4 stages) is left out.
- ``vendor`` (``grouped_mm``, bf16, sm90): the layer with torch._grouped_mm for both GEMMs (the
  MoE op's vendor path), a reference point; never exported.

dtypes: bf16; fp8 (w8a8, per-tensor static activation scales, per-expert weight scales); fp8bs
(w8a8 with 128x128 weight-block scales and per-token-group activation scales: vLLM's
``dtype=fp8_w8a8,block_shape=[128,128]`` files); fp16/fp32 only for the Triton CPU interpreter.
"""
from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import ClassVar, Union

from ..moe import routing as R
from ..moe import space as MS
from ..moe import vllm_blockfp8
from ..space_common import (ARCHS, PARAM_NAMES, ArchSpec, VendorConfig, check_dims, feasibility,  # noqa: F401
                            first_violation, nearest_log2, param_arrays, parse_config_id, rules_mask, space_hash,
                            uniform_params)

DTYPE_BYTES = dict(MS.DTYPE_BYTES)
BLOCK_DTYPE = MS.BLOCK_DTYPE
BLOCK_SHAPE = MS.BLOCK_SHAPE
FP8_DTYPES = MS.FP8_DTYPES
DTYPES = tuple(DTYPE_BYTES)
# How a shape id spells the op's own problem fields (registry OpSpec.shape_id_suffix).
SHAPE_ID = ":e{e}k{top_k}:{routing}"
MAX_EXPERTS = MS.MAX_EXPERTS
MAX_PAIRS = MS.MAX_PAIRS
# vLLM's fused-MoE tuned file names (one definition, in the MoE op's space).
VLLM_FILE_NAME_RE = MS.VLLM_FILE_NAME_RE
frame_check = MS.frame_check


@dataclass(frozen=True)
class Problem:
    """One MoE layer: M tokens, top_k of E experts each, intermediate size n (vLLM's N, per shard)
    and hidden size k; both GEMMs on one config."""

    m: int
    n: int
    k: int
    dtype: str
    e: int
    top_k: int
    routing: str = "balanced"
    DTYPES: ClassVar[tuple] = DTYPES

    def __post_init__(self):
        check_dims(self, self.DTYPES)
        MS.check_experts(self)
        R.check_routing(self.routing)

    @property
    def key(self) -> str:
        return f"{self.dtype}:{self.m}x{self.n}x{self.k}:e{self.e}k{self.top_k}:{self.routing}"

    @property
    def pairs(self) -> int:
        return self.m * self.top_k

    def counts(self):
        return R.expert_counts(self.routing, self.m, self.e, self.top_k)

    def row_stats(self) -> dict:
        """The routing's statistics a harness row carries (the registry's MoE columns)."""
        c = self.counts()
        return {"tpe_max": int(max(c)), "active_experts": int(sum(1 for v in c if v > 0))}

    def stages(self) -> tuple:
        """The layer's two GEMMs as the MoE op's per-stage problems (gate_up, down)."""
        return (MS.Problem(self.m, 2 * self.n, self.k, self.dtype, self.e, self.top_k, "gate_up", self.routing),
                MS.Problem(self.m, self.k, self.n, self.dtype, self.e, self.top_k, "down", self.routing))


@dataclass(frozen=True)
class VllmMoeConfig:
    """vLLM's fused_moe_kernel config: its JSON keys (SPLIT_K is always 1 in vLLM 0.33.0's launch)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    variant: ClassVar[str] = "tiled"

    @property
    def id(self) -> str:
        return (f"vmoe_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}s{self.num_stages}")


VENDOR = VendorConfig("grouped_mm")
VllmMoeCandidate = Union[VllmMoeConfig, VendorConfig]
VARIANTS = {"tiled": VllmMoeConfig, "vendor": VendorConfig}
_ID_RE = {"tiled": re.compile(r"^vmoe_m(\d+)n(\d+)k(\d+)_g(\d+)_w(\d+)s(\d+)$")}


def config_from_id(cid: str) -> VllmMoeCandidate:
    """Inverse of ``cfg.id``. Raises ValueError for an unknown id."""
    if cid == VENDOR.id:
        return VENDOR
    return parse_config_id(cid, _ID_RE, VARIANTS)


def config_params(cfg: VllmMoeCandidate) -> dict:
    """Numeric parameters under the uniform names (PARAM_NAMES; 0 = n/a, split_k 1)."""
    return uniform_params(cfg, PARAM_NAMES)


# -- vLLM's configs ----------------------------------------------------------------------

VLLM_KEYS = MS.VLLM_KEYS


def canonical(cfg: VllmMoeConfig, dtype: str) -> VllmMoeConfig:
    """The config as vLLM's launch runs it: with block scales BLOCK_SIZE_K is capped at the scale
    block (``min(BLOCK_SIZE_K, min(block_shape))``), so a file's 256 runs as 128."""
    if dtype == BLOCK_DTYPE and cfg.block_k > min(BLOCK_SHAPE):
        return VllmMoeConfig(cfg.block_m, cfg.block_n, min(BLOCK_SHAPE), cfg.group_m, cfg.num_warps, cfg.num_stages)
    return cfg


def from_vllm(entry: dict, dtype: str = "bf16") -> VllmMoeConfig:
    """The config of one vLLM JSON entry (canonical for ``dtype``); ValueError naming a missing key."""
    c = MS.from_vllm(entry)
    return canonical(VllmMoeConfig(c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages), dtype)


def to_vllm(cfg: VllmMoeConfig) -> dict:
    """The vLLM JSON entry (the six keys) of a config."""
    return dict(zip(VLLM_KEYS, (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.num_warps,
                                cfg.num_stages)))


def _vllm_dtype(dtype: str) -> str:
    """The dtype whose vLLM default applies: fp8bs its block default, fp8 the per-tensor one (K tile
    128 at every M), every other dtype bf16's (vLLM's fp16 and fp32 defaults are bf16's)."""
    return dtype if dtype in FP8_DTYPES else "bf16"


def vllm_default(m: int, e: int, dtype: str = "bf16") -> VllmMoeConfig:
    """vLLM 0.33.0's ``get_default_config`` (CUDA) for M tokens, E experts and the dtype (see the
    MoE op's ``space.vllm_default``, which spells its rules out)."""
    c = MS.vllm_default(int(m), int(e), _vllm_dtype(dtype))
    return VllmMoeConfig(c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages)


# vLLM's tuner search space (benchmarks/kernels/benchmark_moe.py, get_configs_compute_bound, the CUDA
# branch), in its key order (itertools.product over these).
TUNER_BLOCK_M = (16, 32, 64, 128, 256)
TUNER_BLOCK_N = (32, 64, 128, 256)
TUNER_BLOCK_K = (64, 128, 256)
TUNER_GROUP_M = (1, 16, 32, 64)
TUNER_WARPS = (4, 8)
TUNER_STAGES = (2, 3, 4, 5)
# The M (and E) at which vLLM's defaults are enumerated into the space: every step of its rules.
_DEFAULT_M = MS._DEFAULT_M
_BLOCK_DEFAULT_M = MS._BLOCK_DEFAULT_M


def tuner_configs(dtype: str) -> list[VllmMoeConfig]:
    """vLLM's tuner search space for ``dtype``: the grid, and for block scales its pruning (BLOCK_SIZE_K
    and BLOCK_SIZE_N multiples of the block's) with the launch's BLOCK_SIZE_K cap (duplicates
    dropped)."""
    out = []
    for t in itertools.product(TUNER_BLOCK_M, TUNER_BLOCK_N, TUNER_BLOCK_K, TUNER_GROUP_M, TUNER_WARPS, TUNER_STAGES):
        cfg = VllmMoeConfig(*t)
        if dtype == BLOCK_DTYPE:
            if cfg.block_k % BLOCK_SHAPE[1] or cfg.block_n % BLOCK_SHAPE[0]:
                continue
            cfg = canonical(cfg, dtype)
        out.append(cfg)
    return list(dict.fromkeys(out))


def _enumerate(dtype: str) -> list[VllmMoeConfig]:
    if dtype == BLOCK_DTYPE:
        out = [vllm_default(m, 1, dtype) for m in _BLOCK_DEFAULT_M]
        # vLLM's shipped block-fp8 tunings (H100, H200), some with a 64-wide N tile off the pruned grid: so
        # vLLM as shipped is a candidate (its BLOCK_SIZE_M 8 entries, Hopper's swapped path only, are not).
        out += [VllmMoeConfig(*t) for t in vllm_blockfp8.FP8_BLOCK]
    else:
        out = [vllm_default(m, e, dtype) for m in _DEFAULT_M for e in (1, 64)]
    return list(dict.fromkeys(out + tuner_configs(dtype)))


# -- feasibility ---------------------------------------------------------------------------

def smem_bytes(cfg: VllmMoeCandidate, dtype: str) -> int:
    """Shared memory of the pipelined A and B tiles."""
    if isinstance(cfg, VendorConfig):
        return 0
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * DTYPE_BYTES[dtype]


def static_feasible(cfg: VllmMoeCandidate, arch: ArchSpec, dtype: str) -> tuple[bool, str]:
    """Problem-independent feasibility: shared memory (vLLM's tuner skips what does not compile),
    the fp8 dot's K tile, the scale block, the vendor's dtype."""
    if isinstance(cfg, VendorConfig):
        if dtype != "bf16":
            return False, "the vendor candidate (torch._grouped_mm) is bf16-only here"
        return True, ""
    if smem_bytes(cfg, dtype) > arch.smem_per_block:
        return False, f"shared memory {smem_bytes(cfg, dtype)} B > {arch.smem_per_block} B"
    if dtype in FP8_DTYPES and cfg.block_k < 32:
        return False, "fp8 dot needs block_k >= 32"
    if dtype == BLOCK_DTYPE and BLOCK_SHAPE[1] % cfg.block_k:
        return False, f"block_k={cfg.block_k} must divide the {BLOCK_SHAPE[1]}-column scale block"
    return True, ""


def generate_configs(arch: str = "sm90", dtype: str = "bf16", include_vendor: bool = True) -> list[VllmMoeCandidate]:
    """All statically feasible candidates for (arch, dtype), in a stable order (vLLM's defaults first,
    then its tuner's grid, the vendor last when ``include_vendor``)."""
    return list(_generate(arch, dtype, include_vendor))


@functools.lru_cache(maxsize=None)
def _generate(arch: str, dtype: str, include_vendor: bool) -> tuple:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    spec = ARCHS[arch]
    out = _enumerate(dtype) + ([VENDOR] if include_vendor and spec.name == "sm90" else [])
    return tuple(c for c in out if static_feasible(c, spec, dtype)[0])


# torch._grouped_mm needs 16-byte rows of both GEMMs' operands: hidden (gate_up's K) and N (down's K)
# divisible by 8 in bf16.
VENDOR_ALIGN = MS.VENDOR_ALIGN


class ConfigArrays:
    """A config list as numpy arrays (variant flags and PARAM_NAMES columns), for the rules."""

    def __init__(self, configs):
        import numpy as np

        variants = np.array([c.variant for c in configs], dtype=object)
        self.n = len(variants)
        self.vendor = variants == "vendor"
        self.params = param_arrays(configs, config_params, PARAM_NAMES)


# (applies(problem), violated(arrays, problem), reason(problem, params)). vLLM's kernel masks every
# dimension: its configs run any problem.
PROBLEM_RULES = (
    (lambda p: bool(p.k % VENDOR_ALIGN or p.n % VENDOR_ALIGN),
     lambda a, p: a.vendor,
     lambda p, c: f"torch._grouped_mm needs the hidden size K and N divisible by {VENDOR_ALIGN} (16-byte rows)"),
    # Triton 3.6 (vLLM 0.33's, and the GPU host's) cannot compile vLLM's kernel for these configs on
    # its sorted path ("PassManager::run failed", triton#9809; the whole space compiled for sm90,
    # tests/test_vllm_sm90_compile.py's LAYOUT_BUG). On the H200 the rule explains all 43 compile
    # errors of the gate and bf16 training shard 0. An exported file must never name a config that
    # does not compile. The per-pair path (M * top_k * 4 <= E) compiles them, but the rule reads the
    # dimensions and dtype only (what the runtime's mask is given), so it holds on both paths.
    (lambda p: p.dtype == "bf16" or bool(p.n % 16 or p.k % 16),
     lambda a, p: _layout_bug(a, p.dtype),
     lambda p, c: "BLOCK_SIZE_M 256 with 4 warps and this (BLOCK_SIZE_N, BLOCK_SIZE_K) does not compile on "
                  "vLLM's sorted path under Triton 3.6 (triton#9809)"),
)

# (BLOCK_SIZE_N, BLOCK_SIZE_K) tiles of the Triton 3.6 failure at BLOCK_SIZE_M 256 with 4 warps, per dtype
# (bf16 at every N and K; fp8 and fp8bs only with N or K off a multiple of 16: the rule's condition).
LAYOUT_BUG_TILES = {"bf16": ((64, 64), (128, 128)), "fp8": ((64, 64), (128, 128), (128, 256), (256, 128)),
                    "fp8bs": ((128, 128), (256, 128))}


def _layout_bug(a, dtype: str):
    import numpy as np

    pm = a.params
    tile = np.zeros(a.n, dtype=bool)
    for bn, bk in LAYOUT_BUG_TILES.get(dtype, ()):
        tile |= (pm["block_n"] == bn) & (pm["block_k"] == bk)
    return (pm["block_m"] == 256) & (pm["num_warps"] == 4) & tile & ~a.vendor

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


# -- the fallback rule -----------------------------------------------------------------------

def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict], e: int = 1, top_k: int = 1,
           dtype: str = "bf16") -> int:
    """The runtime's rule without a model: what vLLM runs without a tuned file, its
    ``get_default_config`` for (M, E, dtype); the index of the candidate (dicts with 'variant' and
    PARAM_NAMES) nearest to it (itself: the defaults are in the space)."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    want = config_params(vllm_default(m, e, dtype))

    def dist(c: dict) -> float:
        if c["variant"] != "tiled":
            return 1e9
        return sum(abs(math.log2(max(c[p], 1)) - math.log2(max(want[p], 1))) for p in PARAM_NAMES)

    return min(range(len(candidates)), key=lambda i: (dist(candidates[i]), i))


def choose_arrays(m: int, n: int, k: int, sm_count: int, cands, e: int = 1, top_k: int = 1,
                  dtype: str = "bf16") -> int:
    """``choose`` over the candidates as arrays (``space_common.nearest_log2``: ``.tiled``,
    ``.log2``): the same index, without a dict per candidate (the runtime's cold path: 4-15 ms
    of Python for this space's ~1,250 candidates before)."""
    return nearest_log2(cands, config_params(vllm_default(m, e, dtype)))


# -- what vLLM's kernel is compiled for (benchmarks/precompile.py asks the space module) -------------
#
# vLLM's fused_moe_kernel is a plain @triton.jit: Triton compiles it per config and per class of its
# int arguments (== 1, divisible by 16): N, K, EM, num_valid_tokens, the strides (I, 2I, hidden and
# products; with block scales ceil(./128) of them and their products), and per constexpr (top_k of
# the gate_up launch, the per-pair path). For a layer, num_valid_tokens = M * top_k ("pairs") in both
# launches and EM = pairs + min(E, pairs) * (BLOCK_SIZE_M - 1) (vLLM's padded length; the M <
# BLOCK_SIZE_M cut never shortens it here), so EM = pairs - min(E, pairs) mod 16 for every
# BLOCK_SIZE_M (a multiple of 16); on the per-pair path EM = pairs * BLOCK_SIZE_M. So a config
# compiles once per ``specialisation`` below, whatever M, E and N beyond these classes: training
# problems that share it share their compiles (benchmarks/vllm_picks.py samples configs per class).


def naive_assignment(m: int, top_k: int, e: int) -> bool:
    """vLLM's per-pair path (``_prepare_expert_assignment``): M * top_k * 4 <= E."""
    return m * top_k * 4 <= e


def _pair_classes(m: int, e: int, top_k: int) -> tuple:
    pairs = m * top_k
    if naive_assignment(m, top_k, e):
        return ("per_pair", pairs == 1, pairs % 16 == 0)
    return ("sorted", pairs == 1, pairs % 16 == 0, (pairs - min(e, pairs)) % 16 == 0)


def _blocks(x: int) -> int:
    return -(-x // BLOCK_SHAPE[1])


def _dim_classes(n: int, k: int, dtype: str) -> tuple:
    out = (n % 16, k % 16)
    if dtype == BLOCK_DTYPE:
        out += tuple((q == 1, q % 16) for q in (_blocks(n), _blocks(2 * n), _blocks(k)))
    return out


def specialisation(p: Problem) -> tuple:
    """The compile key of a problem: configs compile once per key (see above)."""
    return (p.dtype, p.top_k, _pair_classes(p.m, p.e, p.top_k), _dim_classes(p.n, p.k, p.dtype))


def _shrink(x: int, block: bool) -> int:
    """A size no larger than needed with x's classes: x mod 16 (and with block scales ceil(x/128)
    mod 16 and == 1)."""
    if not block:
        return x if x <= 48 else 32 + x % 16
    q = _blocks(x)
    if q <= 17:
        return x
    r = q % 16
    q2 = 16 if r == 0 else 17 if r == 1 else r
    return x - BLOCK_SHAPE[1] * (q - q2)


@functools.lru_cache(maxsize=4096)
def _probe_tokens(top_k: int, want: tuple, e_max: int) -> tuple[int, int]:
    for e in range(top_k, e_max + 1):
        for m in range(1, 65):
            if _pair_classes(m, e, top_k) == want:
                return m, e
    return 0, 0


def probe_problem(p: Problem) -> Problem:
    """A small problem with ``p``'s compile key (precompile launches each config on it): the same
    dtype and top_k, the fewest tokens and experts with p's token classes, and sizes with p's
    classes."""
    block = p.dtype == BLOCK_DTYPE
    n, k = _shrink(p.n, block), _shrink(p.k, block)
    m, e = _probe_tokens(p.top_k, _pair_classes(p.m, p.e, p.top_k), p.e)
    if not m:
        m, e = p.m, p.e
    return Problem(m, n, k, p.dtype, e, p.top_k, "balanced")
