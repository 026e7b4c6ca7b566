"""Contract of the op registry: what every op, for every dtype, must satisfy. A new op's
registry line makes these tests cover it."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemm_costmodel import registry
from gemm_costmodel.serving import features as F
from gemm_costmodel.serving.candidates import table

# The Triton config-space contract: ops whose model ranks a config space ("ranker"); a classifier op
# (named kernels of another vendor, no space here) has its own tests.
CASES = [(name, dtype) for name in registry.names("ranker") for dtype in registry.get(name).dtypes]
ARCHS = ("sm90", "sm80")


def _problem(spec, m, n, k, dtype):
    fields = dict(m=m, n=n, k=k, dtype=dtype)
    if "stage" in spec.problem_fields:  # 4 experts (MoE: top-2; its gate_up, stage 0, needs an even N)
        stages = spec.space_module().STAGES
        fields.update(e=4, top_k=2, stage=stages[n % len(stages)], routing="zipf")
    elif "e" in spec.problem_fields:  # a whole MoE layer (vllm_moe): 4 experts, top-2
        fields.update(e=4, top_k=2, routing="zipf")
    return spec.problem(**{f: v for f, v in fields.items() if f in spec.problem_fields})


@pytest.mark.parametrize("op, dtype", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_config_ids_round_trip_and_are_unique(op, dtype, arch):
    spec = registry.get(op)
    cfgs = spec.configs(arch, dtype)
    ids = [c.id for c in cfgs]
    assert len(ids) == len(set(ids)) and len(ids) > 0
    assert all(spec.config_from_id(cid) == c for cid, c in zip(ids, cfgs))
    assert spec.default_config in ids
    with pytest.raises(ValueError, match="unknown config id"):
        spec.config_from_id("no_such_config")


@pytest.mark.parametrize("op, dtype", CASES)
@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 80000), k=st.integers(1, 40000))
def test_vectorised_mask_is_check_feasible(op, dtype, m, n, k):
    """The runtime's mask and check_feasible are one rule list: they agree config by config."""
    spec = registry.get(op)
    t = table("sm90", dtype, op)
    problem = _problem(spec, m, n, k, dtype)
    mask = t.feasible_mask(m, n, k)
    one_by_one = np.array([spec.check_feasible(c, problem, "sm90")[0] for c in t.configs])
    assert (mask == one_by_one).all(), [c.id for c, a, b in zip(t.configs, mask, one_by_one) if a != b][:5]
    # An infeasible config always says why.
    for c, ok in zip(t.configs, one_by_one):
        if not ok:
            assert spec.check_feasible(c, problem, "sm90")[1]


