"""The runtime on GPUs the model was not trained for: candidates come only from the GPU's arch space
(sm90 full, sm80 without the TMA variants), any other or unknown arch gets the vendor library with one
DispatchWarning, fp8 without fp8 tensor cores is a ValueError; bad gpu_name / COSTMODEL_GPU_SPECS are
one-line ValueErrors.

No test here may depend on the machine's GPU: ``current_gpu_capability`` (torch's answer for the
current device) is replaced by a stub in every test.
"""
import json
import os
import warnings

import pytest

from gemm_costmodel.kernels import hardware as H
from gemm_costmodel.serving import runtime
from gemm_costmodel.serving.candidates import table
from gemm_costmodel.kernels.gemm.space import Problem, check_feasible, config_from_id, generate_configs
from gemm_costmodel.serving.runtime import Choice, DispatchWarning, Dispatcher, seal_manifest

from test_runtime import tiny_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "models")
A100 = "NVIDIA A100-SXM4-80GB"
REAL_CAPABILITY = runtime.current_gpu_capability  # before the autouse fixture stubs it
# Decode, skinny, odd, square and large shapes: the heuristic asks for split-K, tiled and persistent here.
SHAPES = [(1, 4096, 4096), (16, 14336, 4096), (64, 4096, 4096), (7, 4097, 1), (300, 1000, 777),
          (2048, 4096, 4096), (8192, 8192, 8192)]
# fp8 shapes the vendor can run (torch._scaled_mm: K and N multiples of 16).
FP8_SHAPES = [(1, 4096, 4096), (16, 14336, 4096), (300, 1024, 768), (8192, 8192, 8192)]


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """No current CUDA device answers for any name (tests that simulate one patch it again), and the
    GPU table is the built-in one."""
    monkeypatch.setattr(runtime, "current_gpu_capability", lambda name: None)
    monkeypatch.setattr(H, "_GPUS", list(H._GPUS))
    monkeypatch.delenv("COSTMODEL_GPU_SPECS", raising=False)


def _decide_all(d, problems):
    """select and rank for every (m, n, k, dtype); returns the choices and the DispatchWarning messages."""
    choices = []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for m, n, k, dtype in problems:
            c = d.select(m, n, k, dtype)
            r = d.rank(m, n, k, dtype, count=8)
            assert r[0].candidate == c.candidate
            choices.append(((m, n, k, dtype), c, r))
    return choices, [str(w.message) for w in rec if issubclass(w.category, DispatchWarning)]


def _problems(dtypes=("bf16", "fp16", "fp8")):
    return [(m, n, k, dt) for dt in dtypes for m, n, k in (FP8_SHAPES if dt == "fp8" else SHAPES)]


# -- no candidate space for the arch: the vendor library ------------------------------------------

@pytest.mark.parametrize("gpu, arch, reason", [
    ("Tesla T4", None, "unknown GPU 'Tesla T4', arch unknown"),
    ("NVIDIA GeForce RTX 4090", None, "unknown GPU 'NVIDIA GeForce RTX 4090', arch unknown"),
    ("", None, "unknown GPU '', arch unknown"),
    ("NVIDIA L40S", "sm89", "'NVIDIA L40S' is sm89: Triton candidate spaces exist only for sm80, sm90"),
])
def test_gpu_without_a_candidate_space_gets_the_vendor_library(gpu, arch, reason):
    d = Dispatcher(gpu_name=gpu, models_dir=SHIPPED)
    assert d.arch == arch and d.space_arch is None
    choices, warned = _decide_all(d, _problems())
    for _, c, r in choices:
        assert c == Choice("cublas", "vendor") and r == [c]
    assert len(warned) == 1 and warned[0].startswith(f"gemm_costmodel: falling back to the vendor library "
                                                      f"(cublas): {reason}"), warned
    assert all(reason in d.fallback_reasons[dt] for dt in ("bf16", "fp16", "fp8"))


