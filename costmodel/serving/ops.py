"""Convenience ops: dispatch, then launch. ``gemm(x, w)`` and ``gemm_fp8(x, w, scale_a, scale_b)``
compute y = x @ w.T (nn.Linear layout: x is (M, K), w is (N, K)).

Both are torch custom ops (``torch.ops.gemm_costmodel.gemm`` / ``gemm_fp8``) with
fake implementations, so they trace under torch.compile and replay inside CUDA
graphs: the decision is made on the host from the shapes alone, never by reading
the GPU.

Unsure mode (opt-in, ``enable_unsure_mode``): the first call of a new shape
benchmarks the model's top k candidates on the GPU, keeps the fastest, and
persists the winner with provenance to a JSON file that later processes load as
a tuned table. Cost: about k x (compile ~0.4 s when not cached + ~30 ms timing)
on the first call per shape; none afterwards. Never benchmarks during CUDA-graph
capture (the model's choice is used there).
"""
from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from typing import Callable

import torch

from gemm_costmodel import registry
from gemm_costmodel.serving.runtime import Dispatcher, default_dispatcher

# The dense GEMM op: its space and (torch, triton) implementation, from the registry.
_OP = registry.get("gemm")
K = _OP.impl_module()

_dispatcher: Dispatcher | None = None
_configs: dict[str, object] = {}
_unsure: "UnsureTuner | None" = None


def set_dispatcher(d: Dispatcher | None) -> None:
    """Use ``d`` for the ops (None: the process-wide default for the current GPU)."""
    global _dispatcher
    _dispatcher = d


def dispatcher() -> Dispatcher:
    """The dispatcher the ops use."""
    return _dispatcher if _dispatcher is not None else default_dispatcher()


def _config(cid: str):
    cfg = _configs.get(cid)
    if cfg is None:
        cfg = _configs[cid] = _OP.config_from_id(cid)
    return cfg


def choose(x: torch.Tensor, w: torch.Tensor, scale_a=None, scale_b=None) -> str:
    """The config id the ops would launch for these operands (validates them)."""
    name = K.check_operands(x, w, scale_a, scale_b)
    m, k = x.shape
    n = w.shape[0]
    if _unsure is not None:
        return _unsure.choose(x, w, scale_a, scale_b, name)
    return dispatcher().select(m, n, k, name).candidate


def _run(x, w, scale_a=None, scale_b=None) -> torch.Tensor:
    return K.launch(_config(choose(x, w, scale_a, scale_b)), x, w, None, scale_a, scale_b)


@torch.library.custom_op("gemm_costmodel::gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _run(x, w)


@_gemm_op.register_fake
def _(x, w):
    return x.new_empty((x.shape[0], w.shape[0]))


@torch.library.custom_op("gemm_costmodel::gemm_fp8", mutates_args=())
def _gemm_fp8_op(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    return _run(x, w, scale_a, scale_b)


@_gemm_fp8_op.register_fake
def _(x, w, scale_a, scale_b):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)


# Eager calls skip the custom-op dispatcher: it costs ~20 us of host time per call on
# launch-bound shapes (measured on the H100 host), while tracing (torch.compile) needs
# the registered op. Both paths run the same decision and launch.

def gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ w.T for bf16/fp16 x (M, K) and w (N, K), on the dispatched kernel."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm(x, w)
    return _run(x, w)


def gemm_fp8(x: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """y = (x @ w.T) * scale_a * scale_b in bf16, for fp8 e4m3 x (M, K), w (N, K) and fp32 scalar scales."""
    if torch.compiler.is_compiling():
        return torch.ops.gemm_costmodel.gemm_fp8(x, w, scale_a, scale_b)
    return _run(x, w, scale_a, scale_b)


# -- unsure mode -----------------------------------------------------------------------

def _do_bench(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=3, rep=15))


class UnsureTuner:
    """Benchmark the model's top k on first sight of a shape; cache and persist the winner."""

    def __init__(self, d: Dispatcher, k: int = 8, cache_file: str | None = None,
                 bench: Callable[[Callable[[], object]], float] | None = None):
        if type(k) is not int or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.d, self.k, self.cache_file = d, k, cache_file
        self.bench = bench or _do_bench
        self.entries: dict[str, dict] = {}
        self._lock = threading.Lock()
        if cache_file and os.path.isfile(cache_file):
            with open(cache_file, encoding="utf-8") as fh:
                self.entries = dict(json.load(fh).get("entries", {}))
        self._winners = {key: e["candidate"] for key, e in self.entries.items()}

    def choose(self, x, w, scale_a, scale_b, dtype: str) -> str:
        m, k = x.shape
        n = w.shape[0]
        key = f"{dtype}:{m}x{n}x{k}"
        hit = self._winners.get(key)
        if hit is not None:
            return hit
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.d.select(m, n, k, dtype).candidate
        ranked = self.d.rank(m, n, k, dtype, count=self.k)
        ref = None
        times = {}
        for c in ranked:
            cfg = _config(c.candidate)
            try:
                y = K.launch(cfg, x, w, None, scale_a, scale_b)
                if ref is None:
                    ref = y.float()
                elif not torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2):
                    times[c.candidate] = float("inf")  # disagrees with the model's first choice: never pick it
                    continue
                times[c.candidate] = self.bench(lambda: K.launch(cfg, x, w, None, scale_a, scale_b))
            except Exception:  # noqa: BLE001 - a candidate that fails to run is skipped, not fatal
                times[c.candidate] = float("inf")
        finite = {c: t for c, t in times.items() if t < float("inf")}
        winner = min(finite, key=finite.get) if finite else ranked[0].candidate
        with self._lock:
            self._winners[key] = winner
            self.entries[key] = {"candidate": winner, "ms": finite.get(winner), "timed": times,
                                 "model_top1": ranked[0].candidate}
            self._persist()
        return winner

    def _persist(self) -> None:
        if not self.cache_file:
            return
        from gemm_costmodel.util import git_sha

        prov = {"gpu_name": self.d.gpu_name, "torch": torch.__version__, "git_sha": git_sha(),
                "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"), "k": self.k}
        try:
            import triton

            prov["triton"] = triton.__version__
        except ImportError:  # pragma: no cover
            pass
        tmp = self.cache_file + ".tmp"
        os.makedirs(os.path.dirname(os.path.abspath(self.cache_file)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"format": "gemm_costmodel.tuned/1", "provenance": prov, "entries": self.entries}, fh, indent=1)
        os.replace(tmp, self.cache_file)


def enable_unsure_mode(k: int = 8, cache_file: str | None = None, bench=None) -> UnsureTuner:
    """Turn on unsure mode for the ops (see the module docstring for its cost)."""
    global _unsure
    _unsure = UnsureTuner(dispatcher(), k=k, cache_file=cache_file, bench=bench)
    return _unsure


def disable_unsure_mode() -> None:
    """Back to model decisions."""
    global _unsure
    _unsure = None
