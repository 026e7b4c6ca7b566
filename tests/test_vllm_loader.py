"""Exported files through vLLM's own loader functions (vLLM 0.33.0 read from its source, not
imported; see gemm_costmodel.kernels.vllm.loader).

The vLLM source: COSTMODEL_VLLM_SRC (a wheel, e.g. from `pip download vllm==0.33.0 --no-deps`, or a
folder holding vllm/), else an installed vllm; without one every test here is skipped, saying so.

For the H100 SXM, H200 and H200 NVL names, `costmodel export-vllm --install` writes fused-MoE bf16,
fp8 (per-tensor) and fp8bs (128x128 block scales: ``block_shape=[128,128]``) files and block-fp8
linear files into a temp folder laid out as vLLM's (a
package folder, and a VLLM_TUNED_CONFIG_FOLDER); vLLM's get_moe_configs /
try_get_optimal_moe_config / get_w8a8_block_fp8_configs, run with that GPU name, must find and
parse every one: integer M keys, vLLM's grid, entries of exactly the six keys, each a parameter of
vLLM's kernel or a launch option, and no "Using default" warning."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemm_costmodel.cli import main as cli_main
from gemm_costmodel.kernels.vllm import loader, source
from gemm_costmodel.learning import vllm_export as V

SRC, WHY = source.find_source()
needs_src = pytest.mark.skipif(SRC is None, reason=WHY or "no vLLM source")
pytestmark = pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")

GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200 NVL")
# Layers vLLM ships no tuned file for on these GPUs (so a hit is our file, not vLLM's).
MOE = ((16, 3200, 4096, 2), (60, 1408, 2048, 4))
NK = ((5120, 8960), (3072, 5120))
SIX = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
LAUNCH_OPTIONS = {"num_warps", "num_stages"}
NAMES = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL",
         "NVIDIA GH200 480GB", "NVIDIA H20")


def _load(gpu, root, tuned=None):
    return loader.load(SRC, gpu, str(root), tuned_config_folder=str(tuned) if tuned else None)


@needs_src
@pytest.mark.parametrize("gpu", NAMES)
def test_our_device_names_are_vllms(gpu, tmp_path):
    L = _load(gpu, tmp_path)
    moe_part = L.get_config_file_name(8, 7168, None).split("device_name=")[1][:-len(".json")]
    assert V.device_name(gpu, V.KIND_MOE) == moe_part
    assert V.device_name(gpu, V.KIND_BLOCK_FP8) == L.get_device_name_as_file_name()
    assert V.moe_file_name(8, 7168, gpu, "fp8") == L.get_config_file_name(8, 7168, "fp8_w8a8")
    assert V.moe_file_name(8, 7168, gpu, "fp8bs") == L.get_config_file_name(8, 7168, "fp8_w8a8", [128, 128])


@needs_src
def test_the_source_is_the_version_the_exporter_follows():
    if SRC.version() != "0.33.0":
        pytest.skip(f"the vLLM source is {SRC.version()}; the exporter follows 0.33.0")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """{gpu: (package root, VLLM_TUNED_CONFIG_FOLDER)} after --install of every kind per GPU: MoE bf16
    into the tuned folder, MoE fp8 and fp8bs into the package's fused_moe/configs/ (no tuned folder
    set), block-fp8 into quantization/utils/configs/."""
    import os

    out = {}
    for gpu in GPUS:
        base = tmp_path_factory.mktemp(gpu.replace(" ", "_"))
        pkg = base / "site" / "vllm"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        tuned = base / "tuned"
        moe = [a for s in MOE for a in ("--moe", ",".join(map(str, s)))]
        old = os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)
        try:
            os.environ["VLLM_TUNED_CONFIG_FOLDER"] = str(tuned)
            assert cli_main(["export-vllm", "--op", "moe", *moe, "--gpu", gpu, "--install",
                             "--vllm-package", str(pkg)]) == 0
            del os.environ["VLLM_TUNED_CONFIG_FOLDER"]
            for dt in ("fp8", "fp8bs"):
                assert cli_main(["export-vllm", "--op", "moe", "--dtype", dt, *moe, "--gpu", gpu, "--install",
                                 "--vllm-package", str(pkg)]) == 0
            nk = [a for n, k in NK for a in ("--nk", f"{n},{k}")]
            assert cli_main(["export-vllm", *nk, "--gpu", gpu, "--install", "--vllm-package", str(pkg)]) == 0
        finally:
            os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)
            if old is not None:
                os.environ["VLLM_TUNED_CONFIG_FOLDER"] = old
        out[gpu] = (pkg.parent, tuned)
    return out


def _check_table(table, kernel_params, what):
    assert table, f"vLLM found no file for {what}"
    assert all(type(m) is int for m in table), what
    assert sorted(table) == list(V.VLLM_M_GRID), what
    for m, entry in table.items():
        assert tuple(entry) == SIX, (what, m)
        assert all(type(v) is int and v > 0 for v in entry.values()), (what, m)
        assert set(entry) <= set(kernel_params) | LAUNCH_OPTIONS, (what, m)


@needs_src
@pytest.mark.parametrize("gpu", GPUS)
def test_vllm_finds_and_parses_every_exported_file(installed, gpu):
    root, tuned = installed[gpu]
    moe_params = loader.kernel_parameters(SRC, source.FUSED_MOE_PY, "fused_moe_kernel")
    bs_params = loader.kernel_parameters(SRC, source.FP8_UTILS_PY, "_w8a8_triton_block_scaled_mm")
    L = _load(gpu, root, tuned)
    for e, n, k, top_k in MOE:
        for dtype in (None, "fp8_w8a8"):
            what = f"{gpu} E={e},N={n} dtype={dtype}"
            table = L.get_moe_configs(e, n, dtype)
            _check_table(table, moe_params, what)
            # vLLM's launch lookup: the file's nearest-M entry, the six keys as written.
            for m in (1, 3, 100, 5000):
                got = L.try_get_optimal_moe_config((e, 2 * n, k), (e, k, n), top_k, dtype, m)
                assert got == table[min(table, key=lambda x: abs(x - m))], (what, m)
        # Block-scaled fp8 (fp8bs): vLLM looks for ...,dtype=fp8_w8a8,block_shape=[128,128].json.
        what = f"{gpu} E={e},N={n} fp8_w8a8 block [128,128]"
        table = L.get_moe_configs(e, n, "fp8_w8a8", 128, 128)
        _check_table(table, moe_params, what)
        assert all(128 % entry["BLOCK_SIZE_K"] == 0 for entry in table.values()), what
        for m in (1, 3, 100, 5000):
            got = L.try_get_optimal_moe_config((e, 2 * n, k), (e, k, n), top_k, "fp8_w8a8", m, block_shape=[128, 128])
            assert got == table[min(table, key=lambda x: abs(x - m))], (what, m)
    for n, k in NK:
        _check_table(L.get_w8a8_block_fp8_configs(n, k, 128, 128), bs_params, f"{gpu} N={n},K={k}")
    assert not [msg for msg in L.logger.messages("warning") if "default" in msg.lower()]
    # bf16 came from the tuned folder (vLLM reads it first), fp8 from the package folder.
    used = " ".join(L.logger.messages("info"))
    assert str(tuned) in used and str(root / "vllm" / "model_executor" / "layers" / "fused_moe" / "configs") in used


@needs_src
def test_a_file_vllm_does_not_read_falls_back_to_its_default(installed, tmp_path):
    """The checks above can fail: a block-fp8 file in VLLM_TUNED_CONFIG_FOLDER, or an H200 NVL MoE file
    named NVIDIA_H200_NVL, is not read (the two mistakes of the export before issue 59)."""
    gpu = "NVIDIA H200 NVL"
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    body = json.dumps({"1": dict(zip(SIX, (16, 64, 128, 1, 4, 3)))})
    (tuned / f"N=5120,K=8960,device_name={V.device_name(gpu, V.KIND_BLOCK_FP8)},dtype=fp8_w8a8,"
              "block_shape=[128,128].json").write_text(body)
    (tuned / "E=16,N=3200,device_name=NVIDIA_H200_NVL.json").write_text(body)
    L = _load(gpu, tmp_path / "empty", tuned)
    assert L.get_w8a8_block_fp8_configs(5120, 8960, 128, 128) is None
    assert L.get_moe_configs(16, 3200, None) is None
    assert len([m for m in L.logger.messages("warning") if "default" in m.lower()]) == 2


def test_the_loader_names_what_it_lacks():
    text = "def f(x):\n    from vllm.foo import bar\n    return bar(x) + baz\n"
    with pytest.raises(loader.LoaderError, match="imports bar"):
        loader.exec_functions(text, ("f",), {}, "x.py")
    with pytest.raises(loader.LoaderError, match="uses baz"):
        loader.exec_functions(text, ("f",), {"bar": abs}, "x.py")
    with pytest.raises(loader.LoaderError, match="no function g"):
        loader.exec_functions(text, ("f",), {"bar": abs, "baz": 1}, "x.py", required=("g",))
    assert loader.exec_functions(text, ("f",), {"bar": abs, "baz": 1}, "x.py")["f"](-2) == 3


def test_source_lookup_says_why_without_one(tmp_path, monkeypatch):
    monkeypatch.setenv(source.ENV_SRC, str(tmp_path / "missing.whl"))
    monkeypatch.setattr(source, "installed_package_dir", lambda: None)
    src, why = source.find_source()
    assert src is None and "missing.whl" in why and source.ENV_SRC in why
