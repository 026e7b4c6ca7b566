"""vLLM's tuned tables kept as data (datasets/vllm/0.33.0/): every file is the one PROVENANCE.json
names, byte for byte (its sha256), the MANIFEST lists exactly the JSON files, and the baselines
read them by default. With a vLLM 0.33.0 source (COSTMODEL_VLLM_SRC: a wheel or a folder holding
vllm/), each file is also compared with the wheel's own."""
import csv
import hashlib
import json
import os

import pytest

from gemm_costmodel.kernels.fp8_blockscale import baselines as BB
from gemm_costmodel.kernels.moe import baselines as MB
from gemm_costmodel.kernels.vllm import source, tables

ROOT = tables.tables_root()


def _provenance() -> dict:
    with open(os.path.join(ROOT, "PROVENANCE.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_every_file_is_the_one_its_provenance_names():
    prov = _provenance()
    assert prov["version"] == "0.33.0" and prov["license"] == "Apache-2.0"
    on_disk = {f"{sub}/{n}" for sub in tables.SUBDIRS.values() for n in os.listdir(os.path.join(ROOT, sub))
               if n.endswith(".json")} | {"LICENSE"}
    assert set(prov["files"]) == on_disk
    for rel, rec in prov["files"].items():
        with open(os.path.join(ROOT, rel), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == rec["sha256"], f"{rel} was edited"


@pytest.mark.parametrize("kind", tables.SUBDIRS)
def test_manifest_lists_the_json_files(kind):
    folder = tables.tables_dir(kind)
    with open(os.path.join(folder, "MANIFEST.csv"), encoding="utf-8") as fh:
        listed = {r["file"] for r in csv.DictReader(fh)}
    assert listed == {n for n in os.listdir(folder) if n.endswith(".json")}
    # H100 SXM and H200 names only (the GPUs the product serves).
    assert all(("NVIDIA_H100_80GB_HBM3" in n) != ("NVIDIA_H200" in n) for n in listed)


def test_baselines_read_the_repositorys_tables(monkeypatch):
    monkeypatch.delenv(MB.ENV_VLLM_DIR, raising=False)
    monkeypatch.delenv(BB.ENV_VLLM_DIR, raising=False)
    assert MB.default_vllm_dir() == tables.tables_dir(tables.KIND_MOE)
    assert BB.default_vllm_dir() == tables.tables_dir(tables.KIND_BLOCK_FP8)
    assert len(MB.load_vllm_tables(gpu_name="NVIDIA H200")) > 0
    assert len(BB.load_vllm_tables(gpu_name="NVIDIA H200")) == 23
    # vLLM's rules: an H200 NVL runs the H200's MoE files but has no block-fp8 file of its own.
    assert MB.load_vllm_tables(gpu_name="NVIDIA H200 NVL") == MB.load_vllm_tables(gpu_name="NVIDIA H200")
    assert BB.load_vllm_tables(gpu_name="NVIDIA H200 NVL") == {}


def test_files_are_the_wheels():
    src, why = source.find_source()
    if src is None:
        pytest.skip(why)
    if src.version() != "0.33.0":
        pytest.skip(f"the vLLM source is {src.version()}, the tables are 0.33.0's")
    for rel, rec in _provenance()["files"].items():
        with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
            assert fh.read() == src.read(rec["source_path"]), rel
