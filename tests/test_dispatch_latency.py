"""The cold path's faster forms decide as the forms they replace (issue 58's latency work)."""
import random

import numpy as np
import pytest

from gemm_costmodel import registry
from gemm_costmodel.serving.candidates import table

ARRAY_RULES = [(op, dt) for op in registry.names("ranker") for dt in registry.get(op).dtypes
               if registry.get(op).fallback_rule_arrays() is not None]


def test_the_vllm_default_ops_have_array_rules():
    assert {op for op, _ in ARRAY_RULES} >= {"moe", "vllm_moe", "vllm_w8a8_block"}


@pytest.mark.parametrize("op,dtype", ARRAY_RULES)
def test_array_fallback_rule_picks_as_the_dict_rule(op, dtype):
    spec = registry.get(op)
    ct = table("sm90", dtype, op)
    rule, rule_arrays = spec.fallback_rule(), spec.fallback_rule_arrays()
    names = spec.fallback_fields()
    rng = random.Random(f"{op}:{dtype}")
    subsets = [np.arange(len(ct))]
    # Subsets: the whole table, random ones (the feasible set varies) and one with no tiled
    # candidate (every distance 1e9: the first wins, as the dict rule's (dist, i) key has it).
    subsets += [np.sort(rng.sample(range(len(ct)), rng.randint(1, len(ct)))) for _ in range(20)]
    non_tiled = np.flatnonzero(np.array(ct.variants) != "tiled")
    if len(non_tiled):
        subsets.append(non_tiled)
    for idx in subsets:
        for _ in range(15):
            m = int(round(2 ** rng.uniform(0, 16)))
            e = rng.choice([8, 16, 64, 128, 256, 384])
            fields = {"e": e, "top_k": min(8, e), "dtype": dtype}
            kw = {f: fields[f] for f in names}
            want = rule(m, 4096, 7168, 132, ct.candidate_dicts(idx), **kw)
            got = rule_arrays(m, 4096, 7168, 132, ct.candidate_arrays(idx), **kw)
            assert got == want, (m, e, len(idx))


def test_candidate_arrays_match_candidate_dicts():
    ct = table("sm90", "bf16", "vllm_moe")
    idx = np.arange(0, len(ct), 7)
    arrays = ct.candidate_arrays(idx)
    for j, c in enumerate(ct.candidate_dicts(idx)):
        assert arrays.variant[j] == c["variant"] and bool(arrays.tiled[j]) == (c["variant"] == "tiled")
        for p, a in arrays.params.items():
            assert a[j] == c[p]
