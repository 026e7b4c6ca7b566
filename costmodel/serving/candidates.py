"""The candidate space of one (arch, dtype) as numpy arrays, with the vectorised
per-problem feasibility mask. The runtime featurises all feasible candidates of a
problem at once from this table. The mask is the op's own rule list applied to the
whole space (``gemm.space.problem_mask``); ``check_feasible`` is its one-config case.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from gemm_costmodel import registry
from gemm_costmodel.serving.features import PARAMS, VARIANT_CODES


def arch_has_fp8(arch: str | None) -> bool | None:
    """Whether an arch named 'sm<major><minor>' has fp8 tensor cores (Ada sm89, Hopper sm90 and on);
    None when the name says nothing (None, or not an NVIDIA sm name). Triton's fp8 dot and the
    vendor's torch._scaled_mm both need them."""
    digits = arch[2:].rstrip("abf") if isinstance(arch, str) and arch.startswith("sm") else ""
    return int(digits) >= 89 if digits.isdigit() else None


class _Dims(NamedTuple):
    m: int
    n: int
    k: int
    dtype: str


class CandidateArrays(NamedTuple):
    """Some candidates of a table as arrays, what an op's array fallback rule reads (e.g.
    ``space_common.nearest_log2``): ``tiled`` (bool), ``variant`` (str), ``params`` and ``log2``
    ({PARAMS name: float64 array}; ``log2`` is ``math.log2(max(v, 1))``, the dict rules' own float)."""
    tiled: np.ndarray
    variant: np.ndarray
    params: dict
    log2: dict


class CandidateTable:
    """Configs of generate_configs(arch, dtype) in a stable order, plus their parameters as arrays."""

    def __init__(self, arch: str, dtype: str, op: str):
        if dtype in ("fp8", "fp8bs") and arch_has_fp8(arch) is False:
            # generate_configs lists the fp8 configs by shared memory alone; none of them runs here.
            raise ValueError(f"dtype fp8 has no candidates on {arch}: no fp8 tensor cores")
        self.arch, self.dtype, self.op = arch, dtype, op
        self._space = G = registry.get(op).space_module()
        self.configs = G.generate_configs(arch, dtype)
        self.ids = [c.id for c in self.configs]
        self.index = {cid: i for i, cid in enumerate(self.ids)}
        self.params = {p: np.array([G.config_params(c)[p] for c in self.configs], dtype=np.float64)
                       for p in PARAMS}
        self.variant_code = np.array([VARIANT_CODES[c.variant] for c in self.configs], dtype=np.float64)
        self.variants = [c.variant for c in self.configs]
        self.space_hash = G.space_hash(self.configs)
        # Shared memory each config needs: a GPU with less per block than its arch's space assumes
        # cannot launch it (the runtime masks those; issue 57, row 5).
        self.smem = np.array([G.smem_bytes(c, dtype) for c in self.configs], dtype=np.int64)
        self._arrays = G.ConfigArrays(self.configs)

    def __len__(self) -> int:
        return len(self.ids)

    def feasible_mask(self, m: int, n: int, k: int) -> np.ndarray:
        """Boolean mask of the configs that can run (m, n, k): the rules of check_feasible."""
        # The dimensions were checked by the caller (runtime.check_problem): no Problem
        # validation on the cold path.
        return self._space.problem_mask(self._arrays, _Dims(int(m), int(n), int(k), self.dtype))

    def candidate_arrays(self, idx) -> CandidateArrays:
        """The candidates ``idx`` as arrays (an array fallback rule's input, ``candidate_dicts``'s
        content). The table's own arrays are built on first use and kept: a cold decision then
        slices them, instead of building one dict per candidate (1,250 in the vLLM spaces)."""
        full = self.__dict__.get("_candidate_arrays")
        if full is None:
            variant = np.array(self.variants)
            # math.log2 per value, not np.log2: the dict rules' floats, bit for bit.
            log2 = {p: np.array([math.log2(max(int(v), 1)) for v in self.params[p]]) for p in PARAMS}
            full = self._candidate_arrays = CandidateArrays(variant == "tiled", variant, self.params, log2)
        return CandidateArrays(full.tiled[idx], full.variant[idx], {p: a[idx] for p, a in full.params.items()},
                               {p: a[idx] for p, a in full.log2.items()})

    def candidate_dicts(self, idx) -> list[dict]:
        """{'variant', PARAMS...} of the given indices (the heuristic's input)."""
        return [{"variant": self.variants[i], **{p: int(self.params[p][i]) for p in PARAMS}} for i in idx]


@lru_cache(maxsize=None)
def table(arch: str, dtype: str, op: str) -> CandidateTable:
    """The (cached) table of an op's (arch, dtype)."""
    return CandidateTable(arch, dtype, op)
