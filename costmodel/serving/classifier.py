"""Serving of a classifier op (numpy and onnxruntime only): the model names the kernel directly.

``Dispatcher(gpu_name="AMD Instinct MI300X", op="ck_a8w8_blockscale")`` returns an instance of
``ClassifierDispatcher`` (the registry's ``dispatcher`` of the op). Nothing here is specific to
the CK op: the op's registered ``space`` module gives ``gpu_of(name) -> (arch, cu_num)``,
``feasible(kernel, k)``, ``choose(problem, arch)`` (the rule without a model) and ``Problem``; its
``features`` module gives ``features(m, n, k, cu_num)`` and ``schema_hash()``. The model is
``<models>/<op>-<arch>.onnx`` with its manifest ``<op>-<arch>.json``, whose ``classes`` list the
kernel names in the order of the model's probability columns.

A pick is the most probable class that is feasible for the problem, so any shape, seen or not,
gets a kernel the tables hold for the arch. With no usable model (missing, edited, another
feature schema) the op's rule decides (source 'heuristic') and the reason is warned once.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

from gemm_costmodel.serving.runtime import Choice, DispatchWarning, Dispatcher, _models_dir, current_gpu_name


class ClassifierDispatcher(Dispatcher):
    """Picks a named kernel per problem with a classifier; see the module doc."""

    def __init__(self, gpu_name: str | None = None, models_dir: str | None = None, tuned_table=None,
                 cache_size: int = 65536, threads: int = 1, op: str = "", precompute=None):
        from gemm_costmodel import registry

        self._op = registry.get(op)
        self.op = op
        self._space = self._op.space_module()
        self._feat = self._op.features_module()
        self.gpu_name = gpu_name if gpu_name is not None else (current_gpu_name() or "unknown")
        self.arch, self.cu_num = self._space.gpu_of(self.gpu_name)  # ValueError naming the GPU
        self.space_arch = self.arch
        self.models_dir = models_dir if models_dir is not None else _models_dir()
        self.threads = threads
        self._tuned: dict[tuple, str] = {}
        for key, name in (tuned_table or {}).items():  # {"MxNxK": kernel}: exact hits win
            m, n, k = (int(x) for x in key.split("x"))
            self._tuned[(m, n, k)] = name
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = max(int(cache_size), 1)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.fallback_reasons: dict[str, str] = {}
        self._session, self._classes, reason = self._load()
        if reason:
            self.fallback_reasons[self.arch] = reason
            msg = f"gemm_costmodel: falling back to the heuristic: {reason}"
            self._warned.add(msg)
            warnings.warn(msg, DispatchWarning, stacklevel=3)

    def _load(self):
        base = os.path.join(self.models_dir, f"{self.op}-{self.arch}")
        try:
            with open(base + ".json") as fh:
                man = json.load(fh)
            with open(base + ".onnx", "rb") as fh:
                data = fh.read()
        except OSError as exc:
            return None, None, f"no {self.op} model for {self.arch}: {exc}"
        except ValueError as exc:
            return None, None, f"{base}.json is not JSON: {exc}"
        if man.get("op") != self.op or man.get("arch") != self.arch:
            return None, None, f"{base}.json is for op {man.get('op')!r} arch {man.get('arch')!r}"
        if man.get("schema_hash") != self._feat.schema_hash():
            return None, None, f"{base}.json: feature schema {man.get('schema_hash')!r} is not this version's"
        if len(data) != man.get("onnx_bytes") or hashlib.sha256(data).hexdigest() != man.get("onnx_sha256"):
            return None, None, f"{base}.onnx does not match its manifest's size and sha256"
        try:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = self.threads
            sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - a model problem never raises on the serving path
            return None, None, f"{base}.onnx does not load: {exc}"
        return sess, np.array(man["classes"]), ""

    def _proba(self, m, n, k) -> np.ndarray:
        X = self._feat.features(m, n, k, self.cu_num)
        outs = self._session.run(None, {self._session.get_inputs()[0].name: X})
        p = outs[-1]
        if isinstance(p, list):  # a ZipMap output: [{class index: probability}]
            p = np.array([[r[i] for i in range(len(self._classes))] for r in p])
        return np.asarray(p, dtype=np.float64)[0]

    def _decide(self, m, n, k, count):
        if (m, n, k) in self._tuned:
            return [Choice(self._tuned[(m, n, k)], "table")]
        if self._session is None:
            return [Choice(self._space.choose(self._space.Problem(m, n, k), self.arch), "heuristic")]
        p = self._proba(m, n, k)
        ok = np.array([self._space.feasible(c, k) for c in self._classes])
        order = [i for i in np.argsort(-p, kind="stable") if ok[i]]
        return [Choice(str(self._classes[i]), "model", score=float(p[i])) for i in order[:count]]

    def _check(self, m, n, k, dtype, e, top_k, fields):
        if fields:
            raise ValueError(f"{self.op} takes no extra fields, got {', '.join(sorted(fields))}")
        self._op.check_fixed({"e": e, "top_k": top_k})
        self._space.Problem(m, n, k, dtype)  # ValueError naming the bad field

    def select(self, m: int, n: int, k: int, dtype: str = "fp8", e: int = 1, top_k: int = 1, **fields) -> Choice:
        """The kernel name to run for y (M, N) = x (M, K) @ w (N, K).T. Cached; thread-safe."""
        self._check(m, n, k, dtype, e, top_k, fields)
        key = (m, n, k)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        choice = self._decide(m, n, k, 1)[0]
        with self._lock:
            self._cache[key] = choice
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return choice

    def rank(self, m: int, n: int, k: int, dtype: str = "fp8", count: int = 8, e: int = 1, top_k: int = 1,
             **fields) -> list[Choice]:
        """The ``count`` most probable feasible kernels, best first (the rule's one pick without a model)."""
        self._check(m, n, k, dtype, e, top_k, fields)
        if type(count) is not int or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        return self._decide(m, n, k, count)

    def warm_up(self, dtypes=()) -> list[str]:
        if self._session is not None:
            self._proba(1, 128, 128)
        return [self.arch]

    def precompute(self, nk_pairs, dtype: str = "fp8", ms=None) -> int:
        ms = ms or [2 ** i for i in range(15)]
        for n, k in nk_pairs:
            for m in ms:
                self.select(m, n, k, dtype)
        return len(self._cache)

    def cache_info(self) -> dict:
        return {"size": len(self._cache), "capacity": self._cache_size}

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