def test_vendor_only_fp8_needs_k_and_n_multiples_of_16():
    d = Dispatcher(gpu_name="NVIDIA L40S", models_dir=SHIPPED)
    for n, k in ((4097, 4096), (4096, 4100)):
        with pytest.raises(ValueError, match=r"^K and N must be multiples of 16 for fp8 on 'NVIDIA L40S' \(sm89\)"):
            d.select(16, n, k, "fp8")


def test_vendor_only_gpu_serves_a_tuned_cublas_entry_and_ignores_triton_ones():
    tuned = {"bf16:16x4096x4096": "cublas", "bf16:32x4096x4096": "tiled_m64n128k64_g8_w4s4"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)
        d = Dispatcher(gpu_name="Tesla T4", models_dir=SHIPPED, tuned_table=tuned)
        assert d.select(16, 4096, 4096, "bf16") == Choice("cublas", "table")
        assert d.select(32, 4096, 4096, "bf16") == Choice("cublas", "vendor")


# -- A100 (sm80): the sm80 space, no fp8 ---------------------------------------------------------------

def _assert_runs_on_sm80(cid, m, n, k, dtype):
    cfg = config_from_id(cid)
    assert cfg.variant not in ("persistent", "swapab_tma"), cid
    assert cfg in generate_configs("sm80", dtype)
    ok, why = check_feasible(cfg, Problem(m, n, k, dtype), "sm80")
    assert ok, (cid, why)


def test_a100_gets_sm80_candidates_from_the_heuristic():
    d = Dispatcher(gpu_name=A100, models_dir=SHIPPED)
    assert (d.arch, d.space_arch, d.fp8_supported) == ("sm80", "sm80", False)
    choices, warned = _decide_all(d, _problems(("bf16", "fp16")))
    for (m, n, k, dtype), c, r in choices:
        assert c.source == "heuristic" and r == [c]
        _assert_runs_on_sm80(c.candidate, m, n, k, dtype)
    # The sm90 heuristic's pick for 8192^3 is persistent 128x256; on sm80 it snaps to a tiled config.
    big = next(c for p, c, _ in choices if p == (8192, 8192, 8192, "bf16"))
    assert big.candidate.startswith("tiled_m128n256k64")
    # The shipped sm90 model does not serve sm80: one warning says so.
    assert warned == ["gemm_costmodel: falling back to the heuristic: gemm-sm90.json is for arch sm90, "
                      "this GPU is sm80"]


@pytest.mark.parametrize("shape", FP8_SHAPES + [(7, 4097, 1)], ids=lambda s: "x".join(map(str, s)))
def test_a100_fp8_is_a_value_error(shape):
    d = Dispatcher(gpu_name=A100, models_dir=SHIPPED)
    msg = r"^dtype fp8 is not supported on 'NVIDIA A100-SXM4-80GB' \(sm80\): no fp8 tensor cores"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)  # refused before any fallback is considered
        with pytest.raises(ValueError, match=msg):
            d.select(*shape, "fp8")
        with pytest.raises(ValueError, match=msg):
            d.rank(*shape, "fp8", count=4)
    with pytest.raises(ValueError, match="dtype fp8 has no candidates on sm80"):
        table("sm80", "fp8", op="gemm")


def test_a100_ignores_tuned_entries_it_cannot_run():
    tuned = {"bf16:4096x4096x4096": "persistent_m128n128k64_g8_w8s3", "bf16:2048x4096x4096": "tiled_m64n128k64_g8_w4s4"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)
        d = Dispatcher(gpu_name=A100, models_dir=SHIPPED, tuned_table=tuned)
        c = d.select(4096, 4096, 4096, "bf16")
        assert c.source == "heuristic"
        _assert_runs_on_sm80(c.candidate, 4096, 4096, 4096, "bf16")
        assert d.select(2048, 4096, 4096, "bf16") == Choice("tiled_m64n128k64_g8_w4s4", "table")


