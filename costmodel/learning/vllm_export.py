"""Export the dispatcher's picks as vLLM tuned-config files (``costmodel export-vllm``).

Two ops: vLLM's w8a8 block-fp8 linear (``fp8_blockscale``, below) and its fused MoE layer
(``moe``, ``export_moe``: see "The fused-MoE files" further down).

vLLM's w8a8 block-fp8 linear (op ``fp8_blockscale``) looks up, per (N, K) and GPU, a JSON
file ``N={N},K={K},device_name={gpu},dtype=fp8_w8a8,block_shape=[128,128].json`` whose body
maps token counts M to its Triton kernel's launch config ({BLOCK_SIZE_M, BLOCK_SIZE_N,
BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}); an M missing from the file takes the
nearest key. This module writes such files for any (N, K), so that vLLM runs tuned configs
for shapes its own tables do not cover.

Which ranking: where a model of vLLM's own kernel is shipped for the GPU's arch and the dtype
(op ``vllm_w8a8_block``; ``vllm_moe`` for the fused-MoE files: vLLM's configs timed in vLLM's
kernel, docs/decisions/069-vllm-kernels-as-ops-of-their-own.md), the export ranks with it;
otherwise with the exported op's own dispatcher, whose model ranks the project's kernel (the
export's behaviour before the vLLM-kernel ops). The sidecar's ``ranked_with`` says which, and
why the vLLM-kernel model was not used.

vLLM's kernel takes the tiled configs only (the same six keys), so per M the file holds the
best-ranked tiled config of the dispatcher's ranking; when the ranking has none (the fallback
rule without a model returns one choice, e.g. split-K for decode), vLLM's default config. Where
each entry came from is printed, and recorded in a sidecar (``SIDECAR``) beside the files:
vLLM's loader reads only the six keys, so the files hold nothing else.

Torch-free: only the dispatcher (numpy, onnxruntime) and the op's space are imported.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field

from gemm_costmodel import registry
from gemm_costmodel.kernels.fp8_blockscale.space import VLLM_FILE_NAME_RE as VLLM_BS_FILE_NAME
from gemm_costmodel.kernels.moe.space import VLLM_FILE_NAME_RE as VLLM_MOE_FILE_NAME
# vLLM's device names live below the exporter: the ops' baselines read vLLM's files by them too.
# The two kinds of file differ: the fused-MoE names map the H200 family to NVIDIA_H200, the
# block-fp8 ones do not (kernels/vllm/names.py cites vLLM's functions).
from gemm_costmodel.kernels.vllm.names import KIND_BLOCK_FP8, KIND_MOE
from gemm_costmodel.kernels.vllm.names import device_name as vllm_device_name

# The ops whose kernel vLLM runs from such files.
SUPPORTED_OPS = ("fp8_blockscale", "moe")

# vLLM's M grid: the keys of every w8a8 block-fp8 file tuned for NVIDIA_H100_80GB_HBM3 (and
# NVIDIA_H200) in vLLM 0.33.0 (model_executor/layers/quantization/utils/configs/; copies in
# datasets/vllm/0.33.0/w8a8_block_fp8_configs/, all 46 files share these 18 keys).
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

# The op whose model ranks vLLM's own kernel, per exported op (the registry's vLLM-kernel ops).
VLLM_KERNEL_OPS = {"fp8_blockscale": "vllm_w8a8_block", "moe": "vllm_moe"}
KERNEL_VLLM, KERNEL_PROJECT = "vllm", "project"


def vllm_kernel_dispatcher(op: str, gpu_name: str, models_dir: str | None, dtype: str):
    """(a Dispatcher of op's vLLM-kernel op whose model serves dtype on this GPU, '') or (None, why
    not): the export ranks with it when there is one."""
    from gemm_costmodel.serving.runtime import Dispatcher

    name = VLLM_KERNEL_OPS.get(op)
    if name is None or name not in registry.REGISTRY:
        return None, f"no vLLM-kernel op for {op}"
    if dtype not in registry.get(name).dtypes:
        return None, f"{name} has no dtype {dtype}"
    with warnings.catch_warnings():  # its absence is the usual case, said in the sidecar, not warned
        warnings.simplefilter("ignore")
        d = Dispatcher(gpu_name=gpu_name, models_dir=models_dir, op=name)
        if d.space_arch is None:
            return None, f"{name} has no candidate space for {gpu_name!r}"
        model = d.model_for(dtype)
    if model is None:
        return None, f"no {name} model: {d.fallback_reasons.get(dtype) or 'none found'}"[:400]
    return d, ""


def ranked_with(d, dtype: str, why_not: str = "") -> dict:
    """The sidecar's account of the ranking: the dispatcher's op, whose kernel its model ranks
    (vLLM's own, or the project's), the model file, and why the vLLM-kernel model was not used."""
    op = getattr(d, "op", None)
    out = {"op": op, "kernel": KERNEL_VLLM if op in VLLM_KERNEL_OPS.values() else KERNEL_PROJECT,
           **_model_identity(d, dtype)}
    if why_not:
        out["vllm_kernel_model"] = why_not
    return out


def _op_space(d):
    """The space of the dispatcher's op (fp8_blockscale for a dispatcher that names none)."""
    return registry.get(getattr(d, "op", None) or "fp8_blockscale").space_module()


