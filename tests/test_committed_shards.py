"""The committed harness shards resume cleanly: a rerun of any shard with its seed measures
nothing new for the shapes it holds (issue 3's resume check, on the real data)."""
import functools
import glob
import gzip
import json
import re
from collections import defaultdict

import pytest

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import harness as H
from gemm_costmodel.kernels.gemm.space import VARIANTS
from gemm_costmodel.kernels.shapes import Shape

# Every test here re-reads committed shards: run after the main suite (.ci/run, issue 56).
pytestmark = pytest.mark.data

SHARDS = sorted(glob.glob("datasets/raw/*-shard*.jsonl.gz"))
NAME = re.compile(r"(?P<sweep>.+)-shard(?P<i>\d+)of(?P<n>\d+)\.jsonl\.gz$")


# Variants added to the space after the first shards were measured: an older shard of
# an affected shape misses them, and a rerun would measure exactly those.
LATER_VARIANTS = {"gemm": tuple(sorted(set(VARIANTS) - set(H.SAMPLE_BASE_VARIANTS) - {"vendor"})),
                  "moe": ("swapab", "gemv"), "fp8_blockscale": ("gemv",)}


def _mode(name: str) -> str:
    # Evaluation and foundation sweeps measure every candidate; training sweeps sample 48
    # (the block-scale op's, 40); the swap-AB and GEMV sweeps added their variants to training
    # shapes measured before they existed.
    if name.startswith("swapab-train-"):
        return "variant:swapab,swapab_tma"
    # The GEMV sweeps (retired driver device_gemv.sh in git history): its configs, plus TMA swap-AB on more M = 1
    # shapes. Those shapes' GEMV rows were measured again (gemv3-train-m1, the GEMV compiled per
    # weight shape) and moved out of gemv2-train-m1, which keeps its TMA swap-AB and cuBLAS rows.
    if name.startswith("gemv2-train-m1-"):
        return "variant:swapab_tma"
    if name.startswith(("gemv2-train-", "gemv3-train-")):
        return "variant:gemv"
    # MoE swap-AB rows (retired driver device_moe_swapab.sh in git history) on training shapes measured before it.
    if name.startswith("moe-trainswapab-"):
        return "variant:swapab"
    # MoE GEMV rows (retired driver device_moe_gemv.sh in git history): its configs on the training and gate shapes.
    if name.startswith(("moe-traingemv-", "gate-moegemv-", "gate-moecold-")):
        return "variant:gemv"
    # The MoE M <= 4 training problems measured again with expert-rotating copies
    # (retired driver device_moe_cold.sh in git history): three sweeps into one shard; its GEMV rows moved out when the
    # GEMV began compiling per weight shape (superseded-*-gemvrows), the GEMV being a later variant.
    if name.startswith("moe-traincold-"):
        return "variant:gemv+variant:swapab+sample:24"
    # Those problems' GEMV and vendor rows again, the GEMV compiled per weight shape
    # (retired driver device_moe_spec.sh in git history); the fp8 down problems' GEMV rows once more, quantising by
    # the reciprocal (retired driver device_moe_recip.sh in git history; fp8 has no vendor).
    if name.startswith(("moe-trainspec-", "moe-trainrecip-")):
        return "variant:gemv"
    # Model-guided training rows (retired driver device_moe_active.sh in git history): the configs its CSV lists.
    if name.startswith("moe-trainactive-"):
        return "pick:benchmarks/results/moe/active/picks.csv"
    if name.startswith("moe-trainactive2-"):
        return "pick:benchmarks/results/moe/active/picks2.csv"
    # Round 3 and the block-scale op's picks (retired driver device_picks.sh in git history).
    if name.startswith("moe-trainactive3"):
        return "pick:benchmarks/results/moe/active/picks3.csv"
    # The MoE op's first H200 rows (benchmarks/campaigns/moe-h200.txt): one adaptation round on the
    # shipped model's picks, and its random-sampling control (8 sampled configs per problem).
    # `costmodel adapt` rounds on the H200 (benchmarks/results/moe/h200/adapt-fp8/): each round's
    # shard holds the configs its picks CSV lists, per dtype and training suite.
    got = re.match(r"moe-adapt(\d+)-(train|trainskewed)-(bf16|fp8bs|fp8)-nvidia-h200-", name)
    if got:
        suite = {"train": "train", "trainskewed": "train_skewed"}[got[2]]
        return f"pick:benchmarks/results/moe/h200/adapt-{got[3]}/picks-r{got[1]}-{got[3]}-{suite}.csv"
    # `costmodel adapt --op gemm --dtype fp8` on the H200 (benchmarks/results/gemm/h200/adapt-fp8/):
    # round 0's shard, the shipped model's top 8 per training problem.
    got = re.match(r"gemm-adapt(\d+)-train-(fp8)-nvidia-h200-", name)
    if got:
        return f"pick:benchmarks/results/gemm/h200/adapt-{got[2]}/picks-r{got[1]}-{got[2]}-train.csv"
    if name.startswith(("moe-adapt0-h200-", "moe-adapt0-fp8-h200-")):
        return "pick:benchmarks/results/moe/h200/picks-r0.csv"
    if name.startswith(("moe-train-h200-", "moe-train-fp8-h200-")):
        return "sample:8"
    if name.startswith("fp8bs-trainactive-"):
        return "pick:benchmarks/results/fp8_blockscale/active/picks.csv"
    # The block-scale GEMV's rows on training shapes measured before it (retired driver device_fp8bs_gemv.sh in git history),
    # once more (retired driver device_picks.sh in git history), and on the training weights without M = 1 rows
    # (retired driver device_fp8bs_gemv3.sh in git history).
    if name.startswith(("fp8bs-traingemv-", "fp8bs-traingemv2-", "fp8bs-traingemv3-")):
        return "variant:gemv"
    if name.startswith("fp8bs-train-"):
        return "sample:40"
    # The fp8bs MoE training rows (benchmarks/campaigns/moe-fp8bs-h200.txt) sample 8 configs a problem.
    if name.startswith("moe-train-fp8bs-"):
        return "sample:8"
    # train_skewed (moe-trainskewed-*) samples as the MoE train suite does.
    if name.startswith(("moe-train-", "moe-trainskewed-")):
        return "sample:24"
    # The grouped-GEMM op's first H200 training rows (benchmarks/campaigns/grouped-gemm-h200.txt): 6
    # sampled Triton configs + the vendor per problem.
    if name.startswith("gg-train-h200-"):
        return "sample:6"
    # Its TMA campaign (benchmarks/campaigns/grouped-gemm-tma-h200.txt): the persistent_tma configs
    # (a pending grid, then generation 60-tma) + the vendor; the training dgrad/wgrad problems measured
    # again after decision 068's fix, with the first sweep's sample (the evaluation ones: all).
    if name.startswith("gg-tma-"):
        return "variant:persistent_tma"
    if name.startswith("gg-vl-train-h200-"):
        return "sample:6"
    # Issue 63's decode campaign (benchmarks/campaigns/dense-decode-h200.txt): the mid-M shapes' tiled
    # and persistent configs, the training M <= 4 shapes' GEMV configs (the evaluation shard: all).
    if name.startswith("dense-decode-midm-"):
        return "variant:tiled,persistent"
    if name.startswith("dense-decode-train-"):
        return "variant:gemv"
    # The M = 1 ceiling on the training weights of 60-95 MB (benchmarks/campaigns/session-h200-c.txt).
    if name.startswith("decode64-"):
        return "variant:gemv,swapab_tma"
    # The H200's M <= 4 training rows on the rest of the training weights (benchmarks/campaigns/
    # session-h200-a.txt): the configs benchmarks/explore/dense_decode_picks.py picked per problem.
    if name.startswith("dense-decode-train2-fp8-"):
        return "pick:benchmarks/campaigns/dense-decode-train2-fp8-picks.csv"
    if name.startswith("dense-decode-train2-"):
        return "pick:benchmarks/campaigns/dense-decode-train2-picks.csv"
    # vLLM's own kernels' training rows on the H200 (benchmarks/campaigns/next-h200.txt): the configs
    # benchmarks/explore/vllm_picks.py listed per training problem, one shard of its split each.
    # Shard 0's lists have no suffix, shard i's end in -s<i>.
    got = re.match(r"(vmoe|vbs)-train-h200-shard(\d+)of", name)
    if got:
        base = {"vmoe": "vllm-moe-train-bf16-picks", "vbs": "vllm-w8a8-block-train-picks"}[got[1]]
        return f"pick:benchmarks/campaigns/{base}{f'-s{int(got[2])}' if int(got[2]) else ''}.csv"
    return "sample:48" if name.startswith("train-") else "all"


