"""Adopt the cost model in an existing ``triton.autotune`` with one line::

    from gemm_costmodel.serving.triton_adapter import PerfModel, configs

    @triton.autotune(configs=configs("bf16"), key=["M", "N", "K"],
                     prune_configs_by={"perf_model": PerfModel(), "top_k": 8})
    @triton.jit
    def my_gemm(a_ptr, b_ptr, c_ptr, M, N, K, ..., BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ...):

Triton calls the perf model once per config with the kernel's arguments and the
config's kwargs; only the ``top_k`` best-scored configs are then benchmarked.
The scores come from the shipped model for the classic tiled kernel (the
``tiled`` variant): they fit kernels of that shape (grouped-order output tiles,
full-K loop). Lower score = predicted faster.
"""
from __future__ import annotations

import threading

import numpy as np

from gemm_costmodel.serving import features as F
from gemm_costmodel.serving.runtime import Dispatcher, default_dispatcher

# Triton meta-parameter name -> config parameter of the model.
DEFAULT_NAMES = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k", "GROUP_M": "group_m",
                 "num_warps": "num_warps", "num_stages": "num_stages"}
_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float8_e4m3fn": "fp8"}
# The op whose model scores the configs: the adapter prunes dense GEMM kernels' tiled configs.
OP = "gemm"


class PerfModel:
    """A ``perf_model`` for ``triton.autotune``'s ``prune_configs_by``.

    m, n, k: names of the kernel arguments holding the problem sizes. dtype: the
    input dtype; by default it is read from the first tensor argument. names:
    how the config's meta-parameters map to the model's parameters.
    """

    def __init__(self, dispatcher: Dispatcher | None = None, m: str = "M", n: str = "N", k: str = "K",
                 dtype: str | None = None, names: dict | None = None, variant: str = "tiled"):
        self._d = dispatcher
        self.m, self.n, self.k, self.dtype = m, n, k, dtype
        self.names = dict(DEFAULT_NAMES if names is None else names)
        self.variant = variant
        self._cache: dict[tuple, float] = {}
        self._lock = threading.Lock()

    @property
    def dispatcher(self) -> Dispatcher:
        return self._d if self._d is not None else default_dispatcher(OP)

    def _dtype(self, kwargs) -> str:
        if self.dtype:
            return self.dtype
        for v in kwargs.values():
            name = _TORCH_DTYPES.get(str(getattr(v, "dtype", "")))
            if name:
                return name
        raise ValueError("cannot infer the dtype from the kernel arguments: pass PerfModel(dtype=...)")

    def __call__(self, **kwargs) -> float:
        for name in (self.m, self.n, self.k):
            if name not in kwargs:
                raise ValueError(f"kernel argument {name!r} not found: pass PerfModel(m=..., n=..., k=...)")
        m, n, k = int(kwargs[self.m]), int(kwargs[self.n]), int(kwargs[self.k])
        dtype = self._dtype(kwargs)
        params = {p: 0 for p in F.PARAMS}
        params["split_k"] = 1
        for meta, p in self.names.items():
            if meta in kwargs and kwargs[meta] is not None:
                params[p] = int(kwargs[meta])
        if not params["group_m"]:
            params["group_m"] = 1
        key = (m, n, k, dtype, tuple(sorted(params.items())))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        score = self._score(m, n, k, dtype, params)
        with self._lock:
            self._cache[key] = score
        return score

    def _score(self, m, n, k, dtype, params) -> float:
        d = self.dispatcher
        model = d.model_for(dtype)
        if model is None:
            # No model: a roofline-style estimate keeps the pruning meaningful.
            tiles = -(-m // max(params["block_m"], 1)) * -(-n // max(params["block_n"], 1))
            waves = -(-tiles // (d.spec.sm_count if d.spec else 132))
            return float(waves * params["block_m"] * params["block_n"] * k)
        cols = F.problem_columns(m, n, k, dtype, d.spec, F.VARIANT_CODES[self.variant],
                                 {p: np.float64(v) for p, v in params.items()})
        return float(model.score(F.compute(cols, op=OP))[0])


def configs(dtype: str = "bf16", arch: str = "sm90", names: dict | None = None):
    """triton.Config objects for the tiled candidates of the model's space (meta-parameter names per ``names``)."""
    import triton

    from gemm_costmodel import registry

    names = dict(DEFAULT_NAMES if names is None else names)
    inv = {v: k for k, v in names.items()}
    out = []
    for c in registry.get(OP).configs(arch, dtype, include_vendor=False):
        if c.variant != "tiled":
            continue
        meta = {inv[p]: getattr(c, p) for p in ("block_m", "block_n", "block_k", "group_m") if p in inv}
        out.append(triton.Config(meta, num_warps=c.num_warps, num_stages=c.num_stages))
    return out
