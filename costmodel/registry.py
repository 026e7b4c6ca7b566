"""The op registry: every operation the dispatcher serves is ONE ``OpSpec`` entry.

An entry names where each concern of its op lives; everything op-agnostic (the
harness and its store, the dataset, features, training, evaluation, export, the
runtime, the CLI) asks the registry instead of importing an op's modules:

- ``space``: a torch-free module with the op's frozen ``Problem`` type, its config
  dataclasses with stable string ids (``config_from_id``), ``generate_configs(arch,
  dtype)`` and the ONE source of per-problem feasibility (``PROBLEM_RULES``, applied to
  a whole space by ``problem_mask`` and to one config by ``check_feasible``);
- ``impl``: the kernel implementation, imported lazily (torch, triton): ``launch``,
  ``reference``, ``check_operands``, ``make_operands``, ``ERROR_BOUNDS``;
- ``problem_fields`` (the dataset columns of a problem) and ``fixed`` (fields the op
  pins, e.g. a dense GEMM has E = 1 and top_k = 1: anything else is another op);
- ``vendor_ids``, the ``default_config`` (what an untuned user runs: a baseline), the
  ``fallback`` decision rule, the held-out ``split_key``, the
  ``suites`` of shapes, ``extra_features`` (added to the shared feature list; they
  enter the op's schema hash, so a new op never invalidates another op's model), and
  ``baselines``, the op's own baselines for the held-out evaluation (e.g. vLLM's tables);
- ``train_defaults`` (TrainConfig defaults), ``features`` (the op's own feature module),
  ``cascade`` (how export splits the decision model for the runtime's cascade) and ``torch_op``
  (the module of its torch custom ops, which serving.ops binds to the dispatcher).

Adding an op: a folder of its own under kernels/ (space + implementation), a suite
function, and one line in ``REGISTRY`` below; see docs/adding-an-op.md.

Torch-free (the serving path imports it): modules named here are imported on use.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable


def _resolve(path: str):
    """'package.module:attr' -> the attribute (imported on first use)."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


