"""The ck_a8w8_blockscale op as data (stdlib only; the serving path imports it).

The op: y (M, N) bf16/fp16 = (A * As) @ (B * Bs).T, A fp8 (M, K) with per-token 1x128 scales,
B fp8 (N, K) with 128x128 block scales, run by one of AITER's CK kernel instances, named by
its tile (``a8w8_blockscale_<scale block>_<BLOCK_SIZE x MPerBLOCK x NPerBLOCK x KPerBLOCK>_..
_<intrawave|interwave>_v<pipeline>``) or by a CK-tile instance (``a8w8_blockscale_cktile_..``).
AITER's tables key a decision on (cu_num, M, N, K) only: the output dtype does not enter.

Facts taken from AITER (ROCm/aiter at the commit in datasets/ck_a8w8_blockscale/aiter/
PROVENANCE.json), restated here, none of its code:
- aiter/jit/utils/chip_info.py maps a table's cu_num to its arch (256 -> gfx950; 80 and 304 ->
  gfx942) and names the part by arch (gfx942 -> MI300, or MI308 by PCI chip id; gfx950 -> MI350);
- csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_instance.py lists the CK instances the
  heuristic below uses (candidate_kernels_dict indices 0, 2, 6, 8, 11, 16, 18) and the untuned
  default (index -1: a 16x128 tile, KPerBLOCK 256, v1).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OP = "ck_a8w8_blockscale"
ARCHS = ("gfx942", "gfx950")
# AITER's cu_num -> arch backfill (chip_info._LEGACY_CU_NUM_TO_GFX) and its part naming by arch
# (chip_info.get_device_name): 304 CUs is an MI300X-class gfx942, 80 an MI308X-class gfx942 (the
# MI308 is told apart by PCI chip id; its CU count is 80), 256 an MI350-class gfx950.
ARCH_OF_CU = {304: "gfx942", 80: "gfx942", 256: "gfx950"}
PART_OF_CU = {304: "MI300X", 80: "MI308X", 256: "MI350"}
PART_OF_ARCH = {"gfx942": "MI300", "gfx950": "MI350", "gfx1250": "MI400"}


def part_of(arch: str, cu_num: int) -> str:
    """The part class of a table row: by CU count where the arch is the backfill's, else by arch."""
    if ARCH_OF_CU.get(cu_num) == arch:
        return PART_OF_CU[cu_num]
    return PART_OF_ARCH.get(arch, f"{arch}-cu{cu_num}")

# GPU names (as the ROCm runtime reports them, e.g. torch.cuda.get_device_name on ROCm) -> (arch, CUs).
# Matched as whole words, longest key first.
GPUS = {"MI300X": ("gfx942", 304), "MI325X": ("gfx942", 304), "MI308X": ("gfx942", 80),
        "MI350X": ("gfx950", 256), "MI355X": ("gfx950", 256)}

DTYPES = ("fp8", "bf16", "fp16")  # fp8: the operands; bf16/fp16: the output. One decision for all.