def device_name(gpu_name: str, kind: str = KIND_BLOCK_FP8) -> str:
    """The device part of vLLM 0.33.0's file name of this kind (KIND_MOE: fused MoE, whose H200
    family reads NVIDIA_H200's files; KIND_BLOCK_FP8: block-fp8 linear) for a CUDA device name."""
    return vllm_device_name(gpu_name, kind)


def _space():
    return registry.get("fp8_blockscale").space_module()


def block_shape() -> tuple[int, int]:
    """vLLM's block_shape [block_n, block_k]: the op's weight-scale block."""
    s = _space()
    return s.GROUP_N, s.GROUP_K


def file_name(n: int, k: int, gpu_name: str) -> str:
    """vLLM's file name of the (N, K) table for this GPU."""
    bn, bk = block_shape()
    return (f"N={n},K={k},device_name={device_name(gpu_name, KIND_BLOCK_FP8)},dtype={DTYPE_TAG},"
            f"block_shape=[{bn},{bk}].json")


# A file name as file_name writes it (and vLLM reads it): N, K, device name. One definition of
# it, in the op's torch-free space (the op's baselines read the same files).
FILE_NAME_RE = re.compile(VLLM_BS_FILE_NAME)

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
        raise ValueError(f"export-vllm supports --op {', '.join(SUPPORTED_OPS)} (vLLM's w8a8 block-fp8 linear and "
                         f"its fused MoE); got {op!r}")


@dataclass
class VllmTable:
    """One vLLM file: its (N, K) and GPU, the JSON body, and per M the config id and its source."""

    n: int
    k: int
    gpu_name: str
    entries: dict[str, dict] = field(default_factory=dict)
    picks: dict[int, tuple[str, str]] = field(default_factory=dict)
    # M keys whose entry came from the ranking at another M (ranking_m): {M: the M ranked}.
    ranked_at: dict[int, int] = field(default_factory=dict)
    # What ranked (``ranked_with``), recorded in the sidecar.
    ranked_with: dict = field(default_factory=dict)

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


def ranking_m(d, m: int) -> int:
    """The M whose ranking gives vLLM's key M: M itself, except at or below a model's ``split_m``
    (decode trees of their own), which are ranked at split_m + 1 when that is below the smallest
    tiled BLOCK_SIZE_M.

    Why: the decode trees are fitted on (or weighted to) the decode queries, whose best candidates
    are GEMVs; a ranker learns the order of a query's best candidates, so those trees order the
    tiled configs (all far behind at M = 1) poorly or not at all: fitted on the M = 1 queries alone,
    the fp8_blockscale model's M = 1 key once read BLOCK_SIZE_M 256, 8x slower than the best tiled
    config; fitted on every query with M = 1 weighted 20 (shipped), its tiled pick at M = 1 is
    1.020-1.038x off the best tiled, against 1.012-1.028x ranked as M = 2. Below the smallest
    BLOCK_SIZE_M every tiled config runs the same programs at any M (one tile row, the rows past M
    masked), so the tiled order at split_m + 1, which the other trees learned from every query, is
    the order at M. Leave-one-family-out at M = 1 (37 shapes, seeds 0-4): the best tiled config so
    ranked is 1.015-1.022x off the best tiled, against 1.014-1.018x ranked at M = 1 by one model
    for every M, and 1.12x by the decode trees (docs/decisions/043-m-1-trees-of-their-own.md, "M = 1 trees of their own")."""
    model_for = getattr(d, "model_for", None)
    model = model_for(DISPATCH_DTYPE) if model_for is not None and d.space_arch is not None else None
    split = int(((model.manifest.get("hyperparameters") or {}).get("split_m", 0) or 0)) if model is not None else 0
    if 0 < m <= split:
        S = _op_space(d)
        smallest = min((c.block_m for c in S.generate_configs(d.space_arch, DISPATCH_DTYPE, include_vendor=False)
                        if c.variant == "tiled"), default=0)
        if split + 1 <= smallest:
            return split + 1
    return m


