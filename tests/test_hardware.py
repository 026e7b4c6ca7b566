"""GPU table: name lookup, unknown GPUs, and adding a GPU without code changes."""
from __future__ import annotations

import json

import pytest

from gemm_costmodel.kernels import hardware as H


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
    assert H.lookup("NVIDIA Imaginary  GPU X1") == spec  # exact name, normalised
    assert H.lookup("Imaginary GPU X1 64GB") is None  # never a substring (issue 57, row 5)
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


def test_lookup_needs_a_string():
    for bad in (123, None, b"NVIDIA H200"):
        with pytest.raises(ValueError, match=r"^gpu_name must be a str \(a CUDA device name\), got "):
            H.lookup(bad)


GOOD = {"name": "X2", "match": "Imaginary X2", "arch": "sm100", "sm_count": 148, "smem_per_sm_kb": 228,
        "l2_mb": 126, "tflops_16bit": 2250, "tflops_fp8": 4500, "hbm_gbps": 8000}


@pytest.mark.parametrize("content, problem", [
    ("[{not json", r"not valid JSON \(Expecting property name enclosed in double quotes: line 1 column 3"),
    ("", r"not valid JSON \(Expecting value: line 1 column 1"),
    (json.dumps(GOOD), "expected a JSON list of GPU descriptions, got dict"),
    (json.dumps("H100"), "expected a JSON list of GPU descriptions, got str"),
    (json.dumps([GOOD, [1, 2]]), "entry 1 must be an object with the fields name, match, arch, sm_count, "),
    (json.dumps([{k: v for k, v in GOOD.items() if k not in ("arch", "hbm_gbps")}]),
     r"entry 0: missing field\(s\) arch, hbm_gbps \(fields: name, match, arch, "),
    (json.dumps([{**GOOD, "tflops_bf16": 1, "vendor": "x"}]), r"entry 0: unknown field\(s\) tflops_bf16, vendor "),
    (json.dumps([{**GOOD, "sm_count": "132"}]), "entry 0: sm_count must be an int >= 1, got '132'"),
    (json.dumps([{**GOOD, "sm_count": 132.0}]), "entry 0: sm_count must be an int >= 1, got 132.0"),
    (json.dumps([{**GOOD, "match": ""}]), "entry 0: match must be a non-empty string, got ''"),
    (json.dumps([{**GOOD, "arch": 90}]), "entry 0: arch must be a non-empty string, got 90"),
    (json.dumps([{**GOOD, "hbm_gbps": None}]), "entry 0: hbm_gbps must be a number > 0, got None"),
    (json.dumps([{**GOOD, "l2_mb": True}]), "entry 0: l2_mb must be a number > 0, got True"),
    (json.dumps([{**GOOD, "tflops_fp8": -1}]), r"entry 0: tflops_fp8 must be a number >= 0 \(0: no fp8 tensor cores\)"),
], ids=lambda v: v[:40] if isinstance(v, str) else v)
def test_bad_env_json_is_a_one_line_value_error(monkeypatch, tmp_path, content, problem):
    path = tmp_path / "gpus.json"
    path.write_text(content)
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    for call in (H.lookup, H.spec_for):
        with pytest.raises(ValueError, match=rf"^COSTMODEL_GPU_SPECS={path}: {problem}") as exc:
            call("NVIDIA H200")
        assert "\n" not in str(exc.value)
        # No JSONDecodeError/TypeError traceback chained to the one line.
        assert exc.value.__cause__ is None and (exc.value.__context__ is None or exc.value.__suppress_context__)


def test_env_json_file_missing_or_not_utf8(monkeypatch, tmp_path):
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(tmp_path / "nowhere.json"))
    with pytest.raises(ValueError, match=rf"^COSTMODEL_GPU_SPECS={tmp_path}/nowhere.json: cannot read the file "
                                         r"\(No such file or directory\)$"):
        H.lookup("NVIDIA H200")
    path = tmp_path / "latin1.json"
    path.write_bytes(b'[{"name": "\xe9"}]')
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    with pytest.raises(ValueError, match=rf"^COSTMODEL_GPU_SPECS={path}: not valid JSON \('utf-8' codec"):
        H.lookup("NVIDIA H200")


def test_env_json_empty_list_adds_nothing(monkeypatch, tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text("[]")
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    assert H.known_gpus() == H._GPUS
    assert H.spec_for("NVIDIA H200").name == "H200"