def test_a_model_for_sm80_scores_only_sm80_candidates(tmp_path_factory, tmp_path):
    # The tiny sm90 model relabelled sm80 (the manifest only; the .onnx is unchanged, so it still verifies).
    src = tiny_model_dir(tmp_path_factory)
    for ext in (".json", ".onnx"):
        data = open(os.path.join(src, "gemm-sm90" + ext), "rb").read()
        (tmp_path / f"gemm-sm80{ext}").write_bytes(data)
    man = json.loads((tmp_path / "gemm-sm80.json").read_text())
    man["arch"] = "sm80"
    # ... and its space that of sm80 (a manifest names the space it was trained on).
    man["config_space_hash"] = {d: table("sm80", d, op="gemm").space_hash for d in man["config_space_hash"] if d != "fp8"}
    (tmp_path / "gemm-sm80.json").write_text(json.dumps(seal_manifest(man)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchWarning)
        d = Dispatcher(gpu_name=A100, models_dir=str(tmp_path))
        for m, n, k in SHAPES:
            ranked = d.rank(m, n, k, "fp16", count=1000)
            assert all(c.source == "model" for c in ranked)
            for c in ranked:
                _assert_runs_on_sm80(c.candidate, m, n, k, "fp16")
            # Every sm80-feasible candidate on the model's shortlist was scored (none lost, none added).
            assert len(ranked) <= int(table("sm80", "fp16", op="gemm").feasible_mask(m, n, k).sum())


# -- a GPU missing from the table, but present: its arch from torch -----------------------------------

@pytest.mark.parametrize("capability, arch, space", [((9, 0), "sm90", "sm90"), ((8, 0), "sm80", "sm80"),
                                                     ((8, 6), "sm86", None), ((8, 9), "sm89", None),
                                                     ((7, 5), "sm75", None), ((12, 0), "sm120", None)])
def test_unknown_name_of_the_current_device_takes_its_arch_from_torch(monkeypatch, capability, arch, space):
    name = "NVIDIA Imaginary Z9"
    asked = []

    def capability_of(gpu_name):
        asked.append(gpu_name)
        return capability if gpu_name == name else None

    monkeypatch.setattr(runtime, "current_gpu_capability", capability_of)
    d = Dispatcher(gpu_name=name, models_dir=SHIPPED)
    assert asked == [name] and d.spec is None
    assert (d.arch, d.space_arch) == (arch, space)
    assert d.fp8_supported is (capability >= (8, 9))
    dtypes = ("bf16", "fp16", "fp8") if d.fp8_supported else ("bf16", "fp16")
    choices, warned = _decide_all(d, _problems(dtypes))
    assert len(warned) == 1, warned
    for (m, n, k, dtype), c, _ in choices:
        if space is None:
            assert c == Choice("cublas", "vendor")
        else:
            # No GPU numbers for the model's features: the heuristic decides, over the arch's own space.
            assert c.source == "heuristic"
            assert check_feasible(config_from_id(c.candidate), Problem(m, n, k, dtype), space)[0]
    assert ("vendor library" if space is None else "unknown GPU 'NVIDIA Imaginary Z9'") in warned[0]
    if not d.fp8_supported:
        with pytest.raises(ValueError, match=rf"^dtype fp8 is not supported on 'NVIDIA Imaginary Z9' \({arch}\)"):
            d.select(16, 4096, 4096, "fp8")


def test_known_gpus_do_not_ask_torch(monkeypatch):
    def never(gpu_name):
        raise AssertionError("the hardware table answers for a known GPU")

    monkeypatch.setattr(runtime, "current_gpu_capability", never)
    d = Dispatcher(gpu_name="NVIDIA H100 80GB HBM3", models_dir=SHIPPED)
    assert (d.arch, d.space_arch, d.fp8_supported) == ("sm90", "sm90", True)
    assert d.select(16, 4096, 4096, "fp8").source == "model"


def test_capability_helpers():
    assert runtime.arch_of_capability((9, 0)) == "sm90"
    assert runtime.arch_of_capability((8, 6)) == "sm86"
    assert runtime.arch_of_capability((10, 0)) == "sm100"


def test_current_gpu_capability_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert REAL_CAPABILITY("NVIDIA H100 80GB HBM3") is None
    assert REAL_CAPABILITY("") is None


# -- GPU descriptions from the table or COSTMODEL_GPU_SPECS decide the space ----------------------

def _spec(**over):
    fields = {"name": "X2", "match": "Imaginary X2", "arch": "sm80", "sm_count": 84, "smem_per_sm_kb": 164,
              "l2_mb": 40, "tflops_16bit": 200, "tflops_fp8": 0, "hbm_gbps": 1500}
    fields.update(over)
    return fields


def test_env_described_gpu_gets_its_archs_space(monkeypatch, tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([_spec(), _spec(name="X3", match="Imaginary X3", arch="sm100", tflops_fp8=4500)]))
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    d = Dispatcher(gpu_name="NVIDIA Imaginary X2", models_dir=SHIPPED)
    assert (d.arch, d.space_arch, d.fp8_supported) == ("sm80", "sm80", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DispatchWarning)
        c = d.select(4096, 4096, 4096, "bf16")
    _assert_runs_on_sm80(c.candidate, 4096, 4096, 4096, "bf16")
    with pytest.raises(ValueError, match="^dtype fp8 is not supported"):
        d.select(16, 4096, 4096, "fp8")
    d3 = Dispatcher(gpu_name="NVIDIA Imaginary X3", models_dir=SHIPPED)
    _, warned = _decide_all(d3, [(16, 4096, 4096, "fp8"), (16, 4096, 4096, "bf16")])
    assert warned == ["gemm_costmodel: falling back to the vendor library (cublas): 'NVIDIA Imaginary X3' is "
                      "sm100: Triton candidate spaces exist only for sm80, sm90"]


# -- bad configuration: one-line ValueErrors -------------------------------------------------------

@pytest.mark.parametrize("bad", [123, 1.5, b"NVIDIA H100", ["NVIDIA H100"]], ids=repr)
def test_gpu_name_not_a_string(bad):
    with pytest.raises(ValueError, match=r"^gpu_name must be a str \(a CUDA device name\), got ") as exc:
        Dispatcher(gpu_name=bad, models_dir=SHIPPED)
    assert "\n" not in str(exc.value) and repr(bad) in str(exc.value)
    with pytest.raises(ValueError, match="^gpu_name must be a str"):
        H.lookup(bad)


def test_bad_gpu_specs_file_is_a_one_line_error(monkeypatch, tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text("[{not json")
    monkeypatch.setenv("COSTMODEL_GPU_SPECS", str(path))
    with pytest.raises(ValueError) as exc:
        Dispatcher(gpu_name="NVIDIA H100 80GB HBM3", models_dir=SHIPPED)
    msg = str(exc.value)
    assert msg.startswith(f"COSTMODEL_GPU_SPECS={path}: not valid JSON (") and "\n" not in msg
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no JSONDecodeError chained


def test_a_model_of_another_config_space_is_skipped_with_the_reason(tmp_path_factory, tmp_path):
    """A model trained before the space changed (e.g. before the GEMV variant) never saw the new
    candidates: the dispatcher falls back and says why, naming both hashes."""
    src = tiny_model_dir(tmp_path_factory)
    for ext in (".json", ".onnx"):
        (tmp_path / f"gemm-sm90{ext}").write_bytes(open(os.path.join(src, "gemm-sm90" + ext), "rb").read())
    man = json.loads((tmp_path / "gemm-sm90.json").read_text())
    current = table("sm90", "fp16", op="gemm").space_hash
    assert man["config_space_hash"]["fp16"] == current
    man["config_space_hash"]["fp16"] = "0123456789abcdef"
    (tmp_path / "gemm-sm90.json").write_text(json.dumps(seal_manifest(man)))
    d = Dispatcher(gpu_name="NVIDIA H100 80GB HBM3", models_dir=str(tmp_path))
    with pytest.warns(DispatchWarning, match="config space 0123456789abcdef for fp16, this code's is " + current):
        assert d.select(64, 4096, 4096, "fp16").source == "heuristic"
    # Manifests without the field are served unchecked.
    del man["config_space_hash"]
    (tmp_path / "gemm-sm90.json").write_text(json.dumps(seal_manifest(man)))
    d = Dispatcher(gpu_name="NVIDIA H100 80GB HBM3", models_dir=str(tmp_path))
    assert d.select(64, 4096, 4096, "fp16").source == "model"
