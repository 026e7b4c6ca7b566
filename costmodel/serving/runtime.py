"""Runtime dispatch: pick the GEMM candidate for a problem, on the host, without a GPU sync.

Precedence (documented in the README):
1. a tuned table with an exact hit (the project's JSON, or the persisted cache of
   unsure mode) wins;
2. otherwise the shipped ONNX model ranks every feasible candidate in one
   ``session.run``;
3. with no usable model (missing, corrupt, schema-hash, config-space-hash or arch mismatch, an .onnx
   that does not match its manifest's size and sha256, unknown GPU), the hand
   heuristic of ``gemm_costmodel.kernels.gemm.heuristic`` decides. The reason is warned once; the
   serving path never raises for a model problem.

Candidates come only from the space of the GPU's arch (``Dispatcher.space_arch``);
a GPU whose arch has no space (sm89, sm100, or unknown) gets the vendor library
(source 'vendor') with one warning, and fp8 on a GPU without fp8 tensor cores
raises ValueError.

Only numpy and onnxruntime are imported here (torch only to name the current GPU
when none is given, and to ask the compute capability of a GPU missing from the
hardware table). Decisions are cached in a thread-safe LRU keyed by the problem.
Bad input raises ValueError naming the field.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware
from gemm_costmodel import registry
from gemm_costmodel.serving.candidates import arch_has_fp8
from gemm_costmodel.serving.candidates import table as candidate_table

DTYPES = ("bf16", "fp16", "fp8", "fp8bs")
# The kernels were written and tested for 32-bit sizes (no int64 casts in their index math): larger
# problems are refused here rather than risking wrapped offsets.
MAX_DIM = 2**31 - 1
# The dense GEMM's vendor candidate (gemm.space.VendorConfig): torch.mm, or torch._scaled_mm for fp8.
VENDOR = registry.get("gemm").vendor_ids[0]
# costmodel/serving/runtime.py -> the repository's models/ folder.
DEFAULT_MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                  "models")


def _models_dir() -> str:
    """The shipped models: the installed gemm_costmodel.models package (or COSTMODEL_MODELS_DIR)."""
    env = os.environ.get("COSTMODEL_MODELS_DIR")
    if env:
        return env
    try:
        import gemm_costmodel.models as pkg

        return os.path.dirname(os.path.abspath(pkg.__file__))
    except ImportError:  # pragma: no cover - the package always ships models/
        return DEFAULT_MODELS_DIR


class DispatchWarning(UserWarning):
    """A degraded dispatch (no usable model): the reason is in the message."""


class Choice:
    """A dispatch decision: the config id, who decided, and the model's latency estimate (if any).

    Immutable and compared by value, like a frozen dataclass. A ranking model's latency estimate
    comes from a second (companion) model; it is computed the first time ``predicted_us`` is read,
    not during the decision, since launching a kernel never reads it and it cost about 7% of a
    cold decision (issue 18)."""

    __slots__ = ("candidate", "source", "score", "_predicted", "_estimate")

    def __init__(self, candidate: str, source: str, predicted_us: float | None = None,
                 score: float | None = None, *, estimate=None):
        # source: 'table', 'model', 'heuristic', or 'vendor' (no candidate space for the GPU's arch);
        # estimate: a callable returning predicted_us (float or None), called at most once per reader.
        set_ = object.__setattr__
        set_(self, "candidate", candidate)
        set_(self, "source", source)
        set_(self, "score", score)
        set_(self, "_predicted", predicted_us)
        set_(self, "_estimate", estimate)

    @property
    def predicted_us(self) -> float | None:
        est = self._estimate
        if est is not None:
            # Two threads may both compute it: same value. The value is stored before the thunk is
            # dropped, so a reader that sees no thunk sees the value.
            object.__setattr__(self, "_predicted", est())
            object.__setattr__(self, "_estimate", None)
        return self._predicted

    def _key(self) -> tuple:
        return (self.candidate, self.source, self.predicted_us, self.score)

    def __eq__(self, other):
        return self._key() == other._key() if isinstance(other, Choice) else NotImplemented

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"Choice(candidate={self.candidate!r}, source={self.source!r}, "
                f"predicted_us={self.predicted_us!r}, score={self.score!r})")

    def __setattr__(self, name, value):
        raise AttributeError(f"Choice is immutable: cannot set {name!r}")

    __delattr__ = __setattr__

    def __reduce__(self):  # pickling (e.g. to worker processes) carries the value, not the thunk
        return (Choice, (self.candidate, self.source, self.predicted_us, self.score))


class _Lazy:
    """A value computed once, on first use (thread-safe enough: a race computes it twice)."""

    __slots__ = ("_fn", "_value")
    _UNSET = object()

    def __init__(self, fn):
        self._fn, self._value = fn, self._UNSET

    def get(self):
        if self._value is self._UNSET:
            self._value = self._fn()
        return self._value

    def item(self, i: int):
        """A thunk of element i as a float (None when the whole value is None)."""
        def one():
            v = self.get()
            return None if v is None else float(v[i])
        return one


def check_problem(m, n, k, dtype, e=1, top_k=1) -> None:
    """Raise ValueError naming the bad field."""
    for name, v in (("M", m), ("N", n), ("K", k), ("E", e), ("top_k", top_k)):
        if type(v) is not int and not isinstance(v, (np.integer,)):
            raise ValueError(f"{name} must be an int, got {type(v).__name__} {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
        if v > MAX_DIM and name in ("M", "N", "K"):
            raise ValueError(f"{name} must be <= 2**31 - 1 ({MAX_DIM}), got {v}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if top_k > e:
        raise ValueError(f"top_k ({top_k}) must be <= E ({e})")


def current_gpu_name() -> str | None:
    """Name of the current CUDA device, or None without one (torch imported lazily)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        pass
    return None


