"""GPU table: name lookup, unknown GPUs, and adding a GPU without code changes."""
from __future__ import annotations

import json

import pytest

from gemm_costmodel import hardware as H


@pytest.fixture(autouse=True)
def _isolated_table(monkeypatch):
    """register() mutates the module table: give every test its own copy, and no env specs."""
    monkeypatch.setattr(H, "_GPUS", list(H._GPUS))
    monkeypatch.delenv("COSTMODEL_GPU_SPECS", raising=False)


@pytest.mark.parametrize("device_name, spec", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("nvidia h100 80gb hbm3", "H100 SXM"),  # case-insensitive
])
def test_lookup_known(device_name, spec):
    s = H.lookup(device_name)
    assert s is not None and s.name == spec
    assert H.spec_for(device_name) == s


def test_known_numbers():
    h100, h200 = H.spec_for("NVIDIA H100 80GB HBM3"), H.spec_for("NVIDIA H200")
    assert h100.arch == h200.arch == "sm90"
    assert h100.sm_count == h200.sm_count == 132
    assert h200.hbm_gbps > h100.hbm_gbps
    assert h200.peak_tflops("fp8") == 1979 and h200.peak_tflops("bf16") == 989
    assert h200.peak_tflops("fp32") == 989 / 2
    a100 = H.spec_for("NVIDIA A100-SXM4-80GB")
    assert a100.peak_tflops("fp8") == a100.tflops_16bit  # no fp8 tensor cores: falls back to the 16-bit peak


def test_unknown_gpu():
    assert H.lookup("Imaginary GPU X1") is None
    with pytest.raises(ValueError, match="Imaginary GPU X1"):
        H.spec_for("Imaginary GPU X1")


def test_register_adds_a_gpu_first():
    spec = H.GpuSpec("X1", "IMAGINARY GPU X1", "sm90", 100, 228, 40, 500, 1000, 3000)
    H.register(spec)
    assert H.lookup("Imaginary GPU X1 64GB") == spec
    assert H.known_gpus()[0] == spec
    # Precedence over the built-in table: a registered 'H200' override wins.
    over = H.GpuSpec("H200 custom", "H200", "sm90", 1, 1, 1, 1, 1, 1)
    H.register(over)
    assert H.spec_for("NVIDIA H200") == over


def test_register_is_undone_by_fixture():
    assert H.lookup("Imaginary GPU X1") is None


def test_env_json_adds_a_gpu(monkeypatch, tmp_path):
    fields = {"name": "X2", "match": "Imaginary X2", "arch": "sm100", "sm_count": 148, "smem_per_sm_kb": 228,
              "l2_mb": 126, "tflops_16bit": 2250, "tflops_fp8": 4500, "hbm_gbps": 8000}
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([fields]))
    assert H.lookup("NVIDIA Imaginary X2") is None
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    s = H.spec_for("NVIDIA Imaginary X2")
    assert H.as_dict(s) == fields
    assert s.peak_tflops("fp8") == 4500


def test_as_dict_round_trips():
    s = H.spec_for("NVIDIA H200")
    assert H.GpuSpec(**H.as_dict(s)) == s
