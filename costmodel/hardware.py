"""Known GPUs described by numbers, so the cost model sees a GPU as data, not a name.

The features use these numbers (SM count, shared memory, L2, peak FLOP/s, HBM
bandwidth); a GPU missing from the table can be described with ``register`` (or
``COSTMODEL_GPU_SPECS``, a JSON file of a list of GpuSpec fields) without code
changes. Peak numbers are the vendor's dense (no sparsity) figures.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. ``match`` is a case-insensitive substring of the device name."""

    name: str
    match: str
    arch: str
    sm_count: int
    smem_per_sm_kb: float
    l2_mb: float
    tflops_16bit: float  # dense bf16/fp16 tensor-core peak
    tflops_fp8: float  # dense fp8 tensor-core peak (0 = no fp8 tensor cores)
    hbm_gbps: float

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for an input dtype (fp32 runs as tf32: half the 16-bit peak)."""
        if dtype == "fp8":
            return self.tflops_fp8 or self.tflops_16bit
        if dtype == "fp32":
            return self.tflops_16bit / 2
        return self.tflops_16bit


# Order matters: the first spec whose `match` is in the name wins, so the more
# specific names (H100 PCIe, H100 NVL) come before the generic H100 (SXM), and
# GH200 before H200 (every GH200 name contains 'H200').
_GPUS: list[GpuSpec] = [
    GpuSpec("GH200", "GH200", "sm90", 132, 228, 60, 989, 1979, 4000),
    GpuSpec("H200", "H200", "sm90", 132, 228, 60, 989, 1979, 4800),
    GpuSpec("H20", "H20", "sm90", 78, 228, 60, 148, 296, 4000),
    GpuSpec("H100 PCIe", "H100 PCIE", "sm90", 114, 228, 50, 756, 1513, 2000),
    GpuSpec("H100 NVL", "H100 NVL", "sm90", 132, 228, 50, 835, 1671, 3900),
    GpuSpec("H100 SXM", "H100", "sm90", 132, 228, 50, 989, 1979, 3350),
    GpuSpec("A100", "A100", "sm80", 108, 164, 40, 312, 0, 2039),
    GpuSpec("L40S", "L40S", "sm89", 142, 100, 96, 362, 733, 864),
]


def _extra_specs() -> list[GpuSpec]:
    path = os.environ.get("COSTMODEL_GPU_SPECS")
    if not path:
        return []
    with open(path, encoding="utf-8") as fh:
        return [GpuSpec(**d) for d in json.load(fh)]


def register(spec: GpuSpec) -> None:
    """Describe another GPU (takes precedence over the built-in table)."""
    _GPUS.insert(0, spec)


def known_gpus() -> list[GpuSpec]:
    """The table, user-registered and COSTMODEL_GPU_SPECS entries first."""
    return _extra_specs() + list(_GPUS)


def lookup(gpu_name: str) -> GpuSpec | None:
    """The spec whose `match` occurs in gpu_name (case-insensitive), or None."""
    up = gpu_name.upper()
    for spec in known_gpus():
        if spec.match.upper() in up:
            return spec
    return None


def spec_for(gpu_name: str) -> GpuSpec:
    """Like lookup, but raises a ValueError naming the GPU when it is unknown."""
    spec = lookup(gpu_name)
    if spec is None:
        raise ValueError(f"unknown GPU {gpu_name!r}: describe it with gemm_costmodel.hardware.register() "
                         "or COSTMODEL_GPU_SPECS")
    return spec


def as_dict(spec: GpuSpec) -> dict:
    """The spec's fields, for manifests."""
    return asdict(spec)
