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
import math

import numpy as np
# numpy imports numpy.random lazily: ~10 ms at the first skewed routing's counts (a decision of a
# server), here at import (a server's start-up: Dispatcher.warm_up loads the op's features).
import numpy.random  # noqa: F401

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


def _reference_counts(routing: str, m: int, e: int, top_k: int, seed: int, tokens: int) -> np.ndarray:
    """Expert counts of the first ``tokens`` tokens of topk_ids(routing, m, e, top_k, seed) (the same
    random stream), drawn in chunks of rows so that memory stays O(E): the definition of the counts
    (the datasets' features were computed with it); _sampled_counts computes the same numbers faster
    and falls back to this where it cannot."""
    logp = np.log(popularity(routing, e, seed))
    rng = _rng(routing, m, e, top_k, seed)
    counts = np.zeros(e, dtype=np.int64)
    rows = max(1, _CHUNK_DRAWS // e)
    for start in range(0, tokens, rows):
        keys = logp[None, :] + rng.gumbel(size=(min(rows, tokens - start), e))
        idx = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        counts += np.bincount(idx.ravel(), minlength=e)
    return counts


# The fast path of the counts (_sampled_counts): the reference's numbers exactly, from the same
# uniforms. numpy's gumbel is 0 - 1 * log(-log(1 - u)) of u = the stream's next double (what
# rng.random returns), redrawn where u == 0, through libm's scalar log: ~11 ns a draw, ~20-40 with
# the argpartition of every key, so 10-80 ms of a cold MoE or grouped-GEMM decision at a new M. Each
# M has a stream of its own (_rng is seeded by M), so no M's draws are a prefix of another's and a
# new M draws all M x E of them; nothing can be cached across M. Here the uniforms come from
# rng.random (1.6 ns a draw) and a token's top_k experts (its top_k largest keys log p_j - log E_j,
# E_j = -log(1 - u_j)) are looked for among its candidates only: the draws u_j < theta_j =
# 1 - exp(-tau p_j), those whose key exceeds L = -log(tau), tau set for about top_k + 2 sqrt(top_k)
# + 1 candidates a token; one sort of a chunk's candidates by (token, key) ranks them. A token's set
# is taken where its k-th key clears both the next one and L by _MARGIN, far above the error of
# numpy's vectorised logs (~1e-13 on these keys; they may differ from libm's in the last bit, and do
# with AVX-512), so that the reference's keys order the same way. Otherwise the token's whole row
# is ranked so (~1% of the tokens: too few candidates), and where even that gap is under _MARGIN (a
# near-tie or a tie, ~1e-8 of the tokens) its keys are computed exactly as the gumbel does (math.log
# is libm's log) and argpartitioned as the reference does. A zero draw (2**-53 a draw) hands the
# whole call to the reference, whose gumbel redraws it.
_MARGIN = 1e-9
# Uniforms and candidates per chunk: the chunk's arrays stay small (numpy's temporaries above ~128 KB
# are fresh pages from the OS each time, slow in a VM).
_CHUNK_DRAWS_FAST = 2**17
_CHUNK_CANDIDATES = 2**14
# Up to this many draws, or with most draws candidates (E <= ~2 top_k + 4 sqrt(top_k) + 2), the
# reference is as fast.
_SMALL_DRAWS = 1024


@functools.lru_cache(maxsize=1024)
def _race(routing: str, e: int, top_k: int, seed: int):
    """(logp, theta, L, per_token) of a skewed routing: logp exactly the reference's; theta (E,) the
    candidate bounds on the uniforms (None: every draw is a candidate, when the candidates would be
    most of a row anyway); L the key every non-candidate stays below; per_token the candidates a
    token has on average. Read-only arrays."""
    p = popularity(routing, e, seed)
    logp = np.log(p)
    logp.flags.writeable = False
    target = top_k + 2.0 * math.sqrt(top_k) + 1.0
    if target >= 0.5 * e:
        return logp, None, -math.inf, float(e)
    lo, hi = -60.0, 60.0  # bisection on log tau: sum_j theta_j(tau) rises from 0 to E
    for _ in range(40):  # any tau is exact; tau only sets the work
        mid = 0.5 * (lo + hi)
        if float(-np.expm1(-math.exp(mid) * p).sum()) < target:
            lo = mid
        else:
            hi = mid
    tau = math.exp(hi)
    theta = -np.expm1(-tau * p)
    # Near 1 the bound's rounding would move the key bound: every draw of those experts is a candidate.
    theta[theta > 1.0 - 1e-6] = 2.0
    theta = np.maximum(theta, 5e-324)  # a zero draw is always a candidate (and so seen)
    theta.flags.writeable = False
    return logp, theta, -math.log(tau), float(np.minimum(theta, 1.0).sum())


def _exact_row_topk(u_row, logp, top_k: int) -> np.ndarray:
    """The reference's top_k experts of one token from its uniforms: its keys recomputed as numpy's
    gumbel does (0 - 1 * log(-log(1 - u)), libm's log) and argpartitioned the same way."""
    g = np.array([0.0 - 1.0 * math.log(-math.log(1.0 - x)) for x in u_row.tolist()])
    keys = logp[None, :] + g[None, :]
    return np.argpartition(-keys, top_k - 1, axis=1)[0, :top_k]


def _chunk_counts(u, logp, theta, bound: float, top_k: int, redo: list):
    """Expert counts of the tokens (rows of uniforms) ``u`` whose top_k the vectorised keys settle,
    their candidates the draws under theta (all where None); the other tokens' rows go to ``redo``
    (copies) where theta is given, else are settled exactly here. None where a draw is 0."""
    r, e = u.shape
    flat_u = u.reshape(-1)
    if theta is None:
        flat = None
        uc = flat_u
    else:
        flat = np.flatnonzero(u < theta)
        uc = flat_u[flat]
    n = uc.size
    if n and uc.min() == 0.0:
        return None
    counts = np.zeros(e, dtype=np.int64)
    if not n:
        redo.append(u.copy())
        return counts
    if flat is None:
        flat = np.arange(n)
    rows = flat // e
    cols = flat - rows * e
    per_row = np.bincount(rows, minlength=r)
    # The keys by numpy's vectorised logs: within ~1e-13 of the reference's (libm's, per draw).
    keys = np.subtract(1.0, uc)
    np.log(keys, out=keys)
    np.negative(keys, out=keys)
    np.log(keys, out=keys)
    np.subtract(logp[cols], keys, out=keys)
    # One sort of every candidate by (token, key descending): an int64 of the token, the key
    # quantised to key_bits (keys of one quantum are within 1 / scale; at most 52 bits, so that the
    # float product below resolves its quanta) and the candidate's index.
    idx_bits = (n - 1).bit_length() or 1
    key_bits = min(52, 63 - idx_bits - ((r - 1).bit_length() or 1))
    base = float(keys.min())
    span = max(float(keys.max()) - base, 1.0)
    top_q = (1 << key_bits) - 1
    scale = top_q / span * (1.0 - 2.0**-40)  # the largest key's quantum stays <= top_q
    q = keys - base
    q *= scale
    packed = q.astype(np.int64)
    np.subtract(top_q, packed, out=packed)
    packed <<= idx_bits
    packed |= np.arange(n)
    packed |= rows << (key_bits + idx_bits)
    packed.sort()
    packed &= (1 << idx_bits) - 1
    starts = np.cumsum(per_row) - per_row
    top = packed[np.minimum(starts[:, None] + np.arange(top_k + 1), n - 1)]  # (r, top_k + 1), valid to per_row
    top_keys = keys[top]
    # Every candidate after the k-th has a key below the k-th's + 1 / scale; non-candidates below L.
    nxt = np.where(per_row > top_k, top_keys[:, top_k] + 2.0 / scale, -math.inf)
    ok = top_keys[:, :top_k].min(axis=1) - np.maximum(nxt, bound) > _MARGIN
    ok &= per_row >= top_k
    counts += np.bincount(cols[top[ok, :top_k]].ravel(), minlength=e)
    bad = np.flatnonzero(~ok)
    if bad.size:
        if theta is not None:  # too few candidates or too close: the whole rows, later
            redo.append(u[bad])
        else:  # a near-tie on the vectorised keys: the reference's own keys
            for i in bad:
                counts += np.bincount(_exact_row_topk(u[i], logp, top_k), minlength=e)
    return counts


def _sampled_counts(routing: str, m: int, e: int, top_k: int, seed: int, tokens: int) -> np.ndarray:
    """_reference_counts(routing, m, e, top_k, seed, tokens): the same numbers, 2-8x faster from a
    few thousand draws at E >~ 2 top_k (see _MARGIN), in O(E) memory."""
    if top_k == e:  # every token takes every expert
        return np.full(e, tokens, dtype=np.int64)
    logp, theta, bound, per_token = _race(routing, e, top_k, seed)
    if theta is None or tokens * e <= _SMALL_DRAWS:  # no faster here
        return _reference_counts(routing, m, e, top_k, seed, tokens)
    rng = _rng(routing, m, e, top_k, seed)
    counts = np.zeros(e, dtype=np.int64)
    rows = max(1, min(_CHUNK_DRAWS_FAST // e, int(_CHUNK_CANDIDATES / per_token)))
    buf = np.empty(min(rows, tokens) * e)
    redo: list = []
    for start in range(0, tokens, rows):
        n = min(rows, tokens - start)
        c = _chunk_counts(rng.random(out=buf[:n * e]).reshape(n, e), logp, theta, bound, top_k, redo)
        if c is None:
            return _reference_counts(routing, m, e, top_k, seed, tokens)
        counts += c
    if redo:  # the tokens their candidates left open, every draw a candidate (no zero among them)
        u = np.concatenate(redo)
        rows = max(1, _CHUNK_CANDIDATES // e)
        for start in range(0, len(u), rows):
            counts += _chunk_counts(u[start:start + rows], logp, None, -math.inf, top_k, [])
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
