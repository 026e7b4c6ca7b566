"""Known GPUs described by numbers, so the cost model sees a GPU as data, not a name.

The features use these numbers (SM count, shared memory, L2, peak FLOP/s, HBM
bandwidth); a GPU missing from the table can be described with ``register`` (or
``COSTMODEL_GPU_SPECS``, a JSON file of a list of GpuSpec fields) without code
changes. Peak numbers are the vendor's dense (no sparsity) figures.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. ``match`` is its CUDA device name, or several separated by '|', compared
    exactly after normalising (case, runs of spaces, a leading 'NVIDIA '): never as a substring,
    since 'NVIDIA RTX A1000 6GB Laptop GPU' contains 'A100' (issue 57, row 5)."""

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
        if dtype in ("fp8", "fp8bs"):  # fp8bs: block-scaled fp8 runs on the same tensor cores
            return self.tflops_fp8 or self.tflops_16bit
        if dtype == "fp32":
            return self.tflops_16bit / 2
        return self.tflops_16bit


# The device names torch.cuda.get_device_name reports for each (the driver's names).
_GPUS: list[GpuSpec] = [
    GpuSpec("GH200", "GH200 480GB|GH200 144G HBM3e|GH200", "sm90", 132, 228, 60, 989, 1979, 4000),
    GpuSpec("H200", "H200", "sm90", 132, 228, 60, 989, 1979, 4800),
    # The PCIe card (600 W): the H200's memory, the H100 NVL's clocks (vendor's dense peaks).
    GpuSpec("H200 NVL", "H200 NVL", "sm90", 132, 228, 60, 835, 1671, 4800),
    GpuSpec("H20", "H20", "sm90", 78, 228, 60, 148, 296, 4000),
    GpuSpec("H100 PCIe", "H100 PCIe", "sm90", 114, 228, 50, 756, 1513, 2000),
    GpuSpec("H100 NVL", "H100 NVL", "sm90", 132, 228, 50, 835, 1671, 3900),
    GpuSpec("H100 SXM", "H100 80GB HBM3|H100 SXM5 80GB|H100 SXM|H100", "sm90", 132, 228, 50, 989, 1979, 3350),
    GpuSpec("A100", "A100-SXM4-80GB|A100-SXM4-40GB|A100-PCIE-40GB|A100-PCIE-80GB|A100 80GB PCIe|A100-SXM-80GB|A100",
            "sm80", 108, 164, 40, 312, 0, 2039),
    GpuSpec("L40S", "L40S", "sm89", 142, 100, 96, 362, 733, 864),
]


_STR_FIELDS = ("name", "match", "arch")


def _spec_from_json(i: int, entry, where: str) -> GpuSpec:
    """Entry i of COSTMODEL_GPU_SPECS as a GpuSpec, or a one-line ValueError naming the field."""
    names = [f.name for f in fields(GpuSpec)]
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: entry {i} must be an object with the fields {', '.join(names)}, "
                         f"got {type(entry).__name__}")
    missing = [n for n in names if n not in entry]
    unknown = sorted(str(n) for n in entry if n not in names)
    if missing or unknown:
        parts = ([f"missing field(s) {', '.join(missing)}"] if missing else []) + \
                ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
        raise ValueError(f"{where}: entry {i}: {'; '.join(parts)} (fields: {', '.join(names)})")
    for n in names:
        v = entry[n]
        if n in _STR_FIELDS:
            # An empty `match` would be a substring of every device name.
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{where}: entry {i}: {n} must be a non-empty string, got {v!r}")
        elif n == "sm_count":
            if type(v) is not int or v < 1:
                raise ValueError(f"{where}: entry {i}: sm_count must be an int >= 1, got {v!r}")
        elif type(v) not in (int, float) or not math.isfinite(v) or v < 0 or (v == 0 and n != "tflops_fp8"):
            low = ">= 0 (0: no fp8 tensor cores)" if n == "tflops_fp8" else "> 0"
            raise ValueError(f"{where}: entry {i}: {n} must be a number {low}, got {v!r}")
    return GpuSpec(**entry)


