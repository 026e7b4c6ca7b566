"""A hand heuristic in the spirit of the seeds' total-tiles-vs-SMs rule.

It is both an evaluation baseline and the runtime's documented default when no
usable model is loaded, so it is pure Python and never returns an infeasible
candidate: it names an ideal config, then snaps to the nearest feasible one.

Rules (sm90 space):
- decode (M <= 64): split-K with the smallest block_m that holds M, 64-wide N
  tiles, block_k 128, and the split that brings the program count closest to
  the SM count (seed 002's "split-K for skinny shapes");
- otherwise count 128x128 tiles: if they fill the SMs (seed 001's rule), big
  tiles (persistent 128x256 when even those fill the SMs, else tiled 128x128);
  if not, smaller tiles to raise the tile count (64x128, then 64x64).
"""
from __future__ import annotations

import math

# Param order: variant, block_m, block_n, block_k, group_m, split_k, num_warps, num_stages.
_VARIANT_PENALTY = 100.0


def _tiles(m: int, n: int, bm: int, bn: int) -> int:
    return math.ceil(m / bm) * math.ceil(n / bn)


def ideal(m: int, n: int, k: int, sm_count: int) -> dict:
    """The config the rules ask for, before snapping to the feasible set."""
    if m <= 64:
        bm = 16 if m <= 16 else 32 if m <= 32 else 64
        bn, bk = 64, 128
        tiles = _tiles(m, n, bm, bn)
        k_tiles = math.ceil(k / bk)
        best_s, best_gap = 1, abs(tiles - sm_count)
        for s in (2, 4, 8, 16):
            if s > k_tiles:
                break
            gap = abs(tiles * s - sm_count)
            if gap < best_gap:
                best_s, best_gap = s, gap
        variant = "splitk" if best_s > 1 else "tiled"
        return dict(variant=variant, block_m=bm, block_n=bn, block_k=bk, group_m=8 if best_s == 1 else 1,
                    split_k=best_s, num_warps=4, num_stages=4)
    if _tiles(m, n, 128, 128) >= sm_count:
        if _tiles(m, n, 128, 256) >= sm_count:
            return dict(variant="persistent", block_m=128, block_n=256, block_k=64, group_m=8, split_k=1,
                        num_warps=8, num_stages=3)
        return dict(variant="tiled", block_m=128, block_n=128, block_k=64, group_m=8, split_k=1,
                    num_warps=8, num_stages=3)
    if _tiles(m, n, 64, 128) >= sm_count:
        return dict(variant="tiled", block_m=64, block_n=128, block_k=64, group_m=8, split_k=1,
                    num_warps=4, num_stages=4)
    return dict(variant="tiled", block_m=64, block_n=64, block_k=64, group_m=8, split_k=1,
                num_warps=4, num_stages=4)


def _distance(want: dict, cand: dict) -> float:
    d = 0.0 if cand["variant"] == want["variant"] else _VARIANT_PENALTY
    if cand["variant"] == "vendor":
        return d + 50.0
    for p in ("block_m", "block_n", "block_k", "split_k"):
        d += abs(math.log2(max(cand[p], 1)) - math.log2(max(want[p], 1)))
    d += 0.1 * (cand["num_warps"] != want["num_warps"]) + 0.1 * (cand["num_stages"] != want["num_stages"])
    return d


def choose(m: int, n: int, k: int, sm_count: int, candidates: list[dict]) -> int:
    """Index into ``candidates`` (dicts with 'variant' and the PARAM names) of the heuristic's pick."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    want = ideal(m, n, k, sm_count)
    return min(range(len(candidates)), key=lambda i: (_distance(want, candidates[i]), i))
