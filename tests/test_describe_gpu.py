"""A card the hardware table lacks is described by its numbers (issue 58, deliverable 4)."""
from __future__ import annotations

import warnings

import pytest

from gemm_costmodel.kernels import hardware
from gemm_costmodel.serving import runtime

H200_PROPS = {"sm_count": 132, "smem_per_sm_bytes": 228 * 1024, "l2_bytes": 60 * 2**20}


def test_probe_numbers_land_on_the_datasheet_scale():
    # The H200's own probe readings (4.26-4.30 TB/s copy, 769-798 TFLOP/s) give back its table row
    # within 4%: the scale the model's hardware features were fitted on.
    s = hardware.describe("NVIDIA H200", (9, 0), H200_PROPS, copy_gbps=4296, matmul_tflops=788)
    row = hardware.lookup("NVIDIA H200")
    assert s.arch == "sm90" and s.sm_count == 132 and s.l2_mb == 60 and s.smem_per_sm_kb == 228
    assert abs(s.hbm_gbps / row.hbm_gbps - 1) < 0.04
    assert abs(s.tflops_16bit / row.tflops_16bit - 1) < 0.04
    assert s.tflops_fp8 == 2 * s.tflops_16bit


def test_driver_numbers_without_a_probe():
    # 1,980 MHz x 132 SMs x 4,096 FLOP/clk = 1,070 TFLOP/s; 3,201 MHz DDR x 6,144 bits = 4,917 GB/s.
    props = dict(H200_PROPS, clock_khz=1_980_000, memory_clock_khz=3_201_000, memory_bus_bits=6144)
    s = hardware.describe("NVIDIA H200 NVL 2", (9, 0), props)
    assert s.tflops_16bit == pytest.approx(1070.5, abs=0.1)
    assert s.hbm_gbps == 4917
    # sm80 has no fp8 tensor cores.
    assert hardware.describe("NVIDIA A800", (8, 0), props).tflops_fp8 == 0.0


@pytest.mark.parametrize("missing", ["sm_count", "smem_per_sm_bytes", "l2_bytes"])
def test_missing_driver_number_is_named(missing):
    props = dict(H200_PROPS, clock_khz=1, memory_clock_khz=1, memory_bus_bits=1)
    props.pop(missing)
    with pytest.raises(ValueError, match=missing):
        hardware.describe("X", (9, 0), props)


def test_no_bandwidth_says_probe():
    with pytest.raises(ValueError, match="--probe"):
        hardware.describe("X", (9, 0), dict(H200_PROPS, clock_khz=1_980_000))


def test_dispatcher_ranks_for_a_described_card(monkeypatch):
    # An unknown card that is the current device gets a spec (so the model, not the fallback rule,
    # ranks for it) and a DispatchWarning saying how it was described.
    name = "NVIDIA H200 Test Edition"
    spec = hardware.describe(name, (9, 0), H200_PROPS, copy_gbps=4296, matmul_tflops=788)
    monkeypatch.setattr(runtime, "current_gpu_properties", lambda g: {"sm_count": 132, "smem_per_block": 232448,
                                                                       "l2_bytes": 60 * 2**20})
    monkeypatch.setattr(runtime, "current_gpu_capability", lambda g: (9, 0))
    monkeypatch.setattr(runtime, "described_current_gpu", lambda g: spec if g == name else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = runtime.Dispatcher(op="moe", gpu_name=name)
    assert d.spec == spec and d.described == spec and d.arch == "sm90"
    assert d.model_for("bf16") is not None, d.fallback_reasons  # the MoE model: sm90, every card


def test_a_card_that_cannot_be_described_keeps_the_fallback(monkeypatch):
    monkeypatch.setattr(runtime, "current_gpu_properties", lambda g: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = runtime.Dispatcher(op="gemm", gpu_name="NVIDIA Mystery 9000")
    assert d.spec is None and d.described is None
    assert d.model_for("bf16") is None and "unknown GPU" in d.fallback_reasons["bf16"]
