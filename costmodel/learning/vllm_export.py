"""Export the dispatcher's picks as vLLM tuned-config files (``costmodel export-vllm``).

vLLM's w8a8 block-fp8 linear (op ``fp8_blockscale``) looks up, per (N, K) and GPU, a JSON
file ``N={N},K={K},device_name={gpu},dtype=fp8_w8a8,block_shape=[128,128].json`` whose body
maps token counts M to its Triton kernel's launch config ({BLOCK_SIZE_M, BLOCK_SIZE_N,
BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}); an M missing from the file takes the
nearest key. This module writes such files for any (N, K), so that vLLM runs tuned configs
for shapes its own tables do not cover.

vLLM's kernel is this project's tiled variant only (BsTiledConfig: the same six keys), so per
M the file holds the best-ranked tiled config of the dispatcher's ranking; when the ranking
has none (the fallback rule without a model returns one choice, e.g. split-K for decode),
vLLM's default config. Where each entry came from is printed, and recorded in a sidecar
(``SIDECAR``) beside the files: vLLM's loader reads only the six keys, so the files hold
nothing else.

Torch-free: only the dispatcher (numpy, onnxruntime) and the op's space are imported.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from gemm_costmodel import registry

# The ops whose kernel vLLM runs from such files.
SUPPORTED_OPS = ("fp8_blockscale",)

# vLLM's M grid: the keys of every w8a8 block-fp8 file tuned for NVIDIA_H100_80GB_HBM3 (and
# NVIDIA_H200) in vLLM 0.33.0 (model_executor/layers/quantization/utils/configs/; copies in
# ../shared/external/vllm_w8a8_block_fp8_configs/, all 46 files share these 18 keys).
VLLM_M_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)

# vLLM's dtype tag and block_shape ([block_n, block_k]) of the files: the op's scale groups.
DTYPE_TAG = "fp8_w8a8"
# The dtype the dispatcher ranks: the op's one served dtype.
DISPATCH_DTYPE = "fp8"

# Where each entry came from: the model's ranking, the op's fallback rule (no usable model),
# or vLLM's default config (the ranking held no tiled config).
SOURCE_MODEL, SOURCE_RULE, SOURCE_DEFAULT = "model", "rule", "default"
_SOURCES = {"model": SOURCE_MODEL, "heuristic": SOURCE_RULE}

SIDECAR = "costmodel-export-vllm.provenance.json"
SIDECAR_FORMAT = "gemm_costmodel.vllm_export/1"

DEFAULT_GPU = "NVIDIA H100 80GB HBM3"


def _space():
    return registry.get("fp8_blockscale").space_module()


def block_shape() -> tuple[int, int]:
    """vLLM's block_shape [block_n, block_k]: the op's weight-scale block."""
    s = _space()
    return s.GROUP_N, s.GROUP_K


def device_name(gpu_name: str) -> str:
    """vLLM's device_name of a GPU: the CUDA device name with spaces replaced by '_'."""
    return gpu_name.replace(" ", "_")


def file_name(n: int, k: int, gpu_name: str) -> str:
    """vLLM's file name of the (N, K) table for this GPU."""
    bn, bk = block_shape()
    return f"N={n},K={k},device_name={device_name(gpu_name)},dtype={DTYPE_TAG},block_shape=[{bn},{bk}].json"


# A file name as file_name writes it (and vLLM reads it): N, K, device name.
FILE_NAME_RE = re.compile(r"^N=(\d+),K=(\d+),device_name=([^,/\\ ]+),dtype=fp8_w8a8,block_shape=\[128,128\]\.json$")

_NK_RE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*$")


def parse_nk(text: str) -> tuple[int, int]:
    """'N,K' -> (N, K), both positive ints; ValueError saying the expected form."""
    m = _NK_RE.match(text) if isinstance(text, str) else None
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"--nk {text!r}: expected N,K with positive integers (the weight is N x K), "
                         "e.g. --nk 5120,8960")
    return int(m.group(1)), int(m.group(2))


def check_op(op: str) -> None:
    """ValueError unless vLLM runs op's kernel from tuned files."""
    if op not in SUPPORTED_OPS:
        raise ValueError(f"export-vllm supports --op {', '.join(SUPPORTED_OPS)} (vLLM's w8a8 block-fp8 linear); "
                         f"got {op!r}")


@dataclass
class VllmTable:
    """One vLLM file: its (N, K) and GPU, the JSON body, and per M the config id and its source."""

    n: int
    k: int
    gpu_name: str
    entries: dict[str, dict] = field(default_factory=dict)
    picks: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        return file_name(self.n, self.k, self.gpu_name)

    def counts(self) -> dict[str, int]:
        """Entries per source (model, rule, default), every source listed."""
        out = {SOURCE_MODEL: 0, SOURCE_RULE: 0, SOURCE_DEFAULT: 0}
        for _, source in self.picks.values():
            out[source] = out.get(source, 0) + 1
        return out


