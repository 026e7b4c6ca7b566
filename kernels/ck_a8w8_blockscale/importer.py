"""Import AITER's a8w8 block-scale GEMM tuning tables into rows of the ``ck_a8w8_blockscale`` op.

What it reads (AITER's formats, at the commit recorded in datasets/ck_a8w8_blockscale/aiter/
PROVENANCE.json, copied verbatim there by ``snapshot``):
- tuned: ``gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio`` (older
  tables lack ``gfx``: it is then backfilled from cu_num as AITER does), one winning kernel per
  (cu_num, M, N, K) and its time;
- untuned: ``M,N,K`` (optionally more columns, e.g. ``q_dtype_w``): shapes waiting for tuning.
Files: ``aiter/configs/a8w8_blockscale[_bpreshuffle]_{tuned,untuned}_gemm.csv`` and the per-model
``aiter/configs/model_configs/{a8w8_blockscale[_bpreshuffle]_{tuned,untuned}_gemm_<model>,
<model>_a8w8_blockscale[_bpreshuffle]_{tuned,untuned}_gemm}.csv``. The model family is the
``<model>`` of the file name; the shared table has none (``family`` is then ``nk:<N>x<K>``, one
family per weight shape). ``layout`` is ``bpreshuffle`` for the preshuffled-weight tables (a
different kernel set; the op's model uses ``plain`` only).

A bad row raises DataError ``file:line: <field>: <why>``. Rows carry their provenance
(``source_repo``, ``source_commit``, ``source_file``, ``source_line``).
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import subprocess

import pandas as pd


from . import space


class DataError(ValueError):
    """A bad AITER table or row: the message starts with ``file:line: field:``."""

# repository root / datasets / ck_a8w8_blockscale / aiter (kernels/ck_a8w8_blockscale/importer.py)
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "datasets", "ck_a8w8_blockscale", "aiter")
PROVENANCE = "PROVENANCE.json"
REPO = "https://github.com/ROCm/aiter"
_FILE_RE = re.compile(r"^(?:(?P<pre>[A-Za-z0-9.\-]+?)_)?a8w8_blockscale(?P<bp>_bpreshuffle)?_(?P<kind>tuned|untuned)_gemm"
                      r"(?:_(?P<post>[A-Za-z0-9_.\-]+))?\.csv$")
# The plain tables hold CK and CK-tile kernels only. The preshuffled-weight tables also hold assembly,
# opus, Triton and FlyDSL kernels (more each release): kept as rows (any non-empty libtype), not modelled.
LIBTYPES = {"plain": ("ck", "cktile"), "bpreshuffle": None}
TUNED_COLUMNS = ("cu_num", "M", "N", "K", "libtype", "kernelId", "splitK", "us", "kernelName")


def parse_name(path: str) -> dict | None:
    """{'kind': tuned|untuned, 'layout': plain|bpreshuffle, 'family': model or None} of an AITER
    a8w8 block-scale GEMM table path, or None for any other file (fmoe, batched, a4w4, ...)."""
    m = _FILE_RE.match(os.path.basename(path))
    if not m or (m.group("pre") and m.group("post")):
        return None
    return {"kind": m.group("kind"), "layout": "bpreshuffle" if m.group("bp") else "plain",
            "family": m.group("pre") or m.group("post")}


def _int(text, where, field, lo=1):
    try:
        v = int(str(text).strip())
    except ValueError:
        raise DataError(f"{where}: {field}: {text!r} is not an integer") from None
    if v < lo:
        raise DataError(f"{where}: {field}: {v} is below {lo}")
    return v


def _float(text, where, field, positive=False):
    try:
        v = float(str(text).strip())
    except ValueError:
        raise DataError(f"{where}: {field}: {text!r} is not a number") from None
    if not math.isfinite(v) or (positive and v <= 0):
        raise DataError(f"{where}: {field}: {v} is not a {'positive ' if positive else ''}finite number")
    return v


def _records(path: str, rel: str, kind: str, required, empty_ok: bool = False):
    """(name info, {column: index}, [(line, where, record)]) of one AITER table: its file name says
    ``kind``, its header holds ``required``, every non-blank record has the header's width.
    DataError names ``rel:line``. An empty file is no table unless ``empty_ok``."""
    info = parse_name(rel)
    if info is None or info["kind"] != kind:
        raise DataError(f"{rel}: not an a8w8 block-scale {kind} GEMM table name")
    out = []
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if not header and empty_ok:
            return info, {}, out
        missing = [c for c in required if c not in header]
        if missing:
            raise DataError(f"{rel}:1: header lacks {', '.join(missing)}")
        for rec in reader:
            if not rec or all(not x.strip() for x in rec):
                continue
            where = f"{rel}:{reader.line_num}"
            if len(rec) != len(header):
                raise DataError(f"{where}: {len(rec)} fields, the header has {len(header)}")
            out.append((reader.line_num, where, rec))
    return info, {h: i for i, h in enumerate(header)}, out


def read_tuned(path: str, rel: str, commit: str = "") -> list[dict]:
    """Rows of one tuned table (``rel``: its path in the AITER repository, for errors and provenance)."""
    info, col, records = _records(path, rel, "tuned", TUNED_COLUMNS)
    rows = []
    for line, where, rec in records:
        get = lambda f: rec[col[f]].strip()  # noqa: E731
        cu = _int(get("cu_num"), where, "cu_num")
        gfx = get("gfx") if "gfx" in col else space.ARCH_OF_CU.get(cu, "")
        # No cross-check of gfx against cu_num: AITER notes gfx1250 also reports 256 CUs (its tuner
        # writes the real arch); the cu_num -> arch map is only its backfill for tables without gfx.
        if not gfx:
            raise DataError(f"{where}: gfx: empty and cu_num {cu} has no known arch")
        name = get("kernelName")
        if not name:
            raise DataError(f"{where}: kernelName: empty")
        lib = get("libtype")
        libs = LIBTYPES[info["layout"]]
        if not lib or (libs is not None and lib not in libs):
            raise DataError(f"{where}: libtype: {lib!r} is not one of {', '.join(libs or ('a non-empty name',))}")
        if info["layout"] == "plain":  # the op's own kernels: the name must spell a tile
            try:
                tile = space.tile_of(name)
            except ValueError as exc:
                raise DataError(f"{where}: kernelName: {exc}") from None
            if (tile.pipeline == "tile") != (lib == "cktile"):
                raise DataError(f"{where}: libtype: {lib!r} does not match kernelName {name!r}")
        rows.append({
            "op": space.OP, "arch": gfx, "cu_num": cu, "part": space.part_of(gfx, cu),
            "m": _int(get("M"), where, "M"), "n": _int(get("N"), where, "N"), "k": _int(get("K"), where, "K"),
            "dtype": "fp8", "layout": info["layout"], "libtype": lib,
            "kernel_id": _int(get("kernelId"), where, "kernelId", lo=-1),
            "split_k": _int(get("splitK"), where, "splitK", lo=0),
            "candidate": name, "latency_us": _float(get("us"), where, "us", positive=True),
            "tflops": _float(get("tflops"), where, "tflops") if "tflops" in col else float("nan"),
            "bw_gbs": _float(get("bw"), where, "bw") if "bw" in col else float("nan"),
            "err_ratio": _float(get("errRatio"), where, "errRatio") if "errRatio" in col else float("nan"),
            "status": "ok", "source": "aiter", "family_file": info["family"] or "",
            "source_repo": REPO, "source_commit": commit, "source_file": rel, "source_line": line})
    return rows


def read_untuned(path: str, rel: str, commit: str = "") -> list[dict]:
    """Shapes of one untuned table (M, N, K; extra columns are ignored). AITER ships an empty untuned
    table (bpreshuffle): no shapes."""
    info, col, records = _records(path, rel, "untuned", ("M", "N", "K"), empty_ok=True)
    return [{"op": space.OP, "m": _int(rec[col["M"]], where, "M"), "n": _int(rec[col["N"]], where, "N"),
             "k": _int(rec[col["K"]], where, "K"), "layout": info["layout"],
             "family_file": info["family"] or "", "source_repo": REPO, "source_commit": commit,
             "source_file": rel, "source_line": line}
            for line, where, rec in records]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()


def load(data_dir: str = DATA_DIR, verify: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tuned rows, untuned rows) of every table listed in the snapshot's PROVENANCE.json.
    ``family`` is the model of the file, or ``nk:<N>x<K>`` for the shared table."""
    with open(os.path.join(data_dir, PROVENANCE)) as fh:
        prov = json.load(fh)
    tuned, untuned = [], []
    for f in prov["files"]:
        path = os.path.join(data_dir, f["path"])
        if verify and _sha256(path) != f["sha256"]:
            raise DataError(f"{f['path']}: sha256 differs from {PROVENANCE} (the copy was edited)")
        info = parse_name(f["path"])
        if info is None:
            raise DataError(f"{f['path']}: not an a8w8 block-scale GEMM table name")
        (tuned if info["kind"] == "tuned" else untuned).extend(
            (read_tuned if info["kind"] == "tuned" else read_untuned)(path, f["path"], prov["commit"]))
    t = pd.DataFrame(tuned)
    t["family"] = [fam if fam else f"nk:{n}x{k}" for fam, n, k in zip(t["family_file"], t["n"], t["k"])]
    return t, pd.DataFrame(untuned)


def snapshot(git_dir: str, dest: str = DATA_DIR, commit: str = "HEAD") -> dict:
    """Copy every a8w8 block-scale GEMM table (tuned and untuned, plain and bpreshuffle) of an AITER
    git directory at ``commit`` into ``dest`` verbatim, with PROVENANCE.json (commit, sha256 each)."""
    def git(*args) -> bytes:
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=True).stdout

    sha = git("rev-parse", commit).decode().strip()
    names = [p for p in git("ls-tree", "-r", "--name-only", sha, "aiter/configs").decode().splitlines()
             if parse_name(p) is not None]
    files = []
    for p in sorted(names):
        data = git("show", f"{sha}:{p}")
        out = os.path.join(dest, p)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as fh:
            fh.write(data)
        files.append({"path": p, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    prov = {"repository": REPO, "commit": sha, "commit_date": git("log", "-1", "--format=%cI", sha).decode().strip(),
            "license": "MIT (AITER's LICENSE); AITER's tuning results, copied verbatim as data", "files": files}
    with open(os.path.join(dest, PROVENANCE), "w") as fh:
        json.dump(prov, fh, indent=1)
    return prov