def pick(d, m: int, n: int, k: int, count: int | None = None, at: int | None = None):
    """(tiled config, source) for vLLM at (M, N, K): the best-ranked tiled config of the
    dispatcher's ranking at M = ``at`` (default ``ranking_m``) that is feasible at M, else vLLM's
    default with source 'default'. The configs are those of the dispatcher's op (fp8_blockscale's
    tiled ones, or vllm_w8a8_block's: vLLM's kernel's)."""
    S = _op_space(d)
    problem = S.Problem(m, n, k, DISPATCH_DTYPE)
    at = ranking_m(d, m) if at is None else at
    for choice in d.rank(at, n, k, DISPATCH_DTYPE, count=count or _candidate_count(d)):
        try:
            cfg = S.config_from_id(choice.candidate)
        except ValueError:  # not a config of this space (e.g. another op's id): never exported
            continue
        if cfg.variant == "tiled" and S.check_feasible(cfg, problem, d.space_arch)[0]:
            return cfg, _SOURCES.get(choice.source, choice.source)
    return S.vllm_default(), SOURCE_DEFAULT


def build_table(d, n: int, k: int, ms=VLLM_M_GRID) -> VllmTable:
    """The vLLM table of (N, K) on d's GPU over the M grid ``ms`` (keys in ascending order)."""
    S = _op_space(d)
    count = _candidate_count(d)
    table = VllmTable(n, k, d.gpu_name)
    for m in sorted(int(v) for v in ms):
        at = ranking_m(d, m)
        cfg, source = pick(d, m, n, k, count, at)
        table.entries[str(m)] = S.to_vllm(cfg)
        table.picks[m] = (cfg.id, source)
        if at != m:
            table.ranked_at[m] = at
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


def _model_identity(d, dtype: str = DISPATCH_DTYPE) -> dict:
    """The model file that ranked (its name and the manifest's sha256), or nulls without one."""
    model_for = getattr(d, "model_for", None)
    model = model_for(dtype) if d.space_arch is not None and model_for is not None else None
    if model is None:
        return {"model": None, "model_sha256": None}
    return {"model": os.path.basename(model.path), "model_sha256": model.manifest.get("onnx_sha256")}


def write_sidecar(tables: list, d, out_dir: str) -> str:
    """Record per file and M the config id and its source in ``SIDECAR`` (merged with the
    entries of earlier exports into the same folder); returns its path. Tables are VllmTable
    (fp8_blockscale) or MoeVllmTable (moe: ``record``)."""
    path = os.path.join(out_dir, SIDECAR)
    files = {}
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
        if isinstance(old, dict) and old.get("format") == SIDECAR_FORMAT and isinstance(old.get("files"), dict):
            files = old["files"]
    except (OSError, ValueError):  # none yet, or unreadable: start afresh
        pass
    ident = None
    for t in tables:
        if isinstance(t, MoeVllmTable):
            files[t.file_name] = t.record(d)
            continue
        ident = ident if ident is not None else _model_identity(d)
        files[t.file_name] = {"op": "fp8_blockscale", "gpu_name": t.gpu_name, "n": t.n, "k": t.k, **ident,
                              **({"ranked_with": t.ranked_with} if t.ranked_with else {}), "counts": t.counts(),
                              "m": {str(m): {"candidate": cid, "source": src,
                                             **({"ranked_at_m": t.ranked_at[m]} if m in t.ranked_at else {})}
                                    for m, (cid, src) in t.picks.items()}}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": SIDECAR_FORMAT, "files": dict(sorted(files.items()))}, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def summary_line(path: str, table) -> str:
    c = table.counts()
    line = (f"{path}: {len(table.entries)} M keys: {c[SOURCE_MODEL]} from the model, {c[SOURCE_RULE]} from the "
            f"fallback rule, {c[SOURCE_DEFAULT]} vLLM's default (no tiled config ranked)")
    rw = getattr(table, "ranked_with", None) or {}
    if rw.get("kernel") == KERNEL_VLLM:
        line += f"; ranked for vLLM's own kernel ({rw['op']} model {rw.get('model')})"
    elif rw:
        why = rw.get("vllm_kernel_model") or "no vLLM-kernel model"
        line += f"; ranked for the project's kernel ({rw['op']}; {why})"
    if isinstance(table, MoeVllmTable):
        line += (f"; one config per M for both GEMMs (gate_up {2 * table.n}x{table.hidden}, down "
                 f"{table.hidden}x{table.n}; hidden {table.hidden}, top_k {table.top_k}, routing {MOE_ROUTING})")
        if not c[SOURCE_MODEL] and c[SOURCE_RULE]:
            line += (f"; no moe model serves {table.dtype} on {table.gpu_name}: every ranked entry is the op's "
                     "fallback rule (vLLM's default config for the dtype), not a tuning")
    return line