@dataclass(frozen=True)
class OpSpec:
    """One operation the product dispatches; see the module doc for each field."""

    name: str
    dtypes: tuple[str, ...]
    space: str
    impl: str
    problem_fields: tuple[str, ...]
    fixed: dict = field(default_factory=dict)
    vendor_ids: tuple[str, ...] = ()
    default_config: str = ""
    fallback: str = ""
    split_key: tuple[str, ...] = ("n", "k")
    suites: dict = field(default_factory=dict)
    extra_features: tuple[str, ...] = ()
    # 'module:function' (pandas; lazily) returning {method: picks (shape id -> candidate id)} of
    # op-specific baselines for the held-out evaluation, given the evaluation rows and the fold's
    # training evaluation rows (fitted on those only; e.g. vLLM's tables).
    baselines: str = ""
    # TrainConfig defaults of this op's models (the command line overrides them).
    train_defaults: dict = field(default_factory=dict)
    # A numpy-only module of the op's own features (appended to the shared ones; see
    # serving.features.op_features), '' for none.
    features: str = ""
    # The decision model's cascade at export (learning.export.write_cascade): "prefix_trees" (else
    # "prefix_fraction" of the trees) score every candidate, the rest the "keep" best; defaults there.
    cascade: dict = field(default_factory=dict)
    # "ranker": the model scores every candidate of a Triton config space (the default); "classifier":
    # the model names the kernel itself (class names in its manifest), served by ``dispatcher``.
    kind: str = "ranker"
    # 'module:Class', a subclass of serving.runtime.Dispatcher that Dispatcher(op=...) returns for
    # this op ('' for the shared ranking dispatcher).
    dispatcher: str = ""
    # The module of the op's torch custom ops (torch, triton: imported by serving.ops, which binds
    # its decisions to them; see kernels/moe/torch_op.py), '' for an op without any.
    torch_op: str = ""
    # Dataset columns this op adds to the shared ones: name -> (kind, description, the value rows
    # of ops without it carry). Its problem fields beyond (m, n, k, dtype) and any per-row
    # statistics of its problems; shared code reads them through ``columns()``.
    columns: dict = field(default_factory=dict)
    # 'module:function' (numpy) checking a whole frame of rows on read: (column, first bad row,
    # what is wrong) or None; e.g. the MoE op's top_k <= E. '' for none.
    frame_check: str = ""

    # -- the space (torch-free) ---------------------------------------------------------
    def space_module(self) -> ModuleType:
        return importlib.import_module(self.space)

    def problem(self, **fields):
        """The op's Problem from its fields (dataset column names); fixed fields are checked
        and dropped, so a dense GEMM given E = 8 raises a ValueError naming E."""
        self.check_fixed(fields)
        kw = {k: v for k, v in fields.items() if k not in self.fixed}
        return self.space_module().Problem(**kw)

    def problem_of(self, row) -> object:
        """The op's Problem from a row-like mapping (dataset row, harness shape fields): only the
        op's ``problem_fields`` are read; the fixed ones are checked."""
        self.check_fixed({f: row[f] for f in self.fixed if f in row})
        kw = {}
        for f in self.problem_fields:
            v = row[f]
            if isinstance(v, str):
                kw[f] = v
                continue
            try:
                kw[f] = int(v)
            except (TypeError, ValueError):  # None, a list, an array: name the field, not int()'s complaint
                raise ValueError(f"{f} must be {'a str' if column_kind(f) == 'str' else 'an int'}, "
                                 f"got {type(v).__name__} {v!r}"[:200]) from None
        return self.space_module().Problem(**kw)

    def extra_problem_fields(self) -> tuple[str, ...]:
        """Problem fields beyond (m, n, k, dtype, e, top_k): e.g. the MoE op's stage and routing."""
        return tuple(f for f in self.problem_fields if f not in ("m", "n", "k", "dtype", "e", "top_k"))

    def check_fixed(self, fields: dict) -> None:
        """ValueError naming the first field that differs from the value the op pins."""
        for f, want in self.fixed.items():
            if f in fields and fields[f] != want:
                label = column_label(f)
                raise ValueError(f"{label}={fields[f]!r} is not a {self.name} problem ({self.name} has {label} = "
                                 f"{want}); expert-parallel GEMMs are another op")

    def configs(self, arch: str, dtype: str, include_vendor: bool = True) -> list:
        return self.space_module().generate_configs(arch, dtype, include_vendor)

    def config_from_id(self, cid: str):
        return self.space_module().config_from_id(cid)

    def check_feasible(self, cfg, problem, arch: str = "sm90") -> tuple[bool, str]:
        return self.space_module().check_feasible(cfg, problem, arch)

    def feasible_configs(self, problem, arch: str = "sm90", include_vendor: bool = True) -> list:
        return self.space_module().feasible_configs(problem, arch, include_vendor)

    # -- decisions without a model ---------------------------------------------------
    def fallback_rule(self) -> Callable:
        return _resolve(self.fallback)

    def fallback_rule_arrays(self) -> Callable | None:
        """The fallback rule over candidate arrays, where the rule's module has one (``<rule>_arrays``,
        e.g. ``moe.space.choose_arrays``): the same index as the rule, called as
        ``rule(m, n, k, sm_count, serving.candidates.CandidateArrays, **kw)``; else None."""
        module, _, attr = self.fallback.partition(":")
        return getattr(importlib.import_module(module), attr + "_arrays", None)

    def fallback_fields(self) -> tuple[str, ...]:
        """The problem fields beyond (m, n, k) that the fallback rule takes as keywords (the MoE rule:
        e, top_k, dtype), which every caller passes as ``rule(m, n, k, sm_count, cands, **kw)``."""
        return _fallback_fields(self.name)

    def shape_id_suffix(self, values: dict) -> str:
        """The part of a shape id after dtype:MxNxK for the op's extra problem fields (``values``:
        field -> value): the space module's ``SHAPE_ID`` format if it has one (MoE:
        ':e{e}k{top_k}:{stage}:{routing}'), else ':'-joined values; '' for an op without any."""
        extra = [f for f in self.problem_fields if f not in SHARED_PROBLEM]
        if not extra:
            return ""
        fmt = getattr(self.space_module(), "SHAPE_ID", None)
        return fmt.format(**values) if fmt else "".join(f":{values[f]}" for f in extra)

    def baseline_picks(self, ev, train_ev) -> dict:
        """Op-specific baselines on evaluation rows: {method: pandas Series, shape id -> the
        candidate id it runs} ({} when the op names none); the evaluation scores the picks, so an
        op's baselines need nothing from learning/."""
        return _resolve(self.baselines)(ev, train_ev) if self.baselines else {}

    def report_sections(self, results) -> list[str]:
        """The op's own report sections: ``report_section(results)`` of its baselines module."""
        if not self.baselines:
            return []
        fn = getattr(importlib.import_module(self.baselines.partition(":")[0]), "report_section", None)
        return [fn(results)] if fn is not None else []

    def suite(self, name: str, dtype: str) -> list:
        if name not in self.suites:
            raise ValueError(f"op {self.name} has no suite {name!r}; it has: {', '.join(sorted(self.suites))}")
        return _resolve(self.suites[name])(dtype)

    # -- the implementation (torch, triton: lazily) -----------------------------------
    def impl_module(self) -> ModuleType:
        return importlib.import_module(self.impl)

    def features_module(self) -> ModuleType | None:
        return importlib.import_module(self.features) if self.features else None


