"""The candidate space of one (arch, dtype) as numpy arrays, with a vectorised
per-problem feasibility mask. The runtime featurises all feasible candidates of a
problem at once from this table; tests check the mask against
``gemm_configs.check_feasible`` config by config.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from gemm_costmodel.features import PARAMS, VARIANT_CODES
from gemm_costmodel.kernels import gemm_configs as G


def arch_has_fp8(arch: str | None) -> bool | None:
    """Whether an arch named 'sm<major><minor>' has fp8 tensor cores (Ada sm89, Hopper sm90 and on);
    None when the name says nothing (None, or not an NVIDIA sm name). Triton's fp8 dot and the
    vendor's torch._scaled_mm both need them."""
    digits = arch[2:].rstrip("abf") if isinstance(arch, str) and arch.startswith("sm") else ""
    return int(digits) >= 89 if digits.isdigit() else None


class CandidateTable:
    """Configs of generate_configs(arch, dtype) in a stable order, plus their parameters as arrays."""

    def __init__(self, arch: str, dtype: str):
        if dtype == "fp8" and arch_has_fp8(arch) is False:
            # generate_configs lists the fp8 configs by shared memory alone; none of them runs here.
            raise ValueError(f"dtype fp8 has no candidates on {arch}: no fp8 tensor cores")
        self.arch, self.dtype = arch, dtype
        self.configs = G.generate_configs(arch, dtype)
        self.ids = [c.id for c in self.configs]
        self.index = {cid: i for i, cid in enumerate(self.ids)}
        self.params = {p: np.array([G.config_params(c)[p] for c in self.configs], dtype=np.float64)
                       for p in PARAMS}
        self.variant_code = np.array([VARIANT_CODES[c.variant] for c in self.configs], dtype=np.float64)
        self.variants = [c.variant for c in self.configs]
        self.space_hash = G.space_hash(self.configs)
        v = self.variant_code.astype(int)
        self._vendor = v == VARIANT_CODES["vendor"]
        self._persistent = v == VARIANT_CODES["persistent"]
        self._splitk = v == VARIANT_CODES["splitk"]
        self._swapab_tma = v == VARIANT_CODES["swapab_tma"]
        self._swapab = (v == VARIANT_CODES["swapab"]) | self._swapab_tma
        self._bk = np.maximum(self.params["block_k"], 1)
        self._sk = self.params["split_k"]

    def __len__(self) -> int:
        return len(self.ids)

    def feasible_mask(self, m: int, n: int, k: int) -> np.ndarray:
        """Boolean mask of the configs that can run (m, n, k); same rules as check_feasible."""
        ok = np.ones(len(self.ids), dtype=bool)
        e = G.DTYPE_BYTES[self.dtype]
        if self.dtype == "fp32":
            ok &= ~self._vendor
        elif self.dtype == "fp8" and (k % 16 or n % 16):
            ok &= ~self._vendor
        if (k * e) % 16 or (n * G.DTYPE_BYTES[G.OUT_DTYPE[self.dtype]]) % 16:
            ok &= ~self._persistent
        if (k * e) % 16:
            ok &= ~self._swapab_tma
        # Swap-AB runs only decode shapes, with the one token count that covers M.
        ok &= ~self._swapab | (self.params["block_m"] == G.swapab_tokens(m))
        k_tiles = np.ceil(k / self._bk)
        split = self._splitk | (self._swapab & (self._sk > 1))
        bad_split = split & ((k_tiles < self._sk) | (self._sk * m * n * 4 > G.SPLITK_WORKSPACE_LIMIT))
        return ok & ~bad_split

    def candidate_dicts(self, idx) -> list[dict]:
        """{'variant', PARAMS...} of the given indices (the heuristic's input)."""
        return [{"variant": self.variants[i], **{p: int(self.params[p][i]) for p in PARAMS}} for i in idx]


@lru_cache(maxsize=None)
def table(arch: str, dtype: str) -> CandidateTable:
    """The (cached) table of an (arch, dtype)."""
    return CandidateTable(arch, dtype)
