"""Import timings measured elsewhere into the dataset schema.

CSV (``costmodel import csv``), one row per (shape, candidate):

    M,N,K,dtype,candidate,latency_us,arch[,gpu_name][,status][,E][,top_k]

``candidate`` is a config id of this project (its parameters are filled in)
or any other name (kept as is, variant ``foreign``). ``arch`` is the GPU arch
tag (e.g. sm90, sm80, gfx942): rows from other GPUs keep it. ``status``
defaults to ok.

vLLM tuned fused-MoE tables (``costmodel import vllm``): files named
``E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]].json`` with one
winning Triton config per token count M. They hold winners only, so rows get
status ok, no latency (NaN) and source ``vllm``. The hidden size K is not in
the file, so it must be given.
"""
from __future__ import annotations

import csv
import json
import os
import re

import pandas as pd

from gemm_costmodel.kernels.gemm.space import config_from_id, config_params

from .dataset import DataError, normalize, validate

CSV_COLUMNS = ("m", "n", "k", "dtype", "candidate", "latency_us", "arch")
_ARCH_OF_GPU = {"H100": "sm90", "H200": "sm90", "H20": "sm90", "H800": "sm90", "A100": "sm80", "A800": "sm80",
                "L40S": "sm89", "L40": "sm89", "B200": "sm100", "MI300X": "gfx942", "MI325X": "gfx942",
                "MI355X": "gfx950"}
_VLLM_DTYPES = {None: "bf16", "fp8_w8a8": "fp8", "float8": "fp8", "bf16": "bf16", "fp16": "fp16"}


def arch_of(gpu_name: str) -> str:
    """Arch tag of a GPU name such as 'NVIDIA_H100_80GB_HBM3' ('unknown' if not in the table)."""
    up = gpu_name.upper().replace("_", " ")
    for key in sorted(_ARCH_OF_GPU, key=len, reverse=True):
        if re.search(rf"\b{key}\b", up):
            return _ARCH_OF_GPU[key]
    return "unknown"


def _base(**kw) -> dict:
    row = {"gpu_uuid": "unknown", "sm_count": 0, "driver": "unknown", "torch_version": "unknown",
           "triton_version": "unknown", "git_sha": "unknown", "timestamp": "", "eval_shape": False,
           "stable": True, "family": "user", "origins": ""}
    row.update(kw)
    return row


def _params(candidate: str) -> tuple[str, dict]:
    try:
        cfg = config_from_id(candidate)
        return cfg.variant, config_params(cfg)
    except ValueError:
        return "foreign", dict.fromkeys(("block_m", "block_n", "block_k", "group_m", "split_k",
                                         "num_warps", "num_stages"), 0)


def import_csv(path: str) -> pd.DataFrame:
    """Rows of a timing CSV (format in the module doc), validated."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            raise DataError(f"{path}: empty file")
        cols = {c.strip().lower(): c for c in reader.fieldnames}
        for need in CSV_COLUMNS:
            if need not in cols:
                raise DataError(f"{path}: missing column {need!r}")
        rows = []
        for rec in reader:
            get = lambda c, d=None: (rec.get(cols[c]) if c in cols else None) or d  # noqa: E731
            cand = get("candidate", "").strip()
            variant, params = _params(cand)
            try:
                lat = float(get("latency_us"))
            except (TypeError, ValueError):
                raise DataError(f"{path}:{reader.line_num}: column 'latency_us': not a number") from None
            rows.append(_base(op="gemm" if int(get("e", 1)) == 1 else "fused_moe",
                              m=get("m"), n=get("n"), k=get("k"), e=get("e", 1), top_k=get("top_k", 1),
                              dtype=get("dtype", "").strip(), candidate=cand, variant=variant, **params,
                              status=get("status", "ok").strip(), p20_us=lat, p50_us=lat, p80_us=lat,
                              source="csv", arch=get("arch", "").strip(),
                              gpu_name=get("gpu_name", "unknown").strip(), origins=f"import/{os.path.basename(path)}"))
    if not rows:
        raise DataError(f"{path}: no rows")
    return validate(normalize(pd.DataFrame(rows)), path)


_VLLM_NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]+?)(?:,dtype=([^,]+?))?(?:,block_shape=\[(\d+),\s*(\d+)\])?\.json$")


def import_vllm(path: str, hidden: int, top_k: int = 1) -> pd.DataFrame:
    """Rows of one vLLM fused-MoE config file; K = hidden (not in the file)."""
    name = os.path.basename(path)
    m = _VLLM_NAME.match(name)
    if not m:
        raise DataError(f"{path}: not a vLLM fused-MoE config file name (E=..,N=..,device_name=..)")
    e, n, device, dt, bn, bk = m.groups()
    if dt not in _VLLM_DTYPES:
        raise DataError(f"{path}: column 'dtype': unsupported vLLM dtype {dt!r}")
    try:
        body = json.load(open(path))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable JSON: {exc}") from None
    rows = []
    # Some files carry metadata keys (e.g. 'triton_version') beside the token counts.
    entries = {k: v for k, v in body.items() if str(k).isdigit() and isinstance(v, dict)}
    for tokens, cfg in sorted(entries.items(), key=lambda kv: int(kv[0])):
        cand = (f"vllm_m{cfg['BLOCK_SIZE_M']}n{cfg['BLOCK_SIZE_N']}k{cfg['BLOCK_SIZE_K']}"
                f"_g{cfg.get('GROUP_SIZE_M', 1)}_w{cfg.get('num_warps', 4)}s{cfg.get('num_stages', 2)}")
        rows.append(_base(op="fused_moe_blockscale" if bn else "fused_moe", m=int(tokens), n=int(n), k=hidden,
                          e=int(e), top_k=top_k, dtype=_VLLM_DTYPES[dt], candidate=cand, variant="vllm_fused_moe",
                          block_m=cfg["BLOCK_SIZE_M"], block_n=cfg["BLOCK_SIZE_N"], block_k=cfg["BLOCK_SIZE_K"],
                          group_m=cfg.get("GROUP_SIZE_M", 1), split_k=1, num_warps=cfg.get("num_warps", 4),
                          num_stages=cfg.get("num_stages", 2), status="ok", p20_us=float("nan"),
                          p50_us=float("nan"), p80_us=float("nan"), source="vllm", arch=arch_of(device),
                          gpu_name=device.replace("_", " "), origins=f"vllm/{name}"))
    if not rows:
        raise DataError(f"{path}: no configs")
    return validate(normalize(pd.DataFrame(rows)), path)