def export(nk_pairs, out_dir: str, gpu_name: str = DEFAULT_GPU, models_dir: str | None = None,
           op: str = "fp8_blockscale", ms=VLLM_M_GRID) -> list[tuple[str, VllmTable]]:
    """Write one vLLM file per (N, K) into out_dir, and the sidecar; returns [(path, table)].

    ValueError: an op vLLM does not run from tuned files, a models_dir that is not a folder, a
    GPU without a candidate space for the op (the files would hold vLLM's default only), or a
    problem the dispatcher refuses (e.g. fp8 on a GPU without fp8 tensor cores)."""
    from gemm_costmodel.serving.runtime import Dispatcher

    check_op(op)
    if op == "moe":
        raise ValueError("export-vllm --op moe writes fused-MoE files from --moe E,N,K,TOPK (experts, intermediate "
                         "size N, hidden size K, experts per token), not --nk (export_moe)")
    if models_dir is not None and not os.path.isdir(models_dir):
        raise ValueError(f"--models {models_dir}: no such directory")
    pairs = list(dict.fromkeys((int(n), int(k)) for n, k in nk_pairs))
    if not pairs:
        raise ValueError("give at least one --nk N,K")
    dv, why_not = vllm_kernel_dispatcher(op, gpu_name, models_dir, DISPATCH_DTYPE)
    d = dv or Dispatcher(gpu_name=gpu_name, models_dir=models_dir, op=op)
    if d.space_arch is None:
        archs = ", ".join(sorted(registry.get(op).space_module().ARCHS))
        raise ValueError(f"GPU {gpu_name!r} ({d.arch or 'arch unknown'}) has no {op} candidate space (spaces exist "
                         f"for {archs}): every entry would be vLLM's default")
    tables = [build_table(d, n, k, ms) for n, k in pairs]
    for t in tables:
        t.ranked_with = ranked_with(d, DISPATCH_DTYPE, why_not)
    out = [(write_table(t, out_dir), t) for t in tables]
    write_sidecar(tables, d, out_dir)
    return out


# -- The fused-MoE files (op ``moe``) -------------------------------------------------------
#
# vLLM's fused_experts looks up, per (E, N) and GPU, ``E={E},N={N},device_name={gpu}.json``
# (bf16 and fp16: no dtype part; fp8 w8a8 with per-tensor scales: ``,dtype=fp8_w8a8``; fp8 w8a8
# with 128x128 block scales, the op's dtype fp8bs: ``,dtype=fp8_w8a8,block_shape=[128,128]``), where E
# is the rank's number of experts and N the per-shard intermediate size I (w2 is (E, hidden, N));
# the body maps M to the same six keys, and an M missing from the file takes the nearest key.
# vLLM runs ONE config per M for both grouped GEMMs of the layer (gate_up: (M * top_k) x 2N x
# hidden, down: (M * top_k) x hidden x N), so per M the file holds the tiled config that
# minimises the dispatcher's predicted gate_up + down time. vLLM's file name carries neither the
# hidden size nor top_k: the user gives both (and they are recorded in the sidecar); routing is
# assumed balanced. Where the rankings carry no latencies (a rank model without its latency
# companion, or the fallback rule), the config with the least sum of its positions in the two
# rankings is taken (ties: the gate_up ranking's order). Where neither ranking holds a tiled
# config, vLLM's default for (M, E).