def current_gpu_capability(gpu_name: str) -> tuple[int, int] | None:
    """(major, minor) compute capability of the current CUDA device if it is named gpu_name, else None
    (no GPU, no torch, or a name that is another device's). torch is imported lazily: only the
    dispatcher of a GPU missing from the hardware table asks."""
    try:
        import torch

        if torch.cuda.is_available():
            dev = torch.cuda.current_device()
            if torch.cuda.get_device_name(dev) == gpu_name:
                major, minor = torch.cuda.get_device_capability(dev)
                return int(major), int(minor)
    except Exception:  # noqa: BLE001 - no torch or no driver: nothing to ask
        pass
    return None


def current_gpu_properties(gpu_name: str) -> dict | None:
    """The current CUDA device's measured numbers if it is named gpu_name, else None: its SM count,
    opt-in shared memory per block (bytes) and L2 (bytes), from torch.cuda.get_device_properties, for a
    GPU missing from the hardware table (torch imported lazily)."""
    try:
        import torch

        if torch.cuda.is_available():
            dev = torch.cuda.current_device()
            if torch.cuda.get_device_name(dev) == gpu_name:
                p = torch.cuda.get_device_properties(dev)
                return {"sm_count": int(p.multi_processor_count),
                        "smem_per_block": int(getattr(p, "shared_memory_per_block_optin", 0)
                                              or getattr(p, "shared_memory_per_block", 0)) or None,
                        "l2_bytes": int(getattr(p, "L2_cache_size", 0)) or None}
    except Exception:  # noqa: BLE001 - no torch or no driver: nothing to ask
        pass
    return None


def described_current_gpu(gpu_name: str):
    """hardware.describe_current() of the current device if it is named gpu_name, else None (no
    torch, no driver, or numbers missing). No timing: the driver's figures only (a probe is
    `costmodel describe-gpu --probe`, whose file COSTMODEL_GPU_SPECS then names)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.get_device_name(torch.cuda.current_device()) == gpu_name:
            spec = hardware.describe_current()
            warnings.warn(f"GPU {gpu_name!r} is not in the hardware table: described from its driver's numbers "
                          f"({spec.sm_count} SMs, {spec.l2_mb:.0f} MB L2, {spec.hbm_gbps:.0f} GB/s, "
                          f"{spec.tflops_16bit:.0f} TFLOP/s); `costmodel describe-gpu --probe --out F` and "
                          "COSTMODEL_GPU_SPECS=F pin measured ones", DispatchWarning, stacklevel=3)
            return spec
    except Exception:  # noqa: BLE001 - an undescribable card keeps the fallback path
        pass
    return None


def arch_of_capability(capability: tuple[int, int]) -> str:
    """'sm<major><minor>', the arch naming of the hardware table and the config spaces: (9, 0) -> 'sm90'."""
    major, minor = capability
    return f"sm{major}{minor}"


class _OnnxModel:
    """A loaded ONNX model and its manifest; the session is created once and kept."""

    def __init__(self, onnx_path: str, manifest: dict, threads: int = 1):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(onnx_path, sess_options=so, providers=["CPUExecutionProvider"])
        self.manifest = manifest
        # The cascade (export.write_cascade): the prefix trees score every candidate, the suffix
        # trees only the `keep` best by the prefix; None (score with the whole model) when the
        # manifest has none or its files do not match it (cascade_problem says why).
        self.cascade, self.cascade_problem = None, None
        cas = manifest.get("cascade")
        if isinstance(cas, dict):
            try:
                sessions = []
                for part in ("prefix", "suffix"):
                    path = os.path.join(os.path.dirname(onnx_path), os.path.basename(str(cas[part]["file"])))
                    problem = _integrity_problem(path, cas[part]) if os.path.isfile(path) else "missing"
                    if problem:
                        raise ValueError(f"{os.path.basename(path)}: {problem}")
                    sessions.append(ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"]))
                keep = cas["keep"]
                if type(keep) is not int or keep < 1:
                    raise ValueError(f"keep must be an int >= 1, got {keep!r}")
                self.cascade = (sessions[0], sessions[1], keep)
            except Exception as exc:  # noqa: BLE001 - a broken cascade only costs speed: score with the whole model
                self.cascade_problem = f"cascade not used ({type(exc).__name__}: {str(exc)[:160]})"
        self.input_name = manifest.get("input_name", self.session.get_inputs()[0].name)
        self.sign = float(manifest.get("score_sign", 1.0))
        self.latency = bool(manifest.get("predicts_log2_latency_us", False))
        # The vendor's ranking offset (TrainConfig.vendor_margin); manifests before it have none.
        self.vendor_margin = float(manifest.get("vendor_margin", 0.0) or 0.0)
        self.vendor_feature = int(manifest.get("vendor_feature", -1))
        if self.vendor_margin and not 0 <= self.vendor_feature < len(manifest.get("feature_names", ())):
            raise ValueError(f"vendor_margin {self.vendor_margin} without a valid vendor_feature index")
        self.path = onnx_path
        sl = manifest.get("shortlist") or {}
        self.m_edges = np.asarray(sl.get("m_edges", []), dtype=np.int64)
        # The same edges as Python ints: bisect_left is np.searchsorted(side="left") without a numpy call.
        self._m_edges = tuple(int(v) for v in self.m_edges)
        self.buckets = {int(b): frozenset(ids) for b, ids in (sl.get("buckets") or {}).items()}
        self._masks: dict[tuple[str, str, int], np.ndarray] = {}

    def shortlist_mask(self, ct, m: int) -> np.ndarray | None:
        """Candidate-table mask of the shortlist of M's bucket (None: score everything)."""
        if not self.buckets:
            return None
        b = bisect.bisect_left(self._m_edges, m)
        key = (ct.arch, ct.dtype, b)  # a mask indexes one candidate table: one per (arch, dtype)
        mask = self._masks.get(key)
        if mask is None:
            ids = self.buckets.get(b, frozenset())
            mask = np.array([cid in ids for cid in ct.ids], dtype=bool)
            self._masks[key] = mask
        return mask

    def score(self, X: np.ndarray, session=None) -> np.ndarray:
        out = (session or self.session).run(None, {self.input_name: np.ascontiguousarray(X, dtype=np.float32)})[0]
        return self.sign * np.asarray(out, dtype=np.float64).reshape(-1)

    def best(self, X: np.ndarray, tiebreak: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, scores) of the count best rows of X (lowest score first; ties by tiebreak), with
        their whole-model scores. A single pick (select) goes through the cascade when it is loaded
        and more than `keep` rows compete: only the prefix's `keep` best rows, and any tied with
        the last of them, get the suffix. A ranking (rank, count > 1) scores every row with the
        whole model, so its order is exact."""
        n = len(X)
        # The vendor's offset enters once, with the prefix or the whole model, as in CostModel.score.
        bias = -self.vendor_margin * X[:, self.vendor_feature] if self.vendor_margin else 0.0
        if self.cascade is not None and count == 1:
            prefix, suffix, keep = self.cascade
            if n > keep:
                s = self.score(X, prefix) + bias
                # Every row tied with the keep-th best goes on: the prefix's few trees give many
                # candidates the same score, and argpartition alone dropped tied rows arbitrarily,
                # the whole model's best among them once (dense fp8 2x2048x14336).
                top = np.flatnonzero(s <= np.partition(s, keep - 1)[keep - 1])
                s = s[top] + self.score(X[top], suffix)
                order = np.lexsort((tiebreak[top], s))[:count]
                return top[order], s[order]
        s = self.score(X) + bias
        order = np.lexsort((tiebreak, s))[:count]
        return order, s[order]


def model_name(op: str, arch: str, role: str = "decision") -> str:
    """File stem of a shipped model: <op>-<arch> for the decision model, <op>-<arch>-latency for its
    latency companion (the manifest lists the dtypes both serve)."""
    return f"{op}-{arch}" if role == "decision" else f"{op}-{arch}-{role}"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _integrity_problem(onnx_path: str, man: dict) -> str | None:
    """Why the ONNX file is not the one the manifest describes (onnx_bytes, onnx_sha256), or None.

    Manifests written before these fields existed have neither: they are served unchecked."""
    problems = []
    size, digest = man.get("onnx_bytes"), man.get("onnx_sha256")
    if size is not None:
        if type(size) is not int:
            return f"onnx_bytes must be an int, got {size!r}"
        actual = os.path.getsize(onnx_path)
        if actual != size:
            problems.append(f"{actual} bytes, the manifest's onnx_bytes says {size}")
    if digest is not None:
        if not isinstance(digest, str):
            return f"onnx_sha256 must be a hex string, got {digest!r}"
        actual = _sha256(onnx_path)
        if actual != digest.lower():
            problems.append(f"sha256 {actual[:12]}.., the manifest's onnx_sha256 says {digest[:12]}..")
    return "; ".join(problems) or None


def _space_hash(arch: str, dtype: str, op: str) -> str | None:
    """The space hash of (arch, dtype, op)'s candidate table, or None where the arch has no space."""
    try:
        return candidate_table(arch, dtype, op).space_hash
    except (ValueError, KeyError):
        return None