def gpu_of(name: str) -> tuple[str, int]:
    """(arch, cu_num) of an AMD GPU name such as 'AMD Instinct MI300X'; ValueError naming it."""
    if not isinstance(name, str):
        raise ValueError(f"gpu_name must be a str, got {type(name).__name__} {name!r}")
    up = name.upper().replace("_", " ")
    for key in sorted(GPUS, key=len, reverse=True):
        if re.search(rf"\b{key}\b", up):
            return GPUS[key]
    raise ValueError(f"gpu_name {name!r} is not an AMD part the {OP} op knows; known: {', '.join(sorted(GPUS))}")


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str = "fp8"

    def __post_init__(self):
        for f in ("m", "n", "k"):
            v = getattr(self, f)
            if type(v) is not int or v < 1:
                raise ValueError(f"{f} must be a positive int, got {v!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class Tile:
    """What a kernel name spells: the block's thread count and M/N/K tile, the pipeline."""
    block_size: int
    m_per_block: int
    n_per_block: int
    k_per_block: int
    scheduler: str  # intrawave / interwave
    pipeline: str  # 'v1', 'v3' (CK) or 'tile' (CK-tile)


_CK_RE = re.compile(r"^a8w8_blockscale_\d+x\d+x\d+_(\d+)x(\d+)x(\d+)x(\d+)_.*_(intrawave|interwave)_v(\d)$")
_TILE_RE = re.compile(r"^a8w8_blockscale_cktile_(\d+)x(\d+)x(\d+)_.*_(intrawave|interwave)_")


def tile_of(name: str) -> Tile:
    """The tile a CK or CK-tile kernel name spells; ValueError for anything else."""
    m = _CK_RE.match(name)
    if m:
        bs, mt, nt, kt, sched, v = m.groups()
        return Tile(int(bs), int(mt), int(nt), int(kt), sched, f"v{v}")
    m = _TILE_RE.match(name)
    if m:
        mt, nt, kt, sched = m.groups()
        return Tile(0, int(mt), int(nt), int(kt), sched, "tile")
    raise ValueError(f"kernelName {name!r} is not an a8w8_blockscale CK or CK-tile kernel name")


# The CK instances of AITER's candidate_kernels_dict that the seed's heuristic uses, by index,
# spelled as the kernelName strings of the tuned tables (tile, then index).
K0_128x128_V3 = "a8w8_blockscale_1x128x128_256x128x128x128_16x16_32x32_2x2_8x32x1_8x32x1_1x32x1x8_8_1x1_intrawave_v3"
K2_64x128_V3 = "a8w8_blockscale_1x128x128_256x64x128x128_16x16_32x32_1x2_8x32x1_8x32x1_1x32x1x8_8_1x1_intrawave_v3"
K6_16x64_K128_V1 = "a8w8_blockscale_1x128x128_256x16x64x128_8x16_16x16_1x1_16x16x1_8x32x1_1x16x1x16_4_1x1_intrawave_v1"
K8_16x64_K256_V1 = "a8w8_blockscale_1x128x128_256x16x64x256_16x16_16x16_1x1_16x16x1_16x16x1_1x16x1x16_4_1x1_intrawave_v1"
K11_32x64_K128_V1 = "a8w8_blockscale_1x128x128_256x32x64x128_16x16_16x16_2x1_8x32x1_8x32x1_1x32x1x8_8_2x1_intrawave_v1"
K16_64x64_K128_V1 = "a8w8_blockscale_1x128x128_256x64x64x128_16x16_32x32_1x1_8x32x1_8x32x1_1x32x1x8_8_1x1_intrawave_v1"
K18_64x64_K256_V1 = "a8w8_blockscale_1x128x128_256x64x64x256_16x16_32x32_1x1_16x16x1_16x16x1_1x32x1x8_8_1x1_intrawave_v1"
HEURISTIC_KERNELS = (K8_16x64_K256_V1, K18_64x64_K256_V1, K2_64x128_V3, K0_128x128_V3,
                     K6_16x64_K128_V1, K11_32x64_K128_V1, K16_64x64_K128_V1)
# AITER's untuned fallback (default_kernels_dict[-1]): 16x128 tile, KPerBLOCK 256, v1.
DEFAULT_KERNEL = "a8w8_blockscale_1x128x128_256x16x128x256_16x16_16x16_1x2_16x16x1_16x16x1_1x16x1x16_8_1x2_intrawave_v1"


def heuristic(m: int, n: int, k: int) -> str:
    """The seed's shape-aware heuristic (AITER PR 3316, written for gfx942), its thresholds exactly:
    seven arms on (M x N, K), K = 128 apart (KPerBLOCK 128 avoids K padding; no v3 at K = 128)."""
    mn = m * n
    if k == 128:
        if mn <= 307_200:
            return K6_16x64_K128_V1
        if mn <= 2_000_000:
            return K11_32x64_K128_V1
        return K16_64x64_K128_V1
    if mn <= 307_200:
        return K8_16x64_K256_V1
    if mn <= 1_050_000:
        return K18_64x64_K256_V1
    if k < 384:  # v3 requires K >= 384
        return K18_64x64_K256_V1
    if mn <= 2_500_000:
        return K2_64x128_V3
    return K0_128x128_V3


def feasible(name: str, k: int) -> bool:
    """Whether a kernel may be offered for K. The one rule the seed states: the v3 pipeline needs
    K >= 384 (and is unsupported at K = 128). Nothing else is known here (no launch, no build)."""
    return not (tile_of(name).pipeline == "v3" and k < 384)


def choose(problem: Problem, arch: str = "gfx942") -> str:
    """The fallback rule without a model: the seed's heuristic (on gfx950 too, outside its scope)."""
    return heuristic(problem.m, problem.n, problem.k)