MOE_DTYPE_TAGS = {"bf16": None, "fp16": None, "fp8": "fp8_w8a8", "fp8bs": "fp8_w8a8"}
MOE_ROUTING = "balanced"
# Any vLLM fused-MoE file name (the tuned files' folder also holds int8 ones); an exported name has a
# dtype part only for fp8 and fp8bs, and a block_shape only for fp8bs.
# One definition of it, in the op's torch-free space (the serving op reads the same files).
MOE_FILE_NAME_RE = re.compile(VLLM_MOE_FILE_NAME)
# How the pick of an M was combined over the two stages.
COMBINE_LATENCY, COMBINE_RANK, COMBINE_NONE = "latency", "rank", "none"
# A vllm_moe model ranks the layer itself (one problem per layer, vLLM's kernel): no stages to combine.
COMBINE_LAYER = "layer"

_MOE_SPEC_RE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*$")


def _moe_space():
    from gemm_costmodel.kernels.moe import space

    return space


def moe_block_shape(dtype: str):
    """vLLM's block_shape [block_n, block_k] of the dtype's files (fp8bs: the op's scale block), else None."""
    S = _moe_space()
    return S.BLOCK_SHAPE if dtype == S.BLOCK_DTYPE else None


def moe_file_name(e: int, n: int, gpu_name: str, dtype: str = "bf16") -> str:
    """vLLM's file name of the (E, N = intermediate size) fused-MoE table for this GPU and dtype, as
    vLLM 0.33.0's ``get_config_file_name`` spells it: ``,dtype=..`` for fp8, and for block scales
    ``,block_shape=[bn,bk]`` (its list printed without spaces)."""
    if dtype not in MOE_DTYPE_TAGS:
        raise ValueError(f"vLLM's fused-MoE files exist for dtypes {', '.join(MOE_DTYPE_TAGS)}, got {dtype!r}")
    tag = MOE_DTYPE_TAGS[dtype]
    block = moe_block_shape(dtype)
    return (f"E={e},N={n},device_name={device_name(gpu_name, KIND_MOE)}" + (f",dtype={tag}" if tag else "")
            + (f",block_shape=[{block[0]},{block[1]}]" if block else "") + ".json")


@dataclass(frozen=True)
class MoeSpec:
    """One MoE layer to export: E experts (per rank), intermediate size N = I (per shard), hidden
    size K, top_k experts per token."""

    e: int
    n: int
    hidden: int
    top_k: int

    def __post_init__(self):
        for name in ("e", "n", "hidden", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.top_k > self.e:
            raise ValueError(f"top_k ({self.top_k}) must be <= E ({self.e})")
        if self.e > _moe_space().MAX_EXPERTS:
            raise ValueError(f"E must be <= {_moe_space().MAX_EXPERTS}, got {self.e}")


def parse_moe_spec(text: str) -> MoeSpec:
    """'E,N,K,TOPK' -> MoeSpec; ValueError saying the expected form."""
    m = _MOE_SPEC_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"--moe {text!r}: expected E,N,K,TOPK with positive integers (experts, intermediate size N "
                         "as in vLLM's file name, hidden size K, experts per token), e.g. --moe 8,7168,4096,2")
    try:
        return MoeSpec(*(int(g) for g in m.groups()))
    except ValueError as exc:
        raise ValueError(f"--moe {text!r}: {exc}") from None


