"""Routings of the MoE op, as data (torch-free: numpy only).

A routing is part of an MoE problem: the same (M, E, top_k) runs at different speeds when
the tokens spread evenly over the experts or crowd onto a few. A routing id names a
seeded, deterministic generator of ``topk_ids`` (M, top_k): every token picks top_k
*distinct* experts.

- ``balanced``: token t takes experts (t * top_k + j) mod E: every expert gets
  floor or ceil of M * top_k / E tokens (the best case a load-balanced router aims for).
- ``zipf``: expert popularity ~ 1 / rank^1.2 (a random expert order per problem):
  a long tail, the usual skew of a trained router on a narrow batch.
- ``hot``: 4 hot experts each 16x as likely as any other (a few hot experts).
- ``real0``, ``real1``, ``real2``: seeded "realistic" histograms: popularity drawn
  from a Dirichlet(0.5) over experts, a different draw per seed.

Sampling top_k distinct experts per token from popularity p uses the Gumbel top-k trick
(argmax of log p + Gumbel noise, k times without replacement), vectorised over tokens.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np

ROUTINGS = ("balanced", "zipf", "hot", "real0", "real1", "real2")
# The routings of the sweeps: balanced and one skewed (issue: both, reported apart).
SKEWED = ("zipf", "hot", "real0", "real1", "real2")
HOT_EXPERTS = 4
HOT_WEIGHT = 16.0
ZIPF_EXPONENT = 1.2
DIRICHLET_ALPHA = 0.5


def check_routing(routing: str) -> None:
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")


def _rng(routing: str, m: int, e: int, top_k: int, seed: int) -> np.random.Generator:
    h = hashlib.sha256(f"{routing}/{m}/{e}/{top_k}/{seed}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def popularity(routing: str, e: int, seed: int = 0) -> np.ndarray:
    """Expert selection weights (sum 1) of a skewed routing; uniform for ``balanced``."""
    check_routing(routing)
    h = hashlib.sha256(f"pop/{routing}/{e}/{seed}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
    if routing == "balanced":
        p = np.ones(e)
    elif routing == "zipf":
        p = 1.0 / np.arange(1, e + 1) ** ZIPF_EXPONENT
        p = p[rng.permutation(e)]
    elif routing == "hot":
        p = np.ones(e)
        p[rng.choice(e, size=min(HOT_EXPERTS, e), replace=False)] = HOT_WEIGHT
    else:  # real<seed>: one Dirichlet draw per seed digit
        draw = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{routing}/{e}".encode()).digest()[:8], "little"))
        p = draw.dirichlet(np.full(e, DIRICHLET_ALPHA))
        p = np.maximum(p, 1e-12)
    return p / p.sum()


def topk_ids(routing: str, m: int, e: int, top_k: int, seed: int = 0) -> np.ndarray:
    """(m, top_k) int32 expert ids, distinct per token, deterministic in all arguments."""
    check_routing(routing)
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in 1..E={e}, got {top_k}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if routing == "balanced":
        t = np.arange(m, dtype=np.int64)[:, None] * top_k + np.arange(top_k)[None, :]
        return (t % e).astype(np.int32)
    logp = np.log(popularity(routing, e, seed))
    g = _rng(routing, m, e, top_k, seed).gumbel(size=(m, e))
    # Gumbel top-k: the top_k largest of log p + G are a sample without replacement from p.
    keys = logp[None, :] + g
    idx = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    order = np.argsort(-np.take_along_axis(keys, idx, axis=1), axis=1)
    return np.take_along_axis(idx, order, axis=1).astype(np.int32)


# expert_counts' budget of Gumbel draws (token rows x E) for a skewed routing, in O(E) memory
# (rows drawn in chunks of at most _CHUNK_DRAWS). Up to EXACT_DRAWS the counts are exactly those
# of topk_ids (every dataset row: its largest skewed M * E is 8192 * 256 = 2**21); above, the first
# SAMPLE_DRAWS // E tokens of the same stream are drawn and their counts scaled to M (issue 57,
# row 2: M = 2**20 at E = 256 took 8.5 GB and 14 s as an (M, E) array).
EXACT_DRAWS = 2**22
SAMPLE_DRAWS = 2**19
_CHUNK_DRAWS = 2**18


def _sampled_counts(routing: str, m: int, e: int, top_k: int, seed: int, tokens: int) -> np.ndarray:
    """Expert counts of the first ``tokens`` tokens of topk_ids(routing, m, e, top_k, seed) (the same
    random stream), drawn in chunks of rows so that memory stays O(E)."""
    logp = np.log(popularity(routing, e, seed))
    rng = _rng(routing, m, e, top_k, seed)
    counts = np.zeros(e, dtype=np.int64)
    rows = max(1, _CHUNK_DRAWS // e)
    for start in range(0, tokens, rows):
        keys = logp[None, :] + rng.gumbel(size=(min(rows, tokens - start), e))
        idx = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        counts += np.bincount(idx.ravel(), minlength=e)
    return counts


@functools.lru_cache(maxsize=4096)
def expert_counts(routing: str, m: int, e: int, top_k: int, seed: int = 0) -> np.ndarray:
    """Tokens per expert (E,) of the routing (read-only array), in O(E) memory whatever M: the
    balanced routing in closed form, a skewed one exactly up to EXACT_DRAWS Gumbel draws and from
    a scaled sample of its first tokens above (see EXACT_DRAWS)."""
    check_routing(routing)
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in 1..E={e}, got {top_k}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    pairs = m * top_k
    if routing == "balanced":
        # Pair p = t * top_k + j goes to expert p mod E (topk_ids): E-periodic over 0..pairs-1.
        q, r = divmod(pairs, e)
        c = np.full(e, q, dtype=np.int64)
        c[:r] += 1
    elif m * e <= EXACT_DRAWS:
        c = _sampled_counts(routing, m, e, top_k, seed, m)
    else:
        tokens = max(1, SAMPLE_DRAWS // e)
        sample = _sampled_counts(routing, m, e, top_k, seed, tokens)
        # Scale to M tokens: floors, then the remaining pairs to the largest remainders (ties to the
        # lower expert index), so the counts sum to M * top_k and none exceeds M (one per token).
        exact = sample * (m / tokens)
        c = np.floor(exact).astype(np.int64)
        short = pairs - int(c.sum())
        if short > 0:
            c[np.argsort(-(exact - c), kind="stable")[:short]] += 1
    c.flags.writeable = False
    return c


def m_tiles(counts, block_m: int) -> int:
    """Row tiles of BLOCK_M the grouped GEMM runs: sum over experts of ceil(count / BLOCK_M)."""
    c = np.asarray(counts, dtype=np.int64)
    return int(((c + block_m - 1) // block_m).sum())


def stats(counts) -> dict:
    """The routing's statistics stored with every row and used as features: tokens per expert
    (mean over all experts, max), active experts, imbalance max/mean (1 = balanced)."""
    c = np.asarray(counts, dtype=np.int64)
    mean = float(c.sum()) / len(c)
    return {"tpe_mean": mean, "tpe_max": int(c.max()), "active_experts": int((c > 0).sum()),
            "imbalance": float(c.max() / mean) if mean > 0 else 1.0}
