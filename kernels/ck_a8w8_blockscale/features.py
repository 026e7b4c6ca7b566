"""Features of a (M, N, K, cu_num) problem for the kernel classifier (numpy only: the serving path
imports it). The same function builds the training matrix and the runtime's row, so the two cannot
drift; ``FEATURE_NAMES`` enters the model's schema hash.

Beyond log sizes: for each tile the CK instances use (M x N per block), the workgroup count over the
CUs (waves) and the share of the last wave that is busy, and the share of the padded tile that is
real work -- the quantities the seed's (M x N, K) arms approximate with thresholds.
"""
from __future__ import annotations

import hashlib

import numpy as np

TILES = ((16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128), (128, 128), (192, 256))
FEATURE_NAMES = (("log2_m", "log2_n", "log2_k", "log2_mn", "log2_mnk", "k_is_128", "k_mod_256", "k_over_384",
                  "cu_num")
                 + tuple(f"waves_{a}x{b}" for a, b in TILES)
                 + tuple(f"last_wave_{a}x{b}" for a, b in TILES)
                 + tuple(f"pad_{a}x{b}" for a, b in TILES))


def schema_hash() -> str:
    return hashlib.sha256(",".join(FEATURE_NAMES).encode()).hexdigest()[:16]


def features(m, n, k, cu_num) -> np.ndarray:
    """(rows, len(FEATURE_NAMES)) float32 from equal-length arrays (or scalars)."""
    m, n, k, cu = (np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in (m, n, k, cu_num))
    m, n, k, cu = np.broadcast_arrays(m, n, k, cu)
    cols = [np.log2(m), np.log2(n), np.log2(k), np.log2(m * n), np.log2(m * n * k), (k == 128).astype(float),
            np.mod(k, 256), (k >= 384).astype(float), cu]
    waves, last, pad = [], [], []
    for a, b in TILES:
        wg = np.ceil(m / a) * np.ceil(n / b)
        w = wg / cu
        waves.append(np.log2(w))
        frac = np.mod(wg, cu) / cu
        last.append(np.where(frac == 0, 1.0, frac))
        pad.append((m * n) / (np.ceil(m / a) * a * np.ceil(n / b) * b))
    return np.column_stack(cols + waves + last + pad).astype(np.float32)
