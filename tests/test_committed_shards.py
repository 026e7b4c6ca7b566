"""The committed harness shards resume cleanly: a rerun of any shard with its seed measures
nothing new for the shapes it holds (issue 3's resume check, on the real data)."""
import glob
import gzip
import json
import re
from collections import defaultdict

import pytest

from gemm_costmodel.benchmarks import harness as H
from gemm_costmodel.kernels.gemm_configs import VARIANTS, Problem, config_from_id
from gemm_costmodel.data.shapes import Shape

SHARDS = sorted(glob.glob("datasets/raw/*-shard*.jsonl.gz"))
NAME = re.compile(r"(?P<sweep>.+)-shard(?P<i>\d+)of(?P<n>\d+)\.jsonl\.gz$")


# Variants added to the space after the first shards were measured: an older shard of
# an affected shape misses them, and a rerun would measure exactly those.
LATER_VARIANTS = tuple(sorted(set(VARIANTS) - set(H.SAMPLE_BASE_VARIANTS) - {"vendor"}))


def _mode(name: str) -> str:
    # Evaluation and foundation sweeps measure every candidate; training sweeps sample 48;
    # the swap-AB sweep added one variant to training shapes measured before it existed.
    if name.startswith("swapab-train-"):
        return "variant:" + ",".join(LATER_VARIANTS)
    return "sample:48" if name.startswith("train-") else "all"


def _stored(path):
    shapes, seeds = defaultdict(set), set()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            shapes[(r["dtype"], int(r["m"]), int(r["n"]), int(r["k"]))].add(r["candidate"])
            seeds.add(int(r.get("seed", 0)))
    return shapes, seeds


def test_there_are_committed_shards():
    assert len(SHARDS) >= 20


@pytest.mark.parametrize("path", SHARDS, ids=lambda p: p.split("/")[-1])
def test_rerun_of_committed_shard_measures_nothing_new(path):
    name = path.split("/")[-1]
    m = NAME.match(name)
    shard = (int(m["i"]), int(m["n"]))
    shapes, seeds = _stored(path)
    assert len(seeds) == 1, f"{name}: one seed per shard, found {seeds}"
    seed = seeds.pop()
    partial = []
    for (dtype, mm, n, k), have in shapes.items():
        if shard[1] > 1:  # the foundation runs are a fixed suite, not a hash shard
            assert H.in_shard(Shape(mm, n, k, dtype), shard), f"{name}: {dtype}:{mm}x{n}x{k} is not in {shard}"
        want = {c.id for c in H.select_candidates(Problem(mm, n, k, dtype), _mode(name), seed)}
        assert have <= want, f"{name}: {dtype}:{mm}x{n}x{k} holds candidates a rerun would not select"
        missing = {c for c in want - have if config_from_id(c).variant not in LATER_VARIANTS}
        if missing:
            partial.append((dtype, mm, n, k))
    # Only the shape in flight when a sweep was stopped may be incomplete; a rerun
    # measures its missing candidates and nothing else.
    assert len(partial) <= 1, f"{name}: {len(partial)} partial shapes"