EXTRA_FIELDS = ("e", "top_k", "stage", "routing")


def _stored(path):
    """({shape: candidates}, seeds, ops, {shape: candidates whose row failed})."""
    shapes, seeds, ops, failed = defaultdict(set), set(), set(), defaultdict(set)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            # A problem's fields: (dtype, M, N, K), plus those of E, top_k, stage and routing its op
            # has (the MoE ops; vLLM's fused MoE has no stage), as (name, value) pairs.
            key = (r["dtype"], int(r["m"]), int(r["n"]), int(r["k"]),
                   *((f, r[f]) for f in EXTRA_FIELDS if r.get(f) not in (None, "")))
            shapes[key].add(r["candidate"])
            if r["status"] != "ok":
                failed[key].add(r["candidate"])
            seeds.add(int(r.get("seed", 0)))
            ops.add(r.get("op", "gemm"))
    return shapes, seeds, ops, failed


def generation(op: str, cid: str) -> str:
    """The generation of a config that a later change added to an existing variant ("" for none):
    an older shard misses it, and a rerun would measure exactly those (kernels/gemm/space.py
    LATER_GRIDS_SM90)."""
    S = registry.get(op).space_module()
    fn = getattr(S, "config_generation", None)
    return fn(S.config_from_id(cid)) if fn else ""