@dataclass
class MoeVllmTable:
    """One vLLM fused-MoE file: the layer, dtype and GPU, the JSON body, and per M the config id,
    its source, how the stages were combined and the predicted stage times (us, or None)."""

    spec: MoeSpec
    dtype: str
    gpu_name: str
    entries: dict[str, dict] = field(default_factory=dict)
    picks: dict[int, tuple[str, str]] = field(default_factory=dict)
    details: dict[int, dict] = field(default_factory=dict)
    ranked_with: dict = field(default_factory=dict)

    @property
    def e(self) -> int:
        return self.spec.e

    @property
    def n(self) -> int:
        return self.spec.n

    @property
    def hidden(self) -> int:
        return self.spec.hidden

    @property
    def top_k(self) -> int:
        return self.spec.top_k

    @property
    def file_name(self) -> str:
        return moe_file_name(self.e, self.n, self.gpu_name, self.dtype)

    def counts(self) -> dict[str, int]:
        out = {SOURCE_MODEL: 0, SOURCE_RULE: 0, SOURCE_DEFAULT: 0}
        for _, source in self.picks.values():
            out[source] = out.get(source, 0) + 1
        return out

    def record(self, d) -> dict:
        """The sidecar's record of this file."""
        return {"op": "moe", "gpu_name": self.gpu_name, "dtype": self.dtype, "e": self.e, "n": self.n,
                "hidden": self.hidden, "top_k": self.top_k, "routing": MOE_ROUTING,
                "note": ("vLLM's file name holds E and N only: these configs were chosen for hidden size "
                         f"{self.hidden} and top_k {self.top_k} (given by the user), balanced routing, one config "
                         "per M for both GEMMs (per M, 'combine': 'layer' = the vLLM-kernel model's ranking of the "
                         "layer, 'latency' = least predicted gate_up + down time, 'rank' = least sum of the two "
                         "ranking positions, 'none' = vLLM's default); vLLM applies the file to any layer with "
                         "this E and N"),
                **_model_identity(d, self.dtype), **({"ranked_with": self.ranked_with} if self.ranked_with else {}),
                "counts": self.counts(),
                "m": {str(m): {"candidate": cid, "source": src, **self.details.get(m, {})}
                      for m, (cid, src) in self.picks.items()}}


def _moe_rank(d, m: int, n: int, k: int, dtype: str, e: int, top_k: int, stage: str, count: int):
    """d.rank for one stage, passing stage and routing where the dispatcher takes them."""
    import inspect

    kw = {"count": count, "e": e, "top_k": top_k}
    try:
        params = inspect.signature(d.rank).parameters
    except (TypeError, ValueError):
        params = {}
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if any_kw or "stage" in params:
        kw["stage"] = stage
    if any_kw or "routing" in params:
        kw["routing"] = MOE_ROUTING
    return d.rank(m, n, k, dtype, **kw)


def _moe_candidate_count(d, dtype: str) -> int:
    if d.space_arch is None:
        return 1
    return max(len(_moe_op_space(d).generate_configs(d.space_arch, dtype)), 1)


def _moe_op_space(d):
    """The space of the dispatcher's op (moe for a dispatcher that names none)."""
    return registry.get(getattr(d, "op", None) or "moe").space_module()


def vllm_moe_pick(d, m: int, spec: MoeSpec, dtype: str = "bf16", count: int | None = None):
    """(config, source, detail) from a vllm_moe dispatcher: its ranking of the layer (M tokens, vLLM's N,
    hidden K, E, top_k, balanced routing) in vLLM's kernel, the best-ranked vLLM config; vLLM's default
    (source 'default') when it ranks none. detail: {"combine": "layer", "predicted_us": {"layer": ..} or None}."""
    S = _moe_op_space(d)
    count = count or _moe_candidate_count(d, dtype)
    problem = S.Problem(m, spec.n, spec.hidden, dtype, spec.e, spec.top_k, MOE_ROUTING)
    for choice in d.rank(m, spec.n, spec.hidden, dtype, count=count, e=spec.e, top_k=spec.top_k, routing=MOE_ROUTING):
        try:
            cfg = S.config_from_id(choice.candidate)
        except ValueError:
            continue
        if cfg.variant == "tiled" and S.check_feasible(cfg, problem, d.space_arch or "sm90")[0]:
            pred = None if choice.predicted_us is None else {"layer": float(choice.predicted_us)}
            return cfg, _SOURCES.get(choice.source, choice.source), {"combine": COMBINE_LAYER, "predicted_us": pred}
    return S.vllm_default(m, spec.e, dtype), SOURCE_DEFAULT, {"combine": COMBINE_NONE, "predicted_us": None}