# One line per op.
REGISTRY: dict[str, OpSpec] = {
    "gemm": OpSpec(
        name="gemm", dtypes=("bf16", "fp16", "fp8"),
        space="gemm_costmodel.kernels.gemm.space", impl="gemm_costmodel.kernels.gemm.impl",
        problem_fields=("m", "n", "k", "dtype"), fixed={"e": 1, "top_k": 1}, vendor_ids=("cublas",),
        default_config="tiled_m128n128k64_g8_w4s3", fallback="gemm_costmodel.kernels.gemm.heuristic:choose",
        split_key=("n", "k"),
        suites={"foundation": "gemm_costmodel.kernels.gemm.suites:foundation_suite",
                "train": "gemm_costmodel.kernels.gemm.suites:training_suite"},
        # 16 kept: the prefix's best 16 hold the whole model's pick on 3,500 of 3,500 problems
        # (docs/decisions/063-gemm-model-defaults.md).
        cascade={"keep": 16}, torch_op="gemm_costmodel.kernels.gemm.torch_op",
        # 1% grades (GEMV near-ties), M <= 2 trees of their own and a power-of-2-of-M shortlist:
        # docs/decisions/063-gemm-model-defaults.md.
        # 200 trees a side: with the cascade the trees past the prefix score only its best 16
        # (docs/decisions/073-gemm-200-trees.md).
        train_defaults={"rank_step": 1.01, "split_m": 2, "shortlist_tol": 1.03, "n_estimators": 200,
                        "shortlist_edges": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)}),
    # vLLM's w8a8 block-fp8 linear; the vendor candidate is torch._scaled_mm with cuBLASLt's
    # blockwise scaling (sm90).
    "fp8_blockscale": OpSpec(
        name="fp8_blockscale", dtypes=("fp8",),
        space="gemm_costmodel.kernels.fp8_blockscale.space", impl="gemm_costmodel.kernels.fp8_blockscale.impl",
        problem_fields=("m", "n", "k", "dtype"), fixed={"e": 1, "top_k": 1}, vendor_ids=("cublas",),
        default_config="bstiled_m64n128k128_g32_w4s2", fallback="gemm_costmodel.kernels.fp8_blockscale.space:choose",
        split_key=("n", "k"),
        suites={"train": "gemm_costmodel.kernels.fp8_blockscale.suites:training_suite",
                "eval": "gemm_costmodel.kernels.fp8_blockscale.suites:eval_suite",
                "gate": "gemm_costmodel.kernels.fp8_blockscale.suites:gate_suite"},
        baselines="gemm_costmodel.kernels.fp8_blockscale.baselines:picks",
        # 300 trees of depth 8 (leave-family-out 1.010), 1% grades, no vendor margin, M = 1 trees
        # fitted on every M (M = 1 weighted 20): docs/decisions/064-fp8bs-model-defaults.md. The
        # dense op's power-of-2-of-M shortlist at 3% (issue 58: a cold decision scores ~77 of ~295
        # feasible candidates; the trees do not depend on it): docs/dispatch-latency-ops.md.
        train_defaults={"shortlist_tol": 1.03, "n_estimators": 300, "max_depth": 8, "learning_rate": 0.1,
                        "rank_step": 1.01, "split_m": 1, "split_high_rows": "all",
                        "split_low_rows": "all", "split_low_weight": 20.0,
                        "shortlist_edges": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)},
        # A 40-tree prefix, 24 kept: the same picks as 60/48 on every evaluation problem of both
        # cards (issue 58, benchmarks/explore/cascade_quality.py; docs/dispatch-latency-ops.md).
        cascade={"keep": 24, "prefix_trees": 40}, torch_op="gemm_costmodel.kernels.fp8_blockscale.torch_op",
        # The M = 1 GEMV's best config follows the power-of-two part of N and K; held-out match
        # 87.9% -> 89.0% (docs/decisions/064-fp8bs-model-defaults.md).
        extra_features=("log2_n_pow2", "log2_k_pow2"),
        features="gemm_costmodel.kernels.fp8_blockscale.features"),
    # Fused MoE layer (vLLM's fused_experts): two stages (gate_up, down), each a grouped GEMM with
    # its own config; the routing (expert histogram) is part of the problem. Vendor: torch._grouped_mm.
    "moe": OpSpec(
        name="moe", dtypes=("bf16", "fp8", "fp8bs"),
        space="gemm_costmodel.kernels.moe.space", impl="gemm_costmodel.kernels.moe.impl",
        problem_fields=("m", "n", "k", "dtype", "e", "top_k", "stage", "routing"), vendor_ids=("grouped_mm",),
        default_config="moe_m16n64k128_g1_w4s4", fallback="gemm_costmodel.kernels.moe.space:choose",
        split_key=("e", "n", "k"),
        suites={"train": "gemm_costmodel.kernels.moe.suites:training_suite",
                "train_skewed": "gemm_costmodel.kernels.moe.suites:skewed_suite",
                "eval": "gemm_costmodel.kernels.moe.suites:eval_suite",
                "vllm": "gemm_costmodel.kernels.moe.suites:vllm_suite",
                "gate": "gemm_costmodel.kernels.moe.suites:gate_suite"},
        extra_features=("stage_down", "log2_tpe_mean", "log2_tpe_max", "active_fraction", "imbalance",
                        "tiles_real", "pad_real", "log2_programs_real", "waves_real", "wave_efficiency_real",
                        "log2_grid_programs", "log2_t_weights_us", "log2_t_traffic_real_us",
                        "log2_t_waves_real_us", "gemv_log2_programs", "gemv_k_steps", "gemv_acc_per_thread",
                        "gemv_log2_occupancy", "gemv_waves", "gemv_log2_inflight_kb", "gemv_log2_serial_steps"),
        baselines="gemm_costmodel.kernels.moe.baselines:picks",
        # 300 trees at eta 0.1, 1% grades, decode queries (M <= 4) weighted 4 with trees of their own:
        # docs/decisions/065-moe-model-defaults.md. The dense op's power-of-2-of-M shortlist at 3%
        # (issue 58: a cold decision scores ~112 of ~214 bf16 candidates, ~83 of ~144 fp8; the trees do
        # not depend on it): docs/dispatch-latency-ops.md.
        train_defaults={"shortlist_tol": 1.03, "n_estimators": 300, "learning_rate": 0.1, "rank_step": 1.01,
                        "decode_weight": 4, "split_m": 4,
                        "shortlist_edges": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)},
        # A 30-tree prefix, 48 kept (was 60 and 64: 1 miss in 676 problems,
        # docs/decisions/065-moe-model-defaults.md): with the shortlist, the whole model's pick on 631
        # of the 632 evaluation problems of both cards, geomean slowdown within 0.00003 (issue 58,
        # benchmarks/explore/cascade_quality.py; docs/dispatch-latency-ops.md).
        cascade={"keep": 48, "prefix_trees": 30}, torch_op="gemm_costmodel.kernels.moe.torch_op",
        columns={"e": ("int", "experts (1 for dense)", 1), "top_k": ("int", "experts per token (1 for dense)", 1),
                 "stage": ("str", "the op's stage ('' for one-stage ops; moe: gate_up or down)", ""),
                 "routing": ("str", "routing id of an MoE problem (kernels/moe/routing.py; '' for dense)", ""),
                 "tpe_max": ("int", "tokens of the busiest expert (MoE; 0 = n/a)", 0),
                 "active_experts": ("int", "experts with at least one token (MoE; 0 = n/a)", 0)},
        frame_check="gemm_costmodel.kernels.moe.space:frame_check",
        features="gemm_costmodel.kernels.moe.features"),
    # MoE training's expert GEMMs (docs/ops/grouped_gemm.md): fwd, dgrad and wgrad (the problem's stage) over
    # E groups of routed tokens; the routing is part of the problem. Vendor: torch._grouped_mm.
    "grouped_gemm": OpSpec(
        name="grouped_gemm", dtypes=("bf16",), space="gemm_costmodel.kernels.grouped_gemm.space",
        impl="gemm_costmodel.kernels.grouped_gemm.impl", problem_fields=("m", "n", "k", "dtype", "e", "stage", "routing"),
        fixed={"top_k": 1}, vendor_ids=("grouped_mm",), default_config="ggpers_m128n128k64_g8_w8s4",
        fallback="gemm_costmodel.kernels.grouped_gemm.space:choose", split_key=("n", "k"),
        suites={"train": "gemm_costmodel.kernels.grouped_gemm.suites:training_suite",
                "eval": "gemm_costmodel.kernels.grouped_gemm.suites:eval_suite",
                "gate": "gemm_costmodel.kernels.grouped_gemm.suites:gate_suite"},
        extra_features=("stage_fwd", "stage_dgrad", "stage_wgrad", "log2_tpg_mean", "log2_tpg_max", "empty_fraction",
                        "imbalance", "log2_reduction", "log2_reduction_max", "log2_tiles_real", "pad_real",
                        "waves_real", "wave_efficiency_real", "log2_k_steps_max", "log2_t_flops_us",
                        "log2_t_bytes_us"),
        baselines="gemm_costmodel.kernels.grouped_gemm.baselines:picks",
        torch_op="gemm_costmodel.kernels.grouped_gemm.torch_op",
        features="gemm_costmodel.kernels.grouped_gemm.features"),
    # vLLM's own Triton kernels (compiled from a vLLM source, never committed; kernels/moe/vllm_kernels.py
    # launches them as vLLM 0.33.0 does) with vLLM's tuner spaces, so their models rank vLLM's configs
    # for vLLM's kernel (`costmodel export-vllm`): docs/decisions/069-vllm-kernels-as-ops-of-their-own.md.
    # The fused-MoE layer: ONE config for both GEMMs (vLLM's tuned files key a layer by M only); n is
    # vLLM's N (the per-shard intermediate size), k the hidden size (docs/ops/vllm_moe.md).
    "vllm_moe": OpSpec(
        name="vllm_moe", dtypes=("bf16", "fp8", "fp8bs"),
        space="gemm_costmodel.kernels.vllm_moe.space", impl="gemm_costmodel.kernels.vllm_moe.impl",
        problem_fields=("m", "n", "k", "dtype", "e", "top_k", "routing"), vendor_ids=("grouped_mm",),
        default_config="vmoe_m16n64k128_g1_w4s4", fallback="gemm_costmodel.kernels.vllm_moe.space:choose",
        split_key=("e", "n", "k"),
        suites={"train": "gemm_costmodel.kernels.vllm_moe.suites:training_suite",
                "eval": "gemm_costmodel.kernels.vllm_moe.suites:eval_suite",
                "eval_core": "gemm_costmodel.kernels.vllm_moe.suites:eval_core_suite",
                "vllm": "gemm_costmodel.kernels.vllm_moe.suites:vllm_suite",
                "gate": "gemm_costmodel.kernels.vllm_moe.suites:gate_suite"},
        extra_features=("log2_tpe_mean", "log2_tpe_max", "active_fraction", "imbalance", "per_pair", "swap_ab_rule",
                        "tiles_real", "pad_real", "log2_programs_up", "waves_up", "wave_efficiency_up",
                        "log2_t_traffic_up_us", "log2_t_waves_up_us", "k_iters_up", "log2_programs_down",
                        "waves_down", "wave_efficiency_down", "log2_t_traffic_down_us", "log2_t_waves_down_us",
                        "k_iters_down", "log2_grid_programs", "log2_t_weights_us"),
        baselines="gemm_costmodel.kernels.vllm_moe.baselines:picks",
        # The MoE op's starting point (300 trees at eta 0.1, 1% grades, no shortlist); to be revisited
        # on the first data.
        train_defaults={"shortlist_tol": 0.0, "n_estimators": 300, "learning_rate": 0.1, "rank_step": 1.01},
        # The MoE op's columns of the fields and routing statistics the layer shares with its stages.
        columns={"e": ("int", "experts (1 for dense)", 1), "top_k": ("int", "experts per token (1 for dense)", 1),
                 "routing": ("str", "routing id of an MoE problem (kernels/moe/routing.py; '' for dense)", ""),
                 "tpe_max": ("int", "tokens of the busiest expert (MoE; 0 = n/a)", 0),
                 "active_experts": ("int", "experts with at least one token (MoE; 0 = n/a)", 0)},
        frame_check="gemm_costmodel.kernels.vllm_moe.space:frame_check",
        features="gemm_costmodel.kernels.vllm_moe.features"),
    # vLLM's w8a8 block-fp8 linear: the fp8_blockscale op's problem and suites (docs/ops/vllm_w8a8_block.md).
    "vllm_w8a8_block": OpSpec(
        name="vllm_w8a8_block", dtypes=("fp8",),
        space="gemm_costmodel.kernels.vllm_w8a8_block.space", impl="gemm_costmodel.kernels.vllm_w8a8_block.impl",
        problem_fields=("m", "n", "k", "dtype"), fixed={"e": 1, "top_k": 1}, vendor_ids=("cublas",),
        default_config="vbs_m64n128k128_g32_w4s2", fallback="gemm_costmodel.kernels.vllm_w8a8_block.space:choose",
        split_key=("n", "k"),
        suites={"train": "gemm_costmodel.kernels.vllm_w8a8_block.suites:training_suite",
                "eval": "gemm_costmodel.kernels.vllm_w8a8_block.suites:eval_suite",
                "eval_core": "gemm_costmodel.kernels.vllm_w8a8_block.suites:eval_core_suite",
                "gate": "gemm_costmodel.kernels.vllm_w8a8_block.suites:gate_suite"},
        baselines="gemm_costmodel.kernels.vllm_w8a8_block.baselines:picks",
        # The fp8_blockscale op's starting point without its GEMV-specific M = 1 trees.
        train_defaults={"shortlist_tol": 0.0, "n_estimators": 300, "max_depth": 8, "learning_rate": 0.1,
                        "rank_step": 1.01},
        # The fp8_blockscale op's own features (powers of two of N and K) serve the same problem.
        extra_features=("log2_n_pow2", "log2_k_pow2"),
        features="gemm_costmodel.kernels.fp8_blockscale.features"),
    # AMD's CK a8w8 block-scale GEMM (AITER's gemm_a8w8_blockscale): a classifier over named CK kernels
    # learned from AITER's published tuning tables; nothing is timed or launched here
    # (docs/ops/ck_a8w8_blockscale.md). dtypes: fp8 operands, bf16/fp16 output: one decision for all
    # (AITER's tables key on cu_num, M, N, K only). Held out by model family (the per-model table).
    "ck_a8w8_blockscale": OpSpec(
        name="ck_a8w8_blockscale", dtypes=("fp8", "bf16", "fp16"),
        space="gemm_costmodel.kernels.ck_a8w8_blockscale.space",
        impl="gemm_costmodel.kernels.ck_a8w8_blockscale.impl",
        problem_fields=("m", "n", "k", "dtype"), fixed={"e": 1, "top_k": 1},
        default_config="a8w8_blockscale_1x128x128_256x16x128x256_16x16_16x16_1x2_16x16x1_16x16x1_1x16x1x16_8_1x2_"
                       "intrawave_v1",
        fallback="gemm_costmodel.kernels.ck_a8w8_blockscale.space:choose", split_key=("family",),
        features="gemm_costmodel.kernels.ck_a8w8_blockscale.features", kind="classifier",
        dispatcher="gemm_costmodel.serving.classifier:ClassifierDispatcher"),
}
# The op the command line runs when --op is not given (and whose report sits at models/report/).
DEFAULT_OP = "gemm"
# The op of data written before the op registry (rows, tuned tables, models without an op field):
# dense GEMM. A data-format rule, not an argument default: library functions take the op.
LEGACY_OP = "gemm"