def _extra_specs() -> list[GpuSpec]:
    """The GPUs described by the JSON file COSTMODEL_GPU_SPECS names (a list of GpuSpec fields), if set.
    Any problem with it is a one-line ValueError naming the variable and the file."""
    path = os.environ.get("COSTMODEL_GPU_SPECS")
    if not path:
        return []
    where = f"COSTMODEL_GPU_SPECS={path}"
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read the file ({exc.strerror or exc})") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a JSON list of GPU descriptions, got {type(data).__name__}")
    return [_spec_from_json(i, entry, where) for i, entry in enumerate(data)]


def register(spec: GpuSpec) -> None:
    """Describe another GPU (takes precedence over the built-in table)."""
    _GPUS.insert(0, spec)


def known_gpus() -> list[GpuSpec]:
    """The table, user-registered and COSTMODEL_GPU_SPECS entries first."""
    return _extra_specs() + list(_GPUS)


def normalise_name(gpu_name: str) -> str:
    """A device name as lookup compares it: upper case, single spaces, no leading 'NVIDIA '."""
    up = " ".join(gpu_name.upper().split())
    return up[len("NVIDIA "):] if up.startswith("NVIDIA ") else up


def lookup(gpu_name: str) -> GpuSpec | None:
    """The first spec (known_gpus order) one of whose '|'-separated ``match`` names is gpu_name after
    normalise_name, or None. Exact names only: an unknown card is never taken for a known one."""
    if not isinstance(gpu_name, str):
        raise ValueError(f"gpu_name must be a str (a CUDA device name), got {type(gpu_name).__name__} {gpu_name!r}")
    want = normalise_name(gpu_name)
    for spec in known_gpus():
        if any(normalise_name(n) == want for n in spec.match.split("|")):
            return spec
    return None


def smem_per_block(spec: GpuSpec) -> int:
    """Largest shared memory one program may use (opt-in), bytes: the SM's minus the 1 KiB the
    driver reserves per block (H100 228 -> 227 KiB, A100 164 -> 163 KiB, sm86/sm89 100 -> 99 KiB)."""
    return int((spec.smem_per_sm_kb - 1) * 1024)


def spec_for(gpu_name: str) -> GpuSpec:
    """Like lookup, but raises a ValueError naming the GPU when it is unknown."""
    spec = lookup(gpu_name)
    if spec is None:
        raise ValueError(f"unknown GPU {gpu_name!r}: describe it with gemm_costmodel.kernels.hardware.register() "
                         "or COSTMODEL_GPU_SPECS")
    return spec


def as_dict(spec: GpuSpec) -> dict:
    """The spec's fields, for manifests."""
    return asdict(spec)


# -- a card by its numbers (issue 58) ---------------------------------------------------------------
# Dense tensor-core FLOP per clock per SM, 16-bit inputs, by arch: the datasheet peaks are
# SMs x boost clock x this (H100 SXM 132 x 1.83 GHz x 4096 = 989 TFLOP/s; A100 108 x 1.41 x 2048 = 312;
# L40S 142 x 2.52 x 1024 = 366). fp8 runs at twice the 16-bit rate where the arch has it.
_FLOP_PER_CLK_SM = {"sm80": 2048, "sm86": 1024, "sm87": 1024, "sm89": 1024, "sm90": 4096, "sm100": 8192,
                    "sm120": 2048}
_FP8_ARCHS = ("sm89", "sm90", "sm100", "sm120")
# What a probe reaches of the datasheet figure on a card the table knows, so a probed number lands
# on the table's scale (the features were fitted on datasheet figures): on one H200 a 1-4 GiB
# device copy moved 4.26-4.30 TB/s read + write against 4.8 datasheet (benchmarks/results/peers/
# h200-decode-probe/bandwidth.json), an 8192^3 bf16 product on random data 769-798 TFLOP/s against
# 989 (the device notes).
HBM_PROBE_FRACTION = 0.89
MATMUL_PROBE_FRACTION = 0.80