def manifest_digest(man: dict) -> str:
    """sha256 of a manifest's canonical JSON without its own ``manifest_sha256`` field: an edited
    manifest (say score_sign flipped, which inverts the ranking) no longer matches its seal."""
    body = {k: v for k, v in man.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal_manifest(man: dict) -> dict:
    """The manifest with its ``manifest_sha256`` set (export writes every manifest sealed)."""
    return {**man, "manifest_sha256": manifest_digest(man)}


def find_models(models_dir: str, op: str, dtype: str, arch: str,
                role: str = "decision") -> tuple[list[tuple[str, dict]], list[str]]:
    """Every model of this role that serves (op, dtype, arch) and passes the manifest checks, best first,
    and why the other manifests that would serve it were skipped.

    Checks, per manifest: readable JSON object; op, dtype and role served; arch; feature schema hash;
    the config space hash of the dtype (where the manifest has one); the .onnx beside it exists and matches the manifest's onnx_bytes and onnx_sha256. A stale or broken
    manifest is skipped, never allowed to hide a valid one. Order: the exported name
    (``model_name(op, arch, role)`` + ".json") first, then the others by file name, so a copy such as
    ``gemm-sm90-old.json`` lying beside ``gemm-sm90.json`` never wins over it."""
    if not os.path.isdir(models_dir):
        return [], [f"model folder {models_dir} does not exist"]
    canonical = model_name(op, arch, role) + ".json"
    names = sorted((n for n in os.listdir(models_dir) if n.endswith(".json")), key=lambda n: (n != canonical, n))
    found, reasons = [], []
    for name in names:
        path = os.path.join(models_dir, name)
        try:
            with open(path, encoding="utf-8") as fh:
                man = json.load(fh)
        except (OSError, ValueError) as exc:
            reasons.append(f"{name}: unreadable manifest ({str(exc)[:120]})")
            continue
        dtypes = man.get("dtypes", []) if isinstance(man, dict) else None
        if not isinstance(dtypes, list):  # a manifest of the wrong shape is skipped like a foreign one
            reasons.append(f"{name}: malformed manifest")
            continue
        if not (man.get("op") == op and dtype in dtypes and man.get("role", "decision") == role):
            continue
        # Sealed manifests are served only unedited; older ones without the field, unchecked.
        if "manifest_sha256" in man and man["manifest_sha256"] != manifest_digest(man):
            reasons.append(f"{name}: the manifest was edited after export (manifest_sha256 does not match its "
                           "contents; re-export the model, or re-seal it with "
                           "gemm_costmodel.serving.runtime.seal_manifest if the edit is intended)")
            continue
        if man.get("arch") != arch:
            reasons.append(f"{name} is for arch {man.get('arch')}, this GPU is {arch}")
            continue
        if man.get("feature_schema_hash") != F.schema_hash(op):
            # The features changed since the model was trained (e.g. an op gained features of its
            # own): scoring would feed it columns it never saw, so say how to get a valid one.
            reasons.append(f"{name}: feature schema hash {man.get('feature_schema_hash')} != "
                           f"this code's {F.schema_hash(op)} (trained with other features; retrain: "
                           f"costmodel run --op {op})")
            continue
        # A model trained before the config space changed has never seen the new candidates
        # (the GEMV variant came with a new variant code, not new features): it would rank them
        # blind. Manifests without the field are served unchecked.
        trained = man.get("config_space_hash")
        trained = trained.get(dtype) if isinstance(trained, dict) else None
        current = _space_hash(arch, dtype, op) if trained is not None else None
        if current is not None and trained != current:
            reasons.append(f"{name}: trained on config space {trained} for {dtype}, this code's is {current} "
                           "(the space changed since: retrain)")
            continue
        onnx_path = os.path.join(models_dir, name[:-5] + ".onnx")
        if not os.path.isfile(onnx_path):
            reasons.append(f"{name}: model file {os.path.basename(onnx_path)} is missing")
            continue
        try:
            problem = _integrity_problem(onnx_path, man)
        except OSError as exc:
            problem = f"cannot read it ({exc.strerror or exc})"
        if problem:
            reasons.append(f"{name}: {os.path.basename(onnx_path)} does not match its manifest ({problem})")
            continue
        found.append((onnx_path, man))
    return found, reasons


def find_model(models_dir: str, op: str, dtype: str, arch: str,
               role: str = "decision") -> tuple[str, dict] | tuple[None, str]:
    """(onnx path, manifest) of the preferred model of this role serving (op, dtype, arch), or (None, reason).
    See ``find_models`` for the checks and the order."""
    found, reasons = find_models(models_dir, op, dtype, arch, role)
    if found:
        return found[0]
    return None, "; ".join(reasons) or f"no {op} model for {dtype} on {arch} in {models_dir}"


class Dispatcher:
    """Chooses (and ranks) candidates for GEMM problems on one GPU.

    gpu_name: the device name (default: the current CUDA device); it selects the
    arch and the GPU numbers the features use. The arch comes from the hardware
    table, or for a GPU missing from it from torch's compute capability when the
    name is the current device's. Candidates come only from the arch's own space
    (``space_arch``; gemm.space.ARCHS: sm90, sm80); on any other or unknown arch
    every decision is the vendor library (source 'vendor', one DispatchWarning).
    fp8 needs fp8 tensor cores (sm89 and up): where the GPU has none (A100), fp8
    problems raise ValueError, since no candidate, not even the vendor's, runs them.
    tuned_table: a path or dict of exact-hit decisions ({"<dtype>:<M>x<N>x<K>":
    "config id"}; see ``add_tuned_table``).
    cache_size: LRU capacity of decisions. threads: onnxruntime intra-op threads.
    precompute: {dtype: [(N, K), ...]} to decide at load time over the default M grid
    (powers of two up to 16384), so serving starts with a warm cache.
    """

    # op defaults to the dense GEMM here only: the shipped decisions test and the README's first
    # example build Dispatcher(gpu_name=...) and must keep doing so; every other library function
    # takes the op.
    def __new__(cls, *args, op: str = "gemm", **kwargs):
        # An op with a dispatcher of its own (registry ``dispatcher``, e.g. a classifier op naming
        # kernels) gets an instance of that subclass; Python then runs its __init__.
        if cls is Dispatcher and isinstance(op, str) and op in registry.REGISTRY and registry.get(op).dispatcher:
            cls = registry._resolve(registry.get(op).dispatcher)
        return super().__new__(cls)

    def __init__(self, gpu_name: str | None = None, models_dir: str | None = None, tuned_table=None,
                 cache_size: int = 65536, threads: int = 1, op: str = "gemm", precompute=None):
        if gpu_name is None:
            gpu_name = current_gpu_name() or "unknown"
        elif not isinstance(gpu_name, str):
            raise ValueError(f"gpu_name must be a str (a CUDA device name), got {type(gpu_name).__name__} "
                             f"{gpu_name!r}")
        self.gpu_name = gpu_name
        self.models_dir = models_dir if models_dir is not None else _models_dir()
        self._op = registry.get(op)  # ValueError naming the known ops
        # Problem fields beyond (m, n, k, dtype, e, top_k), e.g. the MoE op's stage and routing.
        self._extra_names = self._op.extra_problem_fields()
        self._extra_defaults: dict | None = None
        self.op = op
        self.threads = threads
        self.spec = hardware.lookup(self.gpu_name)
        capability = None if self.spec is not None else current_gpu_capability(self.gpu_name)
        # Measured numbers of a GPU missing from the table (the current device only): its shared
        # memory per block bounds the candidates, its SM count feeds the fallback rule.
        self.measured = None if self.spec is not None else current_gpu_properties(self.gpu_name)
        # A card missing from the table but present here is described by its driver's numbers
        # (SMs, shared memory, L2, clocks, memory bus), so the model, whose hardware features
        # carry the card, still ranks for it (issue 58); None when they do not suffice.
        self.described = None
        if self.spec is None and self.measured is not None:
            self.described = described_current_gpu(self.gpu_name)
            if self.described is not None:
                self.spec = self.described
        # Configs needing more shared memory per block than this card has cannot launch: masked
        # (None: unknown, the arch space's own bound applies).
        self.smem_per_block = (hardware.smem_per_block(self.spec) if self.spec is not None
                               else (self.measured or {}).get("smem_per_block"))
        self._smem_ok: dict[tuple, np.ndarray] = {}
        self.arch = self.spec.arch if self.spec else (arch_of_capability(capability) if capability else None)
        # The arch whose candidate space this GPU runs, or None: then only the vendor library is offered.
        # Exact match only: sm86/sm89 have less shared memory than the sm80 space assumes.
        archs = self._op.space_module().ARCHS
        self.space_arch = self.arch if self.arch in archs else None
        # True/False, or None when nothing says (a GPU missing from the table, not the current device).
        self.fp8_supported = (self.spec.tflops_fp8 > 0) if self.spec else arch_has_fp8(self.arch)
        if self.space_arch is not None:
            self._vendor_reason = None
        elif self.arch is None:
            self._vendor_reason = (f"unknown GPU {self.gpu_name!r}, arch unknown: no candidate space is known to "
                                   "run on it (describe it with gemm_costmodel.kernels.hardware.register or "
                                   "COSTMODEL_GPU_SPECS)")
        else:
            self._vendor_reason = (f"{self.gpu_name!r} is {self.arch}: Triton candidate spaces exist only for "
                                   f"{', '.join(sorted(archs))}")
        self._warned: set[str] = set()
        self.fallback_reasons: dict[str, str] = {}
        self._tuned: dict[tuple, str] = {}
        if tuned_table is not None:
            self.add_tuned_table(tuned_table)
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = max(int(cache_size), 1)
        self._lock = threading.Lock()
        self._models: dict[str, _OnnxModel | None] = {}
        # (arch, dtype, op) -> F.CandidateFeatures; filled under the GIL, a racing duplicate is harmless.
        self._featurizers: dict[tuple, F.CandidateFeatures] = {}
        self._latency_models: dict[str, _OnnxModel | None] = {}
        self._model_lock = threading.Lock()
        for dtype, pairs in (precompute or {}).items():
            self.precompute(pairs, dtype)

    # -- model loading ----------------------------------------------------------
    def _warn_once(self, reason: str, to: str = "the heuristic") -> None:
        msg = f"gemm_costmodel: falling back to {to}: {reason}"
        if msg not in self._warned:
            self._warned.add(msg)
            warnings.warn(msg, DispatchWarning, stacklevel=4)

    def _load_first(self, dtype: str, role: str) -> tuple[_OnnxModel | None, str]:
        """The first model of find_models' order that loads, or (None, every reason)."""
        found, reasons = find_models(self.models_dir, self.op, dtype, self.arch, role)
        for path, man in found:
            try:
                model = _OnnxModel(path, man, self.threads)
                n_in = model.session.get_inputs()[0].shape[-1]
                if n_in in (None, len(F.feature_names(self.op))) or isinstance(n_in, str):
                    return model, ""
                reasons.append(f"{os.path.basename(path)}: expects {n_in} features")
            except Exception as exc:  # noqa: BLE001 - any broken model file means: try the next, then fall back
                reasons.append(f"{os.path.basename(path)}: cannot load ({type(exc).__name__}: {str(exc)[:120]})")
        return None, "; ".join(reasons) or f"no {self.op} model for {dtype} on {self.arch} in {self.models_dir}"

    def model_for(self, dtype: str) -> _OnnxModel | None:
        """The loaded model serving dtype on this GPU, or None (reason in fallback_reasons)."""
        if dtype in self._models:
            return self._models[dtype]
        with self._model_lock:
            if dtype in self._models:
                return self._models[dtype]
            model, reason = None, ""
            if self.spec is None:
                reason = (f"unknown GPU {self.gpu_name!r} (describe it with gemm_costmodel.kernels.hardware.register "
                          "or COSTMODEL_GPU_SPECS)")
            else:
                model, reason = self._load_first(dtype, "decision")
            if model is None:
                self.fallback_reasons[dtype] = reason
                self._warn_once(reason)
            self._models[dtype] = model
            return model

    def latency_model_for(self, dtype: str) -> _OnnxModel | None:
        """The log-latency companion of a rank/normalized decision model (None if absent or unusable)."""
        if dtype in self._latency_models:
            return self._latency_models[dtype]
        with self._model_lock:
            model = None
            if self.spec is not None:  # latencies are optional annotations: no warning without them
                model, _ = self._load_first(dtype, "latency")
            self._latency_models[dtype] = model
            return model

    # -- tuned tables ----------------------------------------------------------------
    def add_tuned_table(self, table) -> None:
        """Add exact-hit decisions: a dict or a JSON file {"entries": {"<dtype>:<M>x<N>x<K>": id}} (or flat)."""
        if isinstance(table, (str, os.PathLike)):
            with open(table, encoding="utf-8") as fh:
                table = json.load(fh)
        entries = table.get("entries", table) if isinstance(table, dict) else {}
        # A table serves one op (its "op" field; dense GEMM when absent); lookups are by this
        # dispatcher's op, so another op's table never answers here.
        op = table.get("op", registry.LEGACY_OP) if isinstance(table, dict) and "entries" in table else \
            registry.LEGACY_OP
        registry.get(op)
        entries = {k: v for k, v in entries.items() if k != "op"}
        unknown: set[str] = set()
        for key, cid in entries.items():
            cid = cid["candidate"] if isinstance(cid, dict) else cid
            try:
                dtype, dims = key.split(":")
                m, n, k = (int(v) for v in dims.split("x"))
            except ValueError:
                raise ValueError(f"tuned table key {key!r}: expected '<dtype>:<M>x<N>x<K>'") from None
            self._tuned[(op, m, n, k, dtype, 1, 1)] = str(cid)
            if not self._known_id(op, dtype, str(cid)):
                unknown.add(str(cid))
        if unknown:
            # An id this GPU cannot run (a typo, another op's or arch's config) is never served:
            # say so once, naming them, rather than ignoring the entries silently (issue 57, row 11).
            names = sorted(unknown)
            self._warn_once(f"tuned table: {len(names)} config id(s) are not candidates of {op} on "
                            f"{self.gpu_name!r} ({self.space_arch or 'vendor only'}) and are ignored: "
                            f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}",
                            to="the model or heuristic for their entries")
        with getattr(self, "_lock", threading.Lock()):
            if hasattr(self, "_cache"):
                self._cache.clear()

    def _known_id(self, op: str, dtype: str, cid: str) -> bool:
        """Whether a tuned table's id is a candidate this dispatcher could serve for (op, dtype)."""
        if op != self.op:
            return True  # another op's table never answers here: nothing to warn about
        if self.space_arch is None:
            return cid in self._op.vendor_ids
        try:
            return cid in candidate_table(self.space_arch, dtype, self.op).index
        except ValueError:  # no candidates for the dtype on this arch (fp8 without fp8 tensor cores)
            return False

    # -- decisions ---------------------------------------------------------------------
    def _check_runnable(self, n, k, dtype) -> None:
        """Raise ValueError for a problem that no candidate can run on this GPU."""
        if self.space_arch is None and not self._op.vendor_ids:
            raise ValueError(f"op {self.op} has no candidate on {self.gpu_name!r} ({self.arch or 'arch unknown'}): "
                             "no candidate space for its arch and no vendor library")
        if dtype not in ("fp8", "fp8bs"):  # fp8bs: the MoE op's block-scaled fp8
            return
        where = f"{self.gpu_name!r} ({self.arch or 'arch unknown'})"
        if self.fp8_supported is False:
            raise ValueError(f"dtype fp8 is not supported on {where}: no fp8 tensor cores, so neither the Triton "
                             "kernels nor torch._scaled_mm can run it")
        if self.space_arch is None and (k % 16 or n % 16):  # gemm.space.check_feasible's vendor rule
            raise ValueError(f"K and N must be multiples of 16 for fp8 on {where}, where torch._scaled_mm is the "
                             f"only candidate; got K={k}, N={n}")

    def _vendor_infeasible(self, vendor, m, n, k, dtype, e, top_k, extra) -> str:
        """Why the op's vendor candidate cannot run this problem on a GPU without a candidate space
        ('' when it can): the op's own check_feasible, under an arch whose space lists the vendor.
        A vendor that some space leaves out for this dtype (MoE's grouped_mm and the block-scaled
        cuBLASLt GEMM are sm90-only) is arch-specific, so it is not assumed to run on another arch."""
        space = self._op.space_module()
        listed = [a for a in sorted(space.ARCHS) if vendor in {c.id for c in self._op.configs(a, dtype)}]
        if not listed:
            return f"the op's config spaces offer it for no arch with dtype {dtype}"
        if len(listed) < len(space.ARCHS):
            return f"it is offered for {', '.join(listed)} only"
        problem = self._op.problem(m=m, n=n, k=k, dtype=dtype, e=e, top_k=top_k,
                                   **dict(zip(self._extra_names, extra)))
        ok, why = self._op.check_feasible(space.config_from_id(vendor), problem, listed[0])
        return "" if ok else why

    def _mask(self, ct, m, n, k) -> np.ndarray:
        """The table's feasibility mask for (m, n, k), less the configs needing more shared memory
        per block than this GPU has."""
        mask = ct.feasible_mask(m, n, k)
        if self.smem_per_block is None:
            return mask
        key = (ct.arch, ct.dtype, ct.op)
        ok = self._smem_ok.get(key)
        if ok is None:
            ok = self._smem_ok[key] = ct.smem <= self.smem_per_block
        return mask & ok

    def _feasible(self, m, n, k, dtype):
        ct = candidate_table(self.space_arch, dtype, self.op)
        return ct, np.flatnonzero(self._mask(ct, m, n, k))

    def _scored(self, model, ct, mask, m) -> np.ndarray:
        """Table indices the model scores: the feasible candidates of M's shortlist, or every feasible
        one where the shortlist has none (or the model has no shortlist)."""
        sl = model.shortlist_mask(ct, m)
        if sl is not None:
            scored = np.flatnonzero(mask & sl)
            if len(scored):
                return scored
        return np.flatnonzero(mask)

    def _featurizer(self, ct) -> F.CandidateFeatures:
        """The table's CandidateFeatures on this GPU (its config-only columns computed once)."""
        key = (ct.arch, ct.dtype, ct.op)
        fz = self._featurizers.get(key)
        if fz is None:
            fz = self._featurizers[key] = F.CandidateFeatures(ct.params, ct.variant_code, ct.dtype, self.spec, ct.op)
        return fz

    def _features(self, ct, idx, m, n, k, dtype, e, top_k, extra=()) -> np.ndarray:
        """Feature rows of the candidates idx of table ct: equal to F.compute on the same problem
        (tests/test_features.py), with the config-only columns taken from the table's cache."""
        mod = F.op_features(self.op)
        inputs = None
        if mod is not None:
            inputs = mod.problem_inputs(m, e, top_k, block_m=ct.params["block_m"][idx],
                                        **dict(zip(self._extra_names, extra)))
        return self._featurizer(ct).matrix(idx, m, n, k, e, top_k, inputs)

    def _latencies(self, X: np.ndarray, dtype: str):
        """Predicted latencies (us) of feature rows X from the latency companion, or None."""
        lm = self.latency_model_for(dtype)
        if lm is None:
            return None
        try:
            return np.exp2(lm.score(X))
        except Exception:  # noqa: BLE001 - an annotation never breaks a decision
            return None

    def _decide(self, m, n, k, dtype, e, top_k, count: int, extra: tuple = ()) -> list[Choice]:
        self._check_runnable(n, k, dtype)
        tuned = self._tuned.get((self.op, m, n, k, dtype, e, top_k, *extra))
        if self.space_arch is None:
            # No candidate space for this arch: the vendor library is the one candidate, if the op's
            # own feasibility rules let it run this problem; else no candidate does (issue 57, row 3).
            vendor = self._op.vendor_ids[0]
            why = self._vendor_infeasible(vendor, m, n, k, dtype, e, top_k, extra)
            if why:
                raise ValueError(f"no feasible {self.op} candidate for M={m}, N={n}, K={k}, {dtype} on "
                                 f"{self.gpu_name!r} ({self.arch or 'arch unknown'}): no Triton candidate space "
                                 f"for its arch, and the vendor library ({vendor}) cannot run it: {why}")
            if count == 1 and tuned == vendor:
                return [Choice(vendor, "table")]
            self.fallback_reasons.setdefault(dtype, self._vendor_reason)
            self._warn_once(self._vendor_reason, to=f"the vendor library ({vendor})")
            return [Choice(vendor, "vendor")]
        ct = candidate_table(self.space_arch, dtype, self.op)
        mask = self._mask(ct, m, n, k)
        if not mask.any():
            raise ValueError(f"no feasible {self.op} candidate for M={m}, N={n}, K={k}, {dtype} on {self.gpu_name!r} "
                             f"({self.space_arch}): every config of its space breaks a feasibility rule")
        if count == 1 and tuned is not None and tuned in ct.index and mask[ct.index[tuned]]:
            return [Choice(tuned, "table")]
        model = self.model_for(dtype)
        if model is not None:
            try:
                # The shortlist narrows what the model scores, not what the heuristic sees on a failure.
                scored = self._scored(model, ct, mask, m)
                X = self._features(ct, scored, m, n, k, dtype, e, top_k, extra)
                order, s = model.best(X, scored, count)
                if model.latency:
                    return [Choice(ct.ids[scored[i]], "model", float(t), float(si))
                            for i, si, t in zip(order, s, np.exp2(s))]
                rows = X[order]
                # The companion's estimates are computed on first read, for all the rows at once.
                lat = _Lazy(lambda: self._latencies(rows, dtype))
                return [Choice(ct.ids[scored[i]], "model", score=float(si), estimate=lat.item(r))
                        for r, (i, si) in enumerate(zip(order, s))]
            except Exception as exc:  # noqa: BLE001 - the serving path never raises for a model problem
                # One request the model could not score (e.g. a MemoryError on a huge one) says
                # nothing about the next: only this decision comes from the heuristic, the model
                # stays loaded, and the warning names this request (issue 57, row 1).
                # A model that cannot score even a small problem of the same kind is broken (say
                # an input name it does not have): that is process-wide, as a load failure is.
                problem = f"{type(exc).__name__}: {str(exc)[:120]}"
                if not self._model_scores(model, ct, dtype, n, k, e, top_k, extra):
                    reason = f"model scoring failed ({problem})"
                    self.fallback_reasons[dtype] = reason
                    self._warn_once(reason)
                    with self._model_lock:
                        self._models[dtype] = None
                else:
                    what = f"M={m}, N={n}, K={k}, {dtype}" + (f", E={e}, top_k={top_k}" if not self._op.fixed else "") \
                        + "".join(f", {f}={v!r}" for f, v in zip(self._extra_names, extra))
                    self._warn_once(f"model scoring failed for {self.op} {what} ({problem}); this decision only, "
                                    "the model stays in use")
        sm = self.spec.sm_count if self.spec else (self.measured or {}).get("sm_count", 132)
        # The op's own fields its rule takes (MoE: e, top_k).
        fields = {"e": e, "top_k": top_k, "dtype": dtype, **dict(zip(self._extra_names, extra))}
        kw = {f: fields[f] for f in self._op.fallback_fields()}
        idx = np.flatnonzero(mask)
        rule = self._op.fallback_rule_arrays()
        if rule is not None:  # the rule over arrays: the same index, without a dict per candidate
            i = rule(m, n, k, sm, ct.candidate_arrays(idx), **kw)
        else:
            i = self._op.fallback_rule()(m, n, k, sm, ct.candidate_dicts(idx), **kw)
        return [Choice(ct.ids[idx[i]], "heuristic")]

    def _model_scores(self, model, ct, dtype, n, k, e, top_k, extra) -> bool:
        """Whether the model scores the M = 1 problem of the same N, K and fields, those with a
        default in the op's Problem at that default (MoE: the balanced routing): the probe that
        tells a broken model from one request it cannot score."""
        defaults = self._field_defaults()
        probe = tuple(defaults.get(f, v) for f, v in zip(self._extra_names, extra))
        try:
            idx = np.flatnonzero(self._mask(ct, 1, n, k))
            model.best(self._features(ct, idx, 1, n, k, dtype, e, top_k, probe), idx, 1)
            return True
        except Exception:  # noqa: BLE001 - any failure of the probe means the model is unusable
            return False

    def _field_defaults(self) -> dict:
        """The defaults of the op's Problem fields (MoE: routing 'balanced')."""
        defaults = self._extra_defaults
        if defaults is None:  # once per dispatcher: the warm path stays a few dict lookups
            import dataclasses

            defaults = self._extra_defaults = {f.name: f.default for f in
                                               dataclasses.fields(self._op.space_module().Problem)
                                               if f.default is not dataclasses.MISSING}
        return defaults

    def _extra(self, fields: dict) -> tuple:
        """The op's extra problem fields (``OpSpec.extra_problem_fields``) in order; ValueError naming
        a missing or unknown one. Defaults come from the op's Problem."""
        names = self._extra_names
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise ValueError(f"op {self.op} has no problem field {unknown[0]!r}"
                             + (f" (its extra fields: {', '.join(names)})" if names else ""))
        if not names:
            return ()
        defaults = self._field_defaults()
        out = []
        for f in names:
            if f in fields:
                out.append(fields[f])
            elif f in defaults:
                out.append(defaults[f])
            else:
                raise ValueError(f"op {self.op} needs the problem field {f!r}")
        return tuple(out)

    def _check_extra(self, m, n, k, dtype, e, top_k, extra: tuple) -> None:
        """Validate a problem with extra fields through the op's Problem (it names the bad field)."""
        if extra:
            self._op.problem_of({"m": m, "n": n, "k": k, "dtype": dtype, "e": e, "top_k": top_k,
                                 **dict(zip(self._extra_names, extra))})

    def select(self, m: int, n: int, k: int, dtype: str = "bf16", e: int = 1, top_k: int = 1, **fields) -> Choice:
        """The candidate to launch for y (M, N) = x (M, K) @ w (N, K).T (for MoE, one stage:
        ``stage=`` 'gate_up' or 'down', optional ``routing=``). Cached; thread-safe."""
        if fields or self._extra_names:
            extra = self._extra(fields)
            key = (self.op, m, n, k, dtype, e, top_k) + extra
        else:  # one-stage ops: the warm path is one tuple and one dict lookup
            extra = ()
            key = (self.op, m, n, k, dtype, e, top_k)
        try:
            hit = self._cache.get(key)
        except TypeError:  # an unhashable argument: check_problem names it below
            hit = None
        # A float or bool equal to an int key would hit too: only exact ints take the fast path.
        if hit is not None and type(m) is int and type(n) is int and type(k) is int and type(e) is int \
                and type(top_k) is int:
            try:
                self._cache.move_to_end(key)  # LRU order; atomic under the GIL
            except KeyError:  # evicted by another thread meanwhile: the answer is still valid
                pass
            return hit
        check_problem(m, n, k, dtype, e, top_k)
        self._op.check_fixed({"e": e, "top_k": top_k})
        self._check_extra(m, n, k, dtype, e, top_k, extra)
        if hit is not None:  # numpy ints equal to a cached key: valid now that they are checked
            try:
                self._cache.move_to_end(key)
            except KeyError:
                pass
            return hit
        key = (self.op, int(m), int(n), int(k), dtype, int(e), int(top_k), *extra)
        choice = self._decide(*key[1:7], count=1, extra=extra)[0]
        with self._lock:
            self._cache[key] = choice
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return choice

    def rank(self, m: int, n: int, k: int, dtype: str = "bf16", count: int = 8, e: int = 1, top_k: int = 1,
             **fields) -> list[Choice]:
        """The model's top ``count`` feasible candidates, best first (not cached).
        Without a usable model, the heuristic's single choice; without a candidate space for the
        GPU's arch, the vendor's. MoE: ``stage=`` and optional ``routing=`` as for ``select``."""
        check_problem(m, n, k, dtype, e, top_k)
        self._op.check_fixed({"e": e, "top_k": top_k})
        extra = self._extra(fields) if fields or self._extra_names else ()
        self._check_extra(m, n, k, dtype, e, top_k, extra)
        # numpy ints are ints here as in select's fields; bools are not counts.
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        return self._decide(int(m), int(n), int(k), dtype, int(e), int(top_k), count=int(count), extra=extra)

    def warm_up(self, dtypes=("bf16", "fp16", "fp8")) -> list[str]:
        """Pay now what each dtype's first decision would otherwise pay once per process: the model's
        onnxruntime sessions (and their first run), the candidate table, its feature cache and the
        shortlist masks of every M bucket. A server calls it at start-up so that no request does;
        without it the first decision of a dtype took 2-3x a cold one (0.45-0.53 ms vs ~0.17 ms on
        the 2-core dev CPU). Returns the dtypes warmed: those this GPU can run; decisions and the
        cache are unchanged. ValueError for an unknown dtype."""
        warmed = []
        for dt in dtypes:
            check_problem(1, 1, 1, dt)  # names a bad dtype
            try:
                self._check_runnable(4096, 4096, dt)
            except ValueError:  # not runnable on this GPU (e.g. fp8 before Hopper): nothing to warm
                continue
            warmed.append(dt)
            if self.space_arch is None:
                continue
            ct = candidate_table(self.space_arch, dt, self.op)
            self._featurizer(ct)
            model = self.model_for(dt)
            if model is None:
                if self._op.fallback_rule_arrays() is not None:  # the fallback rule's arrays, built once
                    ct.candidate_arrays(np.zeros(0, dtype=np.int64))
                continue
            for b in range(len(model._m_edges) + 1):
                model.shortlist_mask(ct, model._m_edges[b] if b < len(model._m_edges) else 1 << 30)
            self.latency_model_for(dt)
            if not self._extra_names:  # ops with extra problem fields (MoE's stage) skip the trial run
                # One uncached decision runs every session once (onnxruntime's first run allocates).
                self._decide(64, 4096, 4096, dt, 1, 1, count=1)
        return warmed

    def precompute(self, nk_pairs, dtype: str = "bf16", ms=None) -> int:
        """Fill the cache for every (N, K) in nk_pairs over an M grid (default: powers of two to 16384)."""
        ms = list(ms) if ms is not None else [2 ** i for i in range(15)]
        count = 0
        for n, k in nk_pairs:
            for m in ms:
                self.select(int(m), int(n), int(k), dtype)
                count += 1
        return count

    def cache_info(self) -> dict:
        """Entries in the decision cache and its capacity."""
        return {"entries": len(self._cache), "capacity": self._cache_size}

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()


# The process-wide dispatchers for the current GPU, by op (created on first use).
_defaults: dict[str, Dispatcher] = {}
_default_lock = threading.Lock()


def default_dispatcher(op: str) -> Dispatcher:
    """The process-wide dispatcher of ``op`` for the current GPU (created on first use)."""
    d = _defaults.get(op)
    if d is None:
        with _default_lock:
            d = _defaults.get(op)
            if d is None:
                registry.get(op)  # ValueError naming the known ops
                d = _defaults[op] = Dispatcher(op=op)
    return d


def select(m: int, n: int, k: int, dtype: str = "bf16", *, op: str, **fields) -> Choice:
    """default_dispatcher(op).select(...)."""
    return default_dispatcher(op).select(m, n, k, dtype, **fields)


def rank(m: int, n: int, k: int, dtype: str = "bf16", count: int = 8, *, op: str, **fields) -> list[Choice]:
    """default_dispatcher(op).rank(...)."""
    return default_dispatcher(op).rank(m, n, k, dtype, count, **fields)