@pytest.mark.parametrize("op", registry.names())
def test_space_and_registry_import_no_torch(op):
    spec = registry.get(op)
    code = (f"import sys, gemm_costmodel.registry as R; R.get({op!r}).space_module(); "
            "import gemm_costmodel.serving.candidates, gemm_costmodel.serving.features, "
            "gemm_costmodel.serving.runtime; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == [], spec.space


def test_unknown_op_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown op 'no_such_op'; known ops: (.*, )?gemm(, |$)"):
        registry.get("no_such_op")


def test_dense_op_pins_experts():
    spec = registry.get("gemm")
    assert spec.problem(m=1, n=2, k=3, dtype="bf16", e=1, top_k=1).key == "bf16:1x2x3"
    with pytest.raises(ValueError, match="^E=8 is not a gemm problem"):
        spec.problem(m=1, n=2, k=3, dtype="bf16", e=8)
    with pytest.raises(ValueError, match="^top_k=2 is not a gemm problem"):
        spec.problem(m=1, n=2, k=3, dtype="bf16", top_k=2)


def _one_per_variant(configs):
    seen = {}
    for c in configs:
        seen.setdefault(c.variant, c)
    return list(seen.values())


# The Triton CPU interpreter computes garbage for a bf16 dot: interpreter launches use fp16/fp32.
@pytest.mark.parametrize("op", registry.names("ranker"))
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("m, n, k", [(1, 40, 136), (7, 33, 256), (33, 72, 136)])
def test_interpreter_launch_equals_reference(op, dtype, m, n, k):
    spec = registry.get(op)
    impl = spec.impl_module()
    # An op whose kernels come from outside the repository (vLLM's, from a vLLM source) says why not here.
    why = getattr(impl, "unavailable", lambda: "")()
    if why:
        pytest.skip(f"{op}: {why}")
    problem = _problem(spec, m, n, k, dtype)
    gen = torch.Generator().manual_seed(m * 7919 + n)
    ops = impl.make_operands(problem, "cpu", gen)
    ref = impl.reference(ops)
    cands = [c for c in _one_per_variant(spec.feasible_configs(problem, "sm90", include_vendor=False))
             if c.variant not in ("persistent", "swapab_tma")]  # TMA descriptors need a GPU
    assert cands
    for cfg in cands:
        ops.out.fill_(float("nan"))
        y = ops.run(cfg)
        err = (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()
        assert err <= impl.ERROR_BOUNDS[dtype], (cfg.id, err)


# -- the contract every registered op meets, from its registry entry alone (no per-op tables) --------
# (in the spirit of scikit-learn's check_estimator: a new op's registry line runs all of it)

def _suite_problems(spec, dtype, per_suite: int = 3) -> list:
    """A few problems of each of the op's suites (first, middle, last shape), via problem_of."""
    out = []
    for name in sorted(spec.suites):
        shapes = spec.suite(name, dtype)
        assert shapes, f"{spec.name}: suite {name} ({dtype}) is empty"
        picks = [shapes[0], shapes[len(shapes) // 2], shapes[-1]][:per_suite]
        out += [spec.problem_of({f: getattr(s, f) for f in spec.problem_fields}) for s in picks]
    return out


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_contract_suites_load_and_problems_round_trip(op):
    spec = registry.get(op)
    assert spec.suites and spec.dtypes
    for dtype in spec.dtypes:
        for p in _suite_problems(spec, dtype):
            assert p.dtype == dtype
            fields = {f: getattr(p, f) for f in spec.problem_fields}
            assert spec.problem_of(fields) == p
            assert spec.problem(**fields, **spec.fixed) == p  # the pinned fields are accepted as pinned


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_contract_space_is_non_empty_and_holds_the_default_and_the_vendor(op):
    spec = registry.get(op)
    for dtype in spec.dtypes:
        ids = [c.id for c in spec.configs("sm90", dtype)]
        assert ids and spec.default_config in ids, (op, dtype)
    # Every vendor id is a candidate somewhere (else it is dead), and there a vendor config.
    for vid in spec.vendor_ids:
        assert any(vid in {c.id for c in spec.configs(a, d)} for a in ARCHS for d in spec.dtypes), vid
        assert spec.config_from_id(vid).variant == "vendor"


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_contract_features_have_the_declared_names(op):
    spec = registry.get(op)
    names = F.feature_names(op)
    assert len(set(names)) == len(names)
    mod = spec.features_module()
    assert tuple(mod.NAMES if mod is not None else ()) == spec.extra_features
    assert names[len(names) - len(spec.extra_features):] == spec.extra_features
    assert F.schema_hash(op) == F.schema_hash(op)


@pytest.mark.parametrize("op", registry.names("ranker"))
def test_contract_the_fallback_picks_a_feasible_candidate_and_the_vendor_obeys_check_feasible(op):
    spec = registry.get(op)
    space = spec.space_module()
    rule = spec.fallback_rule()
    for dtype in spec.dtypes:
        for p in _suite_problems(spec, dtype):
            feas = spec.feasible_configs(p, "sm90")
            assert feas, (op, p)
            cands = [{"variant": c.variant, **space.config_params(c)} for c in feas]
            # As the runtime calls it: an op without pinned E and top_k gets them.
            kw = {} if spec.fixed else {"e": p.e, "top_k": p.top_k}
            i = rule(p.m, p.n, p.k, 132, cands, **kw)
            assert 0 <= i < len(feas) and spec.check_feasible(feas[i], p, "sm90")[0]
            for vid in spec.vendor_ids:
                ok, why = spec.check_feasible(spec.config_from_id(vid), p, "sm90")
                assert ok == (vid in {c.id for c in feas}) and (ok or why), (vid, p)


@pytest.mark.parametrize("op", registry.names("classifier"))
def test_contract_a_classifier_op_names_a_feasible_kernel_through_the_dispatcher(op):
    """Classifier ops (labels only, no timings: the AMD CK op) are served by their own dispatcher,
    reached through Dispatcher(op=...); their fallback names a kernel for any problem."""
    from gemm_costmodel.serving.runtime import Dispatcher

    spec = registry.get(op)
    assert spec.kind == "classifier" and spec.dispatcher
    space = spec.space_module()
    for arch in space.ARCHS:
        for m, n, k in ((1, 4096, 4096), (7, 7168, 2048), (4097, 1536, 7168)):
            assert isinstance(space.choose(space.Problem(m, n, k), arch), str)


# -- the op seam covers serving and data: torch ops registered per op, no op's field in shared code -----

@pytest.mark.parametrize("op", [o for o in registry.names() if registry.get(o).torch_op])
def test_contract_the_torch_op_module_registers_its_ops_and_serving_binds_them(op):
    import importlib

    from gemm_costmodel.serving import ops

    mod = importlib.import_module(registry.get(op).torch_op)
    assert mod.CUSTOM_OPS and mod.EXPORTS
    for name in mod.CUSTOM_OPS:  # torch.library custom ops, with fake impls for torch.compile
        assert hasattr(torch.ops.gemm_costmodel, name), name
        assert torch._library.simple_registry.singleton.find(f"gemm_costmodel::{name}").fake_impl.kernel is not None
    for name in mod.EXPORTS:  # re-exported where users call them
        assert getattr(ops, name) is getattr(mod, name)
    assert mod._host is not None and mod._host.op == op


@pytest.mark.parametrize("op", registry.names())
def test_contract_declared_columns_and_frame_checks_resolve(op):
    spec = registry.get(op)
    for c, (kind, doc, default) in spec.columns.items():
        assert kind in ("int", "str") and doc and isinstance(default, int if kind == "int" else str), c
    for f in spec.problem_fields:
        registry.column_kind(f)  # every problem field has a kind (shared or declared)
    if spec.frame_check:
        assert callable(registry._resolve(spec.frame_check))


def _shared_modules() -> list:
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [f for d in ("costmodel/data", "costmodel/learning", "costmodel/serving")
             for f in glob.glob(os.path.join(root, d, "*.py"))]
    files += [os.path.join(root, f) for f in ("costmodel/cli.py", "costmodel/adapt.py", "benchmarks/harness.py",
                                              "benchmarks/store.py", "benchmarks/summary.py")]
    return sorted(files)


# The MoE op's own field names and values: shared code reads them from the registry (OpSpec.columns,
# problem_fields), never by name.
_OP_FIELD_LITERALS = {"stage", "routing", "gate_up", "down", "balanced", "tpe_max", "active_experts"}
# The one allowed module: the vLLM exporter writes vLLM's own per-op file formats (fused MoE's
# E=..,N=.. files of two stages), so it is op-specific by nature.
_FIELD_LITERAL_ALLOWED = {"vllm_export.py"}


def test_shared_modules_name_no_op_specific_field():
    import ast
    import os

    found = []
    for path in _shared_modules():
        if os.path.basename(path) in _FIELD_LITERAL_ALLOWED:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and node.value in _OP_FIELD_LITERALS:
                found.append(f"{os.path.relpath(path)}:{node.lineno}: {node.value!r}")
    assert not found, found