def probe_copy_gbps(device=None, nbytes: int = 1 << 31, reps: int = 10) -> float:
    """Device copy bandwidth in GB/s, bytes read + written: ``reps`` back-to-back copies of an
    ``nbytes`` buffer (far larger than any L2) between CUDA events, eagerly. Not through a CUDA graph:
    a graph holds a plain device copy as a memcpy node, which ran at 2.77 TB/s on an H200 where the
    same copy launched eagerly moved 4.26 TB/s (benchmarks/results/peers/h200-decode-probe/)."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).normal_()
    b = torch.empty_like(a)
    b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        b.copy_(a)
    e.record()
    e.synchronize()
    us = s.elapsed_time(e) * 1e3 / reps
    del a, b
    return 2 * (nbytes // 4) * 4 / us / 1e3


def probe_matmul_tflops(device=None, n: int = 8192, reps: int = 10) -> float:
    """bf16 n^3 matrix product rate on random data (TFLOP/s), mean of ``reps`` after a warm-up."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        c = a @ b
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        c = a @ b
    e.record()
    e.synchronize()
    del a, b, c
    return 2 * n**3 / (s.elapsed_time(e) * 1e-3 / reps) / 1e12


def describe(name: str, capability: tuple[int, int], props: dict, copy_gbps: float | None = None,
             matmul_tflops: float | None = None) -> GpuSpec:
    """A GpuSpec of a card the table lacks, from its numbers: ``props`` holds what the driver reports
    (sm_count, smem_per_sm_bytes, l2_bytes, and where known clock_khz, memory_clock_khz,
    memory_bus_bits); ``copy_gbps``/``matmul_tflops`` are probe readings (preferred; scaled to the
    datasheet scale by the probe fractions above). A ValueError names what is missing."""
    arch = f"sm{capability[0]}{capability[1]}"
    for f in ("sm_count", "smem_per_sm_bytes", "l2_bytes"):
        if not props.get(f):
            raise ValueError(f"cannot describe {name!r}: the driver reported no {f}")
    if copy_gbps:
        hbm = copy_gbps / HBM_PROBE_FRACTION
    elif props.get("memory_clock_khz") and props.get("memory_bus_bits"):
        hbm = 2 * props["memory_clock_khz"] * 1e3 * props["memory_bus_bits"] / 8 / 1e9  # double data rate
    else:
        raise ValueError(f"cannot describe {name!r}: no memory bandwidth (probe it: costmodel describe-gpu --probe)")
    if matmul_tflops:
        t16 = matmul_tflops / MATMUL_PROBE_FRACTION
    elif props.get("clock_khz") and arch in _FLOP_PER_CLK_SM:
        t16 = props["sm_count"] * props["clock_khz"] * 1e3 * _FLOP_PER_CLK_SM[arch] / 1e12
    else:
        raise ValueError(f"cannot describe {name!r}: no tensor-core rate for {arch} (probe it: costmodel describe-gpu "
                         "--probe)")
    return GpuSpec(name=name, match=name, arch=arch, sm_count=int(props["sm_count"]),
                   smem_per_sm_kb=props["smem_per_sm_bytes"] / 1024, l2_mb=props["l2_bytes"] / 2**20,
                   tflops_16bit=round(t16, 1), tflops_fp8=round(2 * t16, 1) if arch in _FP8_ARCHS else 0.0,
                   hbm_gbps=round(hbm))


def current_props(device=None) -> tuple[str, tuple[int, int], dict]:
    """(name, capability, driver numbers) of a CUDA device, as ``describe`` takes them (torch lazily;
    attributes a torch build lacks are left out)."""
    import torch

    dev = torch.cuda.current_device() if device is None else device
    p = torch.cuda.get_device_properties(dev)
    props = {"sm_count": int(p.multi_processor_count),
             "smem_per_sm_bytes": int(getattr(p, "shared_memory_per_multiprocessor", 0) or 0),
             "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0)}
    for ours, theirs in (("clock_khz", "clock_rate"), ("memory_clock_khz", "memory_clock_rate"),
                         ("memory_bus_bits", "memory_bus_width")):
        v = getattr(p, theirs, None)
        if v:
            props[ours] = int(v)
    return torch.cuda.get_device_name(dev), tuple(torch.cuda.get_device_capability(dev)), props


def describe_current(device=None, probe: bool = False) -> GpuSpec:
    """The current CUDA device as a GpuSpec from its driver numbers, and with ``probe`` from a
    short copy and matrix-product probe (about a second)."""
    name, cap, props = current_props(device)
    copy = probe_copy_gbps(device) if probe else None
    mm = probe_matmul_tflops(device) if probe else None
    return describe(name, cap, props, copy, mm)
