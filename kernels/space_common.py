"""What every op's config space shares (torch-free): problem-dimension checks, applying
an op's per-problem rule list to a whole space or to one config, and the space hash.

An op's space module keeps its own problem type, configs, static limits and
``PROBLEM_RULES`` (triples of applies(problem) -> bool, violated(arrays, problem) ->
bool array, reason(problem, params of one config) -> str); these functions are the
one way those rules are applied, so the runtime's mask and ``check_feasible`` agree
for every op.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import ClassVar

# Element sizes in bytes of the input dtypes the family supports. fp32 is only
# used by CPU interpreter tests.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
# Output dtype per input dtype: fp8 (e4m3, per-tensor scales) writes bf16.
OUT_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "bf16", "fp32": "fp32"}


@dataclass(frozen=True)
class ArchSpec:
    """The numbers of a GPU architecture that the config space depends on."""

    name: str
    smem_per_block: int  # largest dynamic shared memory one program may use, bytes
    max_acc_per_thread: int  # fp32 accumulator registers per thread before spilling
    has_tma: bool


ARCHS = {
    # Hopper: 227 KiB opt-in shared memory per block, TMA and wgmma.
    "sm90": ArchSpec("sm90", 232448, 128, True),
    # Ampere/Ada: no TMA; 163 KiB (A100) is the common upper bound.
    "sm80": ArchSpec("sm80", 166912, 128, False),
}


@dataclass(frozen=True)
class VendorConfig:
    """The vendor library: torch.mm (cuBLAS) or torch._scaled_mm for fp8."""

    library: str = "cublas"
    variant: ClassVar[str] = "vendor"

    @property
    def id(self) -> str:
        return self.library


# The variant codes of every op's configs (a feature; one table, so a code means one variant), and
# the uniform numeric view of any config, used by features and data files.
VARIANT_CODES = {"tiled": 0, "splitk": 1, "persistent": 2, "vendor": 3, "swapab": 4, "swapab_tma": 5, "gemv": 6,
                 "persistent_tma": 7}
PARAM_NAMES = ("block_m", "block_n", "block_k", "group_m", "split_k", "num_warps", "num_stages")


def check_dims(problem, dtypes) -> None:
    """ValueError naming the field: m, n and k ints >= 1, dtype one of ``dtypes``."""
    for name in ("m", "n", "k"):
        v = getattr(problem, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {type(v).__name__}")
        if v <= 0:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if problem.dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {problem.dtype!r}")


def rules_mask(rules, arrays, problem):
    """Boolean array: which configs of ``arrays`` satisfy every rule for ``problem``."""
    import numpy as np

    # The violations are OR-ed and inverted once: one numpy call per applying rule, not two. A rule
    # may return an array of ``arrays`` itself (a.vendor): it is never written to.
    bad = None
    for applies, violated, _ in rules:
        if applies(problem):
            v = violated(arrays, problem)
            bad = v if bad is None else bad | v
    return np.ones(arrays.n, dtype=bool) if bad is None else ~bad


def first_violation(rules, arrays_of_one, problem, params: dict) -> str:
    """The reason of the first rule the single config of ``arrays_of_one`` violates, or ''."""
    for applies, violated, reason in rules:
        if applies(problem) and violated(arrays_of_one, problem)[0]:
            return reason(problem, params)
    return ""


def space_hash(configs) -> str:
    """Stable hash of a candidate list, for manifests."""
    return hashlib.sha256("\n".join(c.id for c in configs).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DenseProblem:
    """A GEMM-shaped problem: M x N outputs reduced over K, one input dtype. An op's
    ``Problem`` subclasses it and names its dtypes (DTYPES); ``key`` is its stable string."""

    m: int
    n: int
    k: int
    dtype: str
    DTYPES: ClassVar[tuple] = ()

    def __post_init__(self):
        check_dims(self, self.DTYPES)

    @property
    def key(self) -> str:
        return f"{self.dtype}:{self.m}x{self.n}x{self.k}"


def parse_config_id(cid, id_patterns: dict, variants: dict):
    """Inverse of a config's ``id`` for an op's regex per variant (numeric fields in
    constructor order); non-canonical spellings (zero padding) are rejected. ValueError
    for an unknown id."""
    for variant, rx in id_patterns.items():
        m = rx.fullmatch(cid) if isinstance(cid, str) else None
        if m:
            cfg = variants[variant](*map(int, m.groups()))
            if cfg.id == cid:
                return cfg
    raise ValueError(f"unknown config id {cid!r}")


def param_arrays(configs, config_params, names) -> dict:
    """{parameter name: int64 array over configs}: the rules' view of a space."""
    import numpy as np

    rows = [config_params(c) for c in configs]
    return {p: np.array([r[p] for r in rows], dtype=np.int64) for p in names}