@functools.lru_cache(maxsize=None)
def _fallback_fields(name: str) -> tuple[str, ...]:
    spec = get(name)
    params = inspect.signature(spec.fallback_rule()).parameters
    # dtype only where the rule asks for it (the MoE rule: fp8bs has a default of its own).
    return tuple(f for f in spec.problem_fields if (f not in SHARED_PROBLEM or f == "dtype") and f in params)


def get(name: str) -> OpSpec:
    """The registered op of this name; a ValueError lists the known ones."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def names(kind: str | None = None) -> list[str]:
    """Registered op names (of one ``kind`` if given: 'ranker' or 'classifier')."""
    return sorted(n for n, s in REGISTRY.items() if kind is None or s.kind == kind)


def problem_columns() -> tuple[str, ...]:
    """Every registered op's problem fields and pinned fields, in registry order (first seen first):
    the columns that tell one problem from another in shared frames and keys, so shared code
    names no op's own fields (MoE's stage and routing come from its entry)."""
    out: dict[str, None] = {}
    for spec in REGISTRY.values():
        out.update(dict.fromkeys(spec.problem_fields))
        out.update(dict.fromkeys(spec.fixed))
    return tuple(out)


def shape_columns() -> list[str]:
    """problem_columns in the shared frames' order: dtype, M, N, K, then the rest (e.g. e, top_k,
    stage, routing)."""
    base = ["dtype", "m", "n", "k"]
    return base + [c for c in problem_columns() if c not in base]


# The problem columns every op shares, with their kinds.
SHARED_PROBLEM = {"m": "int", "n": "int", "k": "int", "dtype": "str"}


def columns() -> dict[str, tuple[str, str, object]]:
    """The dataset columns the ops declare beyond the shared ones (``OpSpec.columns``: kind,
    description, the value of rows of other ops), in registry order, first declaration first."""
    out: dict[str, tuple] = {}
    for spec in REGISTRY.values():
        for c, v in spec.columns.items():
            out.setdefault(c, tuple(v))
    return out


def column_kind(name: str) -> str:
    """'int' or 'str': the kind of a problem column (a shared one, or one an op declares; a column
    only pinned takes its pinned value's kind)."""
    if name in SHARED_PROBLEM:
        return SHARED_PROBLEM[name]
    declared = columns()
    if name in declared:
        return declared[name][0]
    for spec in REGISTRY.values():
        if name in spec.fixed:
            return "str" if isinstance(spec.fixed[name], str) else "int"
    raise ValueError(f"no op declares a column {name!r}")


def column_label(name: str) -> str:
    """How messages name a column: E for the experts, as the docs and vLLM write it."""
    return {"e": "E"}.get(name, name)


def column_default(name: str):
    """The value of column ``name`` in rows of ops without that field (e.g. a dense GEMM's E)."""
    return columns()[name][2]


def extra_columns() -> tuple[str, ...]:
    """The problem columns beyond the shared (m, n, k, dtype), in registry order (e.g. MoE's)."""
    return tuple(c for c in problem_columns() if c not in SHARED_PROBLEM)


def str_columns() -> tuple[str, ...]:
    """The extra problem columns holding strings (frames keep them as str or categories)."""
    return tuple(c for c in extra_columns() if column_kind(c) == "str")


def key_layout() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(integer columns, string columns) of the extra problem columns, as the harness store key
    lays them out: (op, dtype, m, n, k, *integers, candidate, *strings). The layout keeps the keys
    of sweeps from before the string fields existed a prefix of today's."""
    ints = tuple(c for c in extra_columns() if column_kind(c) == "int")
    return ints, str_columns()