@functools.lru_cache(maxsize=None)
def generated(op: str, dtype: str) -> frozenset:
    """Ids of every candidate the op's current space generates for the dtype (sm90)."""
    return frozenset(c.id for c in registry.get(op).space_module().generate_configs("sm90", dtype))


def test_there_are_committed_shards():
    assert len(SHARDS) >= 20


@pytest.mark.parametrize("path", SHARDS, ids=lambda p: p.split("/")[-1])
def test_rerun_of_committed_shard_measures_nothing_new(path):
    name = path.split("/")[-1]
    m = NAME.match(name)
    shard = (int(m["i"]), int(m["n"]))
    shapes, seeds, ops, failed = _stored(path)
    assert len(seeds) == 1, f"{name}: one seed per shard, found {seeds}"
    assert len(ops) == 1, f"{name}: one op per shard, found {ops}"
    seed, spec = seeds.pop(), registry.get(ops.pop())
    later = LATER_VARIANTS.get(spec.name, ())
    partial = []
    for key, have in shapes.items():
        dtype, mm, n, k = key[:4]
        fields = {f: v for f, v in key[4:] if f in spec.problem_fields}
        prob = spec.problem_of({"m": mm, "n": n, "k": k, "dtype": dtype, **fields})
        if shard[1] > 1:  # the foundation runs are a fixed suite, not a hash shard
            assert H.in_shard(prob if fields else Shape(mm, n, k, dtype), shard), f"{name}: {prob.key} is not in {shard}"
        want = {c.id for mode in _mode(name).split("+") for c in H.select_candidates(prob, mode, seed, op=spec.name)}
        # A row of a candidate the space has since ruled out for this problem, or no longer
        # generates at all (the MoE GEMV's grid of 28 cut to 10), stays as the record of what ran
        # (the block-scale vendor rule came from failed rows, its GEMV K-tile rule from ok ones);
        # training skips it (dataset.out_of_space). A feasible candidate of the space the rerun
        # would not select is a selection bug.
        extra = {c for c in have - want - failed[key]
                 if c in generated(spec.name, dtype) and spec.check_feasible(spec.config_from_id(c), prob)[0]}
        assert not extra, f"{name}: {prob.key} holds candidates a rerun would not select: {extra}"
        missing = {c for c in want - have if spec.config_from_id(c).variant not in later
                   and not generation(spec.name, c)}
        if missing:
            partial.append(key)
    # Only the shape in flight when a sweep was stopped may be incomplete; a rerun
    # measures its missing candidates and nothing else.
    assert len(partial) <= 1, f"{name}: {len(partial)} partial shapes"
