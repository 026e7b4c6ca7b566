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
from dataclasses import dataclass
from typing import ClassVar


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


def vllm_device_name(gpu_name: str) -> str:
    """vLLM's device_name of a GPU: the CUDA device name with spaces replaced by '_'."""
    return gpu_name.replace(" ", "_")