def feasibility(ns: dict):
    """(problem_mask, check_feasible, feasible_configs) of an op's space module, from its globals
    (``ARCHS``, ``PROBLEM_RULES``, ``ConfigArrays``, ``config_params``, ``static_feasible``,
    ``generate_configs``), looked up on each call so that a module's later names are seen."""

    def problem_mask(arrays, problem) -> "np.ndarray":  # noqa: F821 - numpy is the caller's
        """Boolean array: which configs of ``arrays`` satisfy every per-problem rule. ``problem``:
        anything with the op's problem fields (a Problem, or the runtime's checked dimensions)."""
        return rules_mask(ns["PROBLEM_RULES"], arrays, problem)

    def check_feasible(cfg, problem, arch: str = "sm90") -> tuple[bool, str]:
        """Whether cfg can run problem correctly on arch; returns (ok, reason). The one-config
        case of ``problem_mask`` (after the static rules)."""
        ok, why = ns["static_feasible"](cfg, ns["ARCHS"][arch], problem.dtype)
        if not ok:
            return ok, why
        why = first_violation(ns["PROBLEM_RULES"], ns["ConfigArrays"]([cfg]), problem, ns["config_params"](cfg))
        return (not why), why

    def feasible_configs(problem, arch: str = "sm90", include_vendor: bool = True) -> list:
        """Candidates that can run ``problem`` on ``arch``."""
        return [c for c in ns["generate_configs"](arch, problem.dtype, include_vendor)
                if ns["check_feasible"](c, problem, arch)[0]]

    for fn in (problem_mask, check_feasible, feasible_configs):
        fn.__module__ = ns["__name__"]
    return problem_mask, check_feasible, feasible_configs


def uniform_params(cfg, names) -> dict:
    """A config's numeric parameters under the uniform names ``names`` (PARAM_NAMES): its own
    fields where it has them, 0 (n/a) elsewhere, split_k 1 without a split; all 0 for the vendor.
    An op's ``config_params`` adjusts its variants' views on top."""
    if isinstance(cfg, VendorConfig):
        return {p: 0 for p in names}
    own = {f.name for f in fields(cfg)}
    out = {p: getattr(cfg, p) if p in own else 0 for p in names}
    out["split_k"] = getattr(cfg, "split_k", 1)
    return out


def nearest_log2(cands, want: dict, names=PARAM_NAMES) -> int:
    """The index the vLLM-default rules' ``choose`` picks (the MoE, vLLM MoE and vLLM w8a8 ops):
    ``min(range(n), key=lambda i: (dist(i), i))`` with dist the sum over ``names`` of
    ``abs(log2(max(c[p], 1)) - log2(max(want[p], 1)))`` for a tiled candidate, 1e9 for any other,
    over arrays instead of one dict per candidate: the runtime's fallback took 1-6 ms of Python
    for the ~1,250 candidates of the vLLM spaces (issue 58), this is a few numpy calls.

    ``cands``: ``.tiled`` (bool array) and ``.log2`` ({name: float64 array of
    ``math.log2(max(v, 1))``}, computed with ``math.log2`` so that every term is the rule's own
    float). The terms are added in ``names`` order, as ``sum`` adds them, and ``argmin`` keeps the
    first of equal distances, as the key's ``i`` does: the same index, bit for bit."""
    import math

    import numpy as np

    dist = None
    for p in names:
        term = np.abs(cands.log2[p] - math.log2(max(want[p], 1)))
        dist = term if dist is None else dist + term
    dist = np.where(cands.tiled, dist, 1e9)
    return int(np.argmin(dist))