def moe_pick(d, m: int, spec: MoeSpec, dtype: str = "bf16", count: int | None = None):
    """(tiled config, source, detail) for vLLM at M tokens on the layer ``spec``: the tiled config
    (feasible for both stages) minimising the predicted gate_up + down time; without latencies on
    both rankings, the least sum of ranking positions; else vLLM's default (source 'default').
    detail: {"combine": latency|rank|none, "predicted_us": {"gate_up": .., "down": ..} or None}.
    A vllm_moe dispatcher ranks the layer itself (``vllm_moe_pick``)."""
    if getattr(d, "op", None) in ("vllm_moe",):
        return vllm_moe_pick(d, m, spec, dtype, count)
    S = _moe_space()
    count = count or _moe_candidate_count(d, dtype)
    stages = {"gate_up": (2 * spec.n, spec.hidden), "down": (spec.hidden, spec.n)}
    ranked = {}
    for stage, (n, k) in stages.items():
        problem = S.Problem(m, n, k, dtype, spec.e, spec.top_k, stage, MOE_ROUTING)
        seen = {}
        for choice in _moe_rank(d, m, n, k, dtype, spec.e, spec.top_k, stage, count):
            try:
                cfg = S.config_from_id(choice.candidate)
            except ValueError:  # not a config of this space: never exported
                continue
            if (isinstance(cfg, S.MoeTiledConfig) and cfg not in seen
                    and S.check_feasible(cfg, problem, d.space_arch or "sm90")[0]):
                seen[cfg] = (len(seen), choice)
        ranked[stage] = seen
    g, w = ranked["gate_up"], ranked["down"]
    both = [c for c in g if c in w]
    if both and all(g[c][1].predicted_us is not None and w[c][1].predicted_us is not None for c in both):
        best = min(both, key=lambda c: (g[c][1].predicted_us + w[c][1].predicted_us, g[c][0]))
        combine = COMBINE_LATENCY
    elif g or w:
        union = list(g) + [c for c in w if c not in g]
        best = min(union, key=lambda c: (g.get(c, (len(g),))[0] + w.get(c, (len(w),))[0],
                                         g.get(c, (len(g),))[0], c.id))
        combine = COMBINE_RANK
    else:
        return S.vllm_default(m, spec.e, dtype if dtype in S.FP8_DTYPES else "bf16"), SOURCE_DEFAULT, \
            {"combine": COMBINE_NONE, "predicted_us": None}
    choice = (g.get(best) or w.get(best))[1]
    pred = None
    if best in g and best in w and g[best][1].predicted_us is not None and w[best][1].predicted_us is not None:
        pred = {"gate_up": float(g[best][1].predicted_us), "down": float(w[best][1].predicted_us)}
    return best, _SOURCES.get(choice.source, choice.source), {"combine": combine, "predicted_us": pred}


def build_moe_table(d, spec: MoeSpec, dtype: str = "bf16", ms=VLLM_M_GRID) -> MoeVllmTable:
    """The vLLM fused-MoE table of ``spec`` on d's GPU over the M grid ``ms`` (keys ascending)."""
    S = _moe_op_space(d)
    count = _moe_candidate_count(d, dtype)
    table = MoeVllmTable(spec, dtype, d.gpu_name)
    for m in sorted(int(v) for v in ms):
        cfg, source, detail = moe_pick(d, m, spec, dtype, count)
        table.entries[str(m)] = S.to_vllm(cfg)
        table.picks[m] = (cfg.id, source)
        table.details[m] = detail
    return table


