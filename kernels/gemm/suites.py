"""The dense GEMM op's shape suites (registry ``suites``), from the training families' layers
(kernels/shapes.py)."""
from __future__ import annotations

from typing import Iterable

from ..shapes import M_GRID, TP_DEGREES, Shape, nk_pairs


def training_suite(dtype: str = "bf16", ms: Iterable[int] = M_GRID, tps: Iterable[int] = TP_DEGREES) -> list[Shape]:
    """All (M, N, K) of the training families over the M grid."""
    pairs = nk_pairs(tps)
    return [Shape(m, n, k, dtype, tuple(orig)) for (n, k), orig in sorted(pairs.items()) for m in ms]


def foundation_suite(dtype: str = "bf16") -> list[Shape]:
    """The foundation benchmark's shapes: decode (M <= 64) and prefill (M >= 1024).

    12 (N, K) pairs by a fixed stride through the pairs sorted by weight size
    (spread over families and TP), with two decode and two prefill M each,
    plus the 4 pairs whose bf16 weight is >= 256 MB (spread by size) at
    M in {1, 16, 32, 64} for the HBM-floor check, and M=1024 for two of them.
    """
    pairs = sorted(nk_pairs().items(), key=lambda kv: kv[0][0] * kv[0][1])
    step = max(1, len(pairs) // 12)
    shapes = []
    for i, ((n, k), orig) in enumerate(pairs[::step][:12]):
        ms = (1, 16, 1024, 4096) if i % 2 == 0 else (7, 64, 2048, 8192)
        shapes += [Shape(m, n, k, dtype, tuple(orig)) for m in ms]
    big = [kv for kv in pairs if kv[0][0] * kv[0][1] * 2 >= 256 * 2**20]
    for i, ((n, k), orig) in enumerate(big[:: max(1, len(big) // 4)][:4]):
        ms = (1, 16, 32, 64) + ((1024,) if i % 2 == 0 else ())
        shapes += [Shape(m, n, k, dtype, tuple(orig)) for m in ms]
    return list(dict.fromkeys(shapes))