def _candidate_count(d) -> int:
    """Every candidate of the dispatcher's space: rank() with it returns the whole ranking."""
    if d.space_arch is None:
        return 1
    return max(len(registry.get(d.op).configs(d.space_arch, DISPATCH_DTYPE)), 1)


def pick(d, m: int, n: int, k: int, count: int | None = None):
    """(tiled config, source) for vLLM at (M, N, K): the best-ranked tiled config of the
    dispatcher's ranking that is feasible, else vLLM's default with source 'default'."""
    S = _space()
    problem = S.Problem(m, n, k, DISPATCH_DTYPE)
    for choice in d.rank(m, n, k, DISPATCH_DTYPE, count=count or _candidate_count(d)):
        try:
            cfg = S.config_from_id(choice.candidate)
        except ValueError:  # not a config of this space (e.g. another op's id): never exported
            continue
        if isinstance(cfg, S.BsTiledConfig) and S.check_feasible(cfg, problem, d.space_arch)[0]:
            return cfg, _SOURCES.get(choice.source, choice.source)
    return S.vllm_default(), SOURCE_DEFAULT


def build_table(d, n: int, k: int, ms=VLLM_M_GRID) -> VllmTable:
    """The vLLM table of (N, K) on d's GPU over the M grid ``ms`` (keys in ascending order)."""
    S = _space()
    count = _candidate_count(d)
    table = VllmTable(n, k, d.gpu_name)
    for m in sorted(int(v) for v in ms):
        cfg, source = pick(d, m, n, k, count)
        table.entries[str(m)] = S.to_vllm(cfg)
        table.picks[m] = (cfg.id, source)
    return table


def write_table(table: VllmTable, out_dir: str) -> str:
    """Write the table as vLLM's files are written (indent 4, trailing newline); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, table.file_name)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(table.entries, fh, indent=4)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def _model_identity(d) -> dict:
    """The model file that ranked (its name and the manifest's sha256), or nulls without one."""
    model = d.model_for(DISPATCH_DTYPE) if d.space_arch is not None else None
    if model is None:
        return {"model": None, "model_sha256": None}
    return {"model": os.path.basename(model.path), "model_sha256": model.manifest.get("onnx_sha256")}


def write_sidecar(tables: list[VllmTable], d, out_dir: str) -> str:
    """Record per file and M the config id and its source in ``SIDECAR`` (merged with the
    entries of earlier exports into the same folder); returns its path."""
    path = os.path.join(out_dir, SIDECAR)
    files = {}
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
        if isinstance(old, dict) and old.get("format") == SIDECAR_FORMAT and isinstance(old.get("files"), dict):
            files = old["files"]
    except (OSError, ValueError):  # none yet, or unreadable: start afresh
        pass
    ident = _model_identity(d)
    for t in tables:
        files[t.file_name] = {"op": d.op, "gpu_name": t.gpu_name, "n": t.n, "k": t.k, **ident,
                              "counts": t.counts(),
                              "m": {str(m): {"candidate": cid, "source": src} for m, (cid, src) in t.picks.items()}}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": SIDECAR_FORMAT, "files": dict(sorted(files.items()))}, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def summary_line(path: str, table: VllmTable) -> str:
    c = table.counts()
    return (f"{path}: {len(table.entries)} M keys: {c[SOURCE_MODEL]} from the model, {c[SOURCE_RULE]} from the "
            f"fallback rule, {c[SOURCE_DEFAULT]} vLLM's default (no tiled config ranked)")


def export(nk_pairs, out_dir: str, gpu_name: str = DEFAULT_GPU, models_dir: str | None = None,
           op: str = "fp8_blockscale", ms=VLLM_M_GRID) -> list[tuple[str, VllmTable]]:
    """Write one vLLM file per (N, K) into out_dir, and the sidecar; returns [(path, table)].

    ValueError: an op vLLM does not run from tuned files, a models_dir that is not a folder, a
    GPU without a candidate space for the op (the files would hold vLLM's default only), or a
    problem the dispatcher refuses (e.g. fp8 on a GPU without fp8 tensor cores)."""
    from gemm_costmodel.serving.runtime import Dispatcher

    check_op(op)
    if models_dir is not None and not os.path.isdir(models_dir):
        raise ValueError(f"--models {models_dir}: no such directory")
    pairs = list(dict.fromkeys((int(n), int(k)) for n, k in nk_pairs))
    if not pairs:
        raise ValueError("give at least one --nk N,K")
    d = Dispatcher(gpu_name=gpu_name, models_dir=models_dir, op=op)
    if d.space_arch is None:
        archs = ", ".join(sorted(registry.get(op).space_module().ARCHS))
        raise ValueError(f"GPU {gpu_name!r} ({d.arch or 'arch unknown'}) has no {op} candidate space (spaces exist "
                         f"for {archs}): every entry would be vLLM's default")
    tables = [build_table(d, n, k, ms) for n, k in pairs]
    out = [(write_table(t, out_dir), t) for t in tables]
    write_sidecar(tables, d, out_dir)
    return out