def export_moe(specs, out_dir: str, gpu_name: str = DEFAULT_GPU, models_dir: str | None = None,
               dtype: str = "bf16", ms=VLLM_M_GRID, dispatcher=None) -> list[tuple[str, MoeVllmTable]]:
    """Write one vLLM fused-MoE file per layer spec (MoeSpec or (E, N, K, top_k)) into out_dir, and
    the sidecar; returns [(path, table)]. ``dispatcher``: rank with this one instead of the vllm_moe
    dispatcher (where its model serves the dtype on the GPU) or ``Dispatcher(gpu_name, models_dir,
    op="moe")``.

    ValueError: a dtype vLLM has no fused-MoE files for, a models_dir that is not a folder, no
    spec, two specs for one file (same E, N: vLLM's name has no hidden size or top_k), or a GPU
    without a moe candidate space."""
    if dtype not in MOE_DTYPE_TAGS:
        raise ValueError(f"--dtype {dtype!r}: vLLM's fused-MoE files exist for {', '.join(MOE_DTYPE_TAGS)}")
    if models_dir is not None and not os.path.isdir(models_dir):
        raise ValueError(f"--models {models_dir}: no such directory")
    specs = [s if isinstance(s, MoeSpec) else MoeSpec(*(int(v) for v in s)) for s in specs]
    specs = list(dict.fromkeys(specs))
    if not specs:
        raise ValueError("give at least one --moe E,N,K,TOPK")
    names = {}
    for s in specs:
        other = names.setdefault((s.e, s.n), s)
        if other != s:
            raise ValueError(f"two layers for one vLLM file E={s.e},N={s.n} (hidden/top_k {other.hidden}/{other.top_k} "
                             f"and {s.hidden}/{s.top_k}): vLLM's file name holds E and N only")
    why_not = ""
    if dispatcher is None:
        from gemm_costmodel.serving.runtime import Dispatcher

        dispatcher, why_not = vllm_kernel_dispatcher("moe", gpu_name, models_dir, dtype)
        dispatcher = dispatcher or Dispatcher(gpu_name=gpu_name, models_dir=models_dir, op="moe")
    d = dispatcher
    if d.space_arch is None:
        archs = ", ".join(sorted(_moe_space().ARCHS))
        raise ValueError(f"GPU {d.gpu_name!r} ({getattr(d, 'arch', None) or 'arch unknown'}) has no moe candidate "
                         f"space (spaces exist for {archs}): every entry would be vLLM's default")
    tables = [build_moe_table(d, s, dtype, ms) for s in specs]
    for t in tables:
        t.ranked_with = ranked_with(d, dtype, why_not)
    out = [(write_table(t, out_dir), t) for t in tables]
    write_sidecar(tables, d, out_dir)
    return out


# -- Where the files go (``--install``, ``--dry-run``) -----------------------------------------
#
# vLLM 0.33.0 reads fused-MoE files from VLLM_TUNED_CONFIG_FOLDER, else its package's
# fused_moe/configs/, and block-fp8 linear files only from its package's
# quantization/utils/configs/ (kernels/vllm/source.py cites the functions). --install writes each
# kind there. The package folders hold vLLM's own tuned files: replacing one that no export wrote
# (none recorded in the folder's sidecar) takes --force, so an install never silently drops a
# shipped tuning.

# What a planned file would do to its folder.
PLAN_NEW, PLAN_EXPORT, PLAN_FOREIGN = "new", "replaces an earlier export", "replaces a file no export wrote"


def kind_of(op: str) -> str:
    """The kind of vLLM file an op's export writes."""
    check_op(op)
    return KIND_MOE if op == "moe" else KIND_BLOCK_FP8


def install_dir(op: str, package_dir: str | None = None, environ=None) -> str:
    """The folder the installed vLLM (or the package folder given) reads op's files from;
    ValueError naming --vllm-package / --out when it cannot be known."""
    from gemm_costmodel.kernels.vllm import source

    return source.install_dir(kind_of(op), package_dir, environ)


def _exported_names(out_dir: str) -> set:
    try:
        with open(os.path.join(out_dir, SIDECAR), encoding="utf-8") as fh:
            side = json.load(fh)
        return set(side.get("files") or {}) if isinstance(side, dict) else set()
    except (OSError, ValueError):
        return set()


def plan(names, out_dir: str) -> list[tuple[str, str]]:
    """[(path, PLAN_NEW | PLAN_EXPORT | PLAN_FOREIGN)] of writing these file names into out_dir."""
    ours = _exported_names(out_dir)
    out = []
    for name in dict.fromkeys(names):
        path = os.path.join(out_dir, name)
        out.append((path, PLAN_NEW if not os.path.exists(path) else PLAN_EXPORT if name in ours else PLAN_FOREIGN))
    return out


def check_plan(planned, force: bool = False) -> None:
    """ValueError naming the files that would replace files no export wrote (unless force)."""
    foreign = [p for p, what in planned if what == PLAN_FOREIGN]
    if foreign and not force:
        raise ValueError(f"{len(foreign)} file(s) would replace a file no export wrote (e.g. vLLM's own tuned file "
                         f"{foreign[0]}); --dry-run lists them, --force replaces them")


def planned_names(op: str, gpu_name: str, nk_pairs=(), moe_specs=(), dtype: str = "bf16") -> list[str]:
    """The file names an export would write (without ranking anything)."""
    if kind_of(op) == KIND_MOE:
        return [moe_file_name(s.e, s.n, gpu_name, dtype) for s in moe_specs]
    return [file_name(n, k, gpu_name) for n, k in nk_pairs]
