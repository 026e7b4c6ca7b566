"""The MoE op's evaluation baselines (vLLM's default and its tuned files with the nearest-M lookup,
run in our kernel), the whole-layer table and the report section, against hand-computed answers."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gemm_costmodel.kernels.vllm import tables
from gemm_costmodel import registry
from gemm_costmodel.kernels.moe import baselines as B
from gemm_costmodel.kernels.moe import space
from gemm_costmodel.learning import evaluate as E

H100 = "NVIDIA H100 80GB HBM3"
VLLM_DIR = Path(tables.tables_dir(tables.KIND_MOE))  # vLLM 0.33.0's tables, kept in the repository

# Configs (all in our bf16 space but BAD): vLLM's defaults for E = 8 at M = 1, 40 and 5000, and
# three entries of vLLM's H100 tuned files.
A = "moe_m16n64k128_g1_w4s4"    # default, M <= 32
B_ = "moe_m32n64k128_g1_w4s3"   # default, 33 <= M <= 64
F = "moe_m128n128k64_g16_w8s3"  # default, M > 512 with M // E > 128
C = "moe_m16n64k64_g1_w4s3"
D = "moe_m16n128k128_g1_w8s2"
X = "moe_m16n32k64_g1_w4s2"
BAD = (32, 64, 256, 1, 4, 5)    # a vLLM tuned config over our shared-memory rule


def _entry(t):
    return dict(zip(space.VLLM_KEYS, t))


def _cfg(cid):
    return space.to_vllm(space.config_from_id(cid))


@pytest.fixture
def moe_op(monkeypatch):
    """The moe registry entry (added here if this checkout has none yet)."""
    if "moe" not in registry.REGISTRY:
        monkeypatch.setitem(registry.REGISTRY, "moe", registry.OpSpec(
            name="moe", dtypes=("bf16", "fp8"), space="gemm_costmodel.kernels.moe.space",
            impl="gemm_costmodel.kernels.moe.impl",
            problem_fields=("m", "n", "k", "dtype", "e", "top_k", "stage", "routing"), vendor_ids=("grouped_mm",),
            default_config=A, fallback="gemm_costmodel.kernels.moe.space:choose",
            baselines="gemm_costmodel.kernels.moe.baselines:scores"))
    return registry.get("moe")


@pytest.fixture
def vllm_dir(tmp_path, monkeypatch):
    """A vLLM config folder: one H100 bf16 file for (E, N) = (8, 96), and files vLLM would not
    read for bf16 on an H100 (other GPU, fp8, dtype=bf16, block-scaled, int8)."""
    body = {"triton_version": "3.5.0", "1": _cfg(C), "64": _cfg(D), "4096": _entry(BAD)}
    (tmp_path / "E=8,N=96,device_name=NVIDIA_H100_80GB_HBM3.json").write_text(json.dumps(body))
    other = {"1": _cfg(X)}
    for name in ("E=8,N=96,device_name=NVIDIA_H200.json",
                 "E=8,N=96,device_name=NVIDIA_H100_80GB_HBM3,dtype=bf16.json",
                 "E=8,N=96,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
                 "E=8,N=96,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json",
                 "E=16,N=96,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"):
        (tmp_path / name).write_text(json.dumps(other))
    (tmp_path / "README.md").write_text("not a config")
    monkeypatch.setenv(B.ENV_VLLM_DIR, str(tmp_path))
    return tmp_path


def test_vllm_defaults_known_answers():
    pick = lambda m, e, dt="bf16": B.vllm_pick({}, m, e, 96, dt)  # noqa: E731
    assert pick(1, 8) == (space.config_from_id("moe_m16n64k128_g1_w4s4"), "default")
    assert pick(33, 8)[0].id == "moe_m32n64k128_g1_w4s3"
    assert pick(97, 8)[0].id == "moe_m64n128k64_g1_w4s3"
    assert pick(513, 8)[0].id == "moe_m128n128k64_g1_w8s3"   # 513 // 8 = 64: GROUP_SIZE_M 1
    assert pick(513, 2)[0].id == "moe_m128n128k64_g16_w8s3"  # 513 // 2 = 256 > 128: 16
    assert pick(97, 8, "fp8")[0].id == "moe_m64n128k128_g1_w4s3"  # fp8: BLOCK_SIZE_K 128
    assert pick(5000, 8)[0].id == F
    # Every default is in our space.
    cfgs = set(space.generate_configs("sm90", "bf16"))
    assert all(pick(m, e)[0] in cfgs for m in (1, 33, 97, 513, 5000) for e in (1, 2, 8, 512))


def test_stage_to_vllms_n():
    assert B.intermediate("gate_up", 14336, 4096) == 7168
    assert B.intermediate("down", 4096, 7168) == 7168
    with pytest.raises(ValueError):
        B.intermediate("up", 1, 1)


def test_load_tables_reads_what_vllm_reads(vllm_dir):
    t = B.load_vllm_tables(gpu_name=H100)  # the env var's folder
    assert set(t) == {(8, 96)}
    assert list(t[(8, 96)]) == [1, 64, 4096]  # 'triton_version' skipped, file order kept
    assert t[(8, 96)][1].id == C and t[(8, 96)][4096] == space.MoeTiledConfig(*BAD)
    assert set(B.load_vllm_tables(gpu_name=H100, dtype="fp8")) == {(16, 96)}
    assert set(B.load_vllm_tables(gpu_name="NVIDIA H200")) == {(8, 96)}
    assert B.load_vllm_tables(str(vllm_dir / "missing")) == {}
    # Nearest M, ties to the first key as vLLM's min() does.
    pick = lambda m: B.vllm_pick(t, m, 8, 96)  # noqa: E731
    assert pick(1) == (space.config_from_id(C), "tuned")
    assert pick(32)[0].id == C      # |32 - 1| = 31 < |32 - 64| = 32: key 1
    assert pick(33)[0].id == D      # |33 - 1| = 32 > |33 - 64| = 31: key 64
    assert pick(40)[0].id == D
    assert pick(2080)[0].id == D    # |2080 - 64| = 2016 = |2080 - 4096|: a tie keeps the first key, 64
    assert pick(2081)[0] == space.MoeTiledConfig(*BAD)
    assert pick(5000)[1] == "tuned" and B.vllm_pick(t, 16, 8, 128) == (space.config_from_id(A), "default")


def test_load_tables_names_a_bad_entry(tmp_path):
    (tmp_path / "E=8,N=96,device_name=NVIDIA_H100_80GB_HBM3.json").write_text(json.dumps({"4": {"BLOCK_SIZE_M": 16}}))
    with pytest.raises(ValueError, match=r"E=8,N=96.*M=4.*missing"):
        B.load_vllm_tables(str(tmp_path))


def test_shipped_h100_files_nearest_m():
    path = VLLM_DIR / "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert path.is_file(), f"vLLM's tables belong in the repository: {path}"
    raw = {int(k): v for k, v in json.loads(path.read_text()).items() if k.isdigit()}
    t = B.load_vllm_tables(str(VLLM_DIR), H100)
    assert (8, 7168) in t and (64, 8960) not in t  # dtype=bf16 files: vLLM never reads them
    assert (8, 14336) not in t  # fp8-only (E, N)
    for m, key in ((1, 1), (20, 16), (100, 96), (192, 128), (193, 256), (700, 512), (5000, 4096), (8192, 4096)):
        cfg, source = B.vllm_pick(t, m, 8, 7168)
        assert source == "tuned" and space.to_vllm(cfg) == {k: raw[key][k] for k in space.VLLM_KEYS}, m
    # The one pick of a file vLLM reads for bf16 that is outside our space: E=128,N=2880 at key 512.
    cfg, _ = B.vllm_pick(t, 500, 128, 2880)
    assert not B.in_space(cfg, "bf16", "sm90") and B.in_space(B.vllm_pick(t, 256, 128, 2880)[0], "bf16", "sm90")
    outside = [(en, m) for en, tab in t.items() for m, c in tab.items() if not B.in_space(c, "bf16", "sm90")]
    assert outside == [((128, 2880), 512)]


# -- scores, layers, report -------------------------------------------------------------------

# One MoE layer, E = 8, top_k = 2, I = 96, hidden = 128 at three (M, routing): per stage
# {candidate: p50}. Model picks are marked by MODEL.
LAYERS = {
    (1, "balanced"): ({A: 10.0, C: 8.0, D: 12.0, X: 9.0}, {A: 6.0, C: 7.0, D: 5.0, X: 5.5}),
    (40, "zipf"): ({B_: 20.0, D: 18.0, C: 25.0, X: 30.0}, {B_: 12.0, D: 14.0, C: 11.0, X: 20.0}),
    (5000, "balanced"): ({F: 100.0, D: 120.0}, {F: 60.0, D: 50.0}),
}
MODEL = {(1, "balanced"): (X, D), (40, "zipf"): (D, C), (5000, "balanced"): (F, D)}


def _frame():
    rows = []
    for (m, routing), stages in LAYERS.items():
        for stage, (n, k), times in zip(("gate_up", "down"), ((192, 128), (128, 96)), stages):
            for cid, t in times.items():
                cfg = space.config_from_id(cid)
                rows.append(dict(op="moe", gpu_name=H100, arch="sm90", dtype="bf16", m=m, n=n, k=k, e=8, top_k=2,
                                 stage=stage, routing=routing, candidate=cid, variant=cfg.variant, p50_us=t,
                                 status="ok", eval_shape=True, family="fam", origins="fam/Fam/tp1",
                                 **space.config_params(cfg)))
    return pd.DataFrame(rows)


def _with_shape_cols(ps, ev):
    """per_shape's table with the MoE shape columns (joined from ev if per_shape has none yet)."""
    cols = [c for c in ("e", "top_k", "stage", "routing") if c not in ps.columns]
    return ps.join(ev.drop_duplicates("sid").set_index("sid")[cols]) if cols else ps


def _results(ev, scores):
    frames = [_with_shape_cols(E.per_shape(ev, sc), ev).assign(method=name, fold="fam")
              for name, sc in scores.items()]
    return pd.concat(frames).reset_index(names="sid")


def _model_score(ev):
    want = {}
    for sid, g in ev.groupby("sid"):
        r = g.iloc[0]
        want[sid] = MODEL[(int(r["m"]), r["routing"])][0 if r["stage"] == "gate_up" else 1]
    hit = ev["candidate"].to_numpy() == ev["sid"].map(want).to_numpy()
    return np.where(hit, 0.0, ev["p50_us"].to_numpy())


def _scores(ev):
    """The op's baselines scored as the evaluation scores them (its picks, via _pick_score)."""
    return {m: E._pick_score(ev, w) for m, w in B.picks(ev, ev.iloc[:0]).items()}


def test_scores_pick_vllms_configs(moe_op, vllm_dir):
    ev = E.eval_rows(_frame())
    assert ev["sid"].nunique() == 6
    sc = _scores(ev)
    assert set(sc) == {"vllm_default", "vllm_tuned"}
    picks = {}
    for name, s in sc.items():
        ps = _with_shape_cols(E.per_shape(ev, s), ev)
        picks[name] = {(int(r.m), r.routing, r.stage): r.pick for r in ps.itertuples()}
    assert picks["vllm_default"] == {(1, "balanced", "gate_up"): A, (1, "balanced", "down"): A,
                                     (40, "zipf", "gate_up"): B_, (40, "zipf", "down"): B_,
                                     (5000, "balanced", "gate_up"): F, (5000, "balanced", "down"): F}
    # vLLM's tuned file: one config per M for both stages (keys 1 and 64). At M = 5000 the nearest
    # key (4096) holds a config outside our space: the evaluation's fallback (the heuristic's pick,
    # nearest vLLM's default) stands in, and the report leaves the shape out.
    assert picks["vllm_tuned"] == {(1, "balanced", "gate_up"): C, (1, "balanced", "down"): C,
                                   (40, "zipf", "gate_up"): D, (40, "zipf", "down"): D,
                                   (5000, "balanced", "gate_up"): F, (5000, "balanced", "down"): F}
    vp = B.vllm_picks(ev)
    assert len(vp) == 6 and set(vp["tuned_source"]) == {"tuned"}
    assert sorted(vp.loc[~vp["tuned_in_space"], "m"]) == [5000, 5000]


def test_scores_without_vllms_files_has_the_default_only(moe_op, tmp_path, monkeypatch):
    monkeypatch.setenv(B.ENV_VLLM_DIR, str(tmp_path / "none"))
    ev = E.eval_rows(_frame())
    assert set(_scores(ev)) == {"vllm_default"}
    assert E.op_of(ev).name == "moe"


def test_layer_table_and_report(moe_op, vllm_dir):
    ev = E.eval_rows(_frame())
    scores = {"model": _model_score(ev), "oracle": ev["p50_us"].to_numpy(), **_scores(ev)}
    res = _results(ev, scores)
    lay = B.layer_table(res, ev).set_index("m")
    assert len(lay) == 3
    assert list(lay["n_pair"]) == ["192x128 / 128x96"] * 3
    # Whole-layer times by hand: gate_up + down of each method's picks.
    cols = ["model_us", "oracle_us", "vllm_default_us", "vllm_tuned_us"]
    assert lay.loc[1, cols].tolist() == [14.0, 13.0, 16.0, 15.0]
    assert lay.loc[40, cols].tolist() == [29.0, 29.0, 32.0, 32.0]
    assert lay.loc[5000, ["model_us", "oracle_us", "vllm_default_us"]].tolist() == [150.0, 150.0, 160.0]
    # The best single config for both stages: X at M = 1 (9 + 5.5), B or D at 40, F at 5000.
    assert lay["oracle_one_config_us"].tolist() == [14.5, 32.0, 160.0]
    assert lay["model_one_config"].tolist() == [False, False, False]
    assert (lay["vllm_tuned_gate_up"] == lay["vllm_tuned_down"]).all()

    c = B.comparison(res)
    assert (len(c["outside"]), len(c["unmeasured"])) == (2, 0)
    assert c["layers"]["tuned_ok"].tolist() == [True, True, False]
    st = c["stage"].set_index("shapes")
    # Per stage, all 6 shapes: model 9/8 on one shape, exact elsewhere.
    assert st.loc["all", "n"] == 6 and st.loc["all", "tuned n"] == 4
    assert st.loc["all", "model vs oracle"] == pytest.approx((9 / 8) ** (1 / 6))
    assert st.loc["all", "vLLM default vs oracle"] == pytest.approx(
        (10 / 8 * 6 / 5 * 20 / 18 * 12 / 11 * 100 / 100 * 60 / 50) ** (1 / 6))
    assert st.loc["all", "vLLM tuned vs oracle"] == pytest.approx((8 / 8 * 7 / 5 * 18 / 18 * 14 / 11) ** (1 / 4))
    assert st.loc["stage down", "n"] == 3 and st.loc["routing skewed", "n"] == 2
    assert st.loc["routing skewed", "model speedup vs vLLM tuned"] == pytest.approx(math.sqrt(18 / 18 * 14 / 11))
    ly = c["layer"].set_index("shapes")
    assert ly.loc["all", "n"] == 3 and ly.loc["all", "tuned n"] == 2
    assert ly.loc["all", "model vs oracle"] == pytest.approx((14 / 13) ** (1 / 3))
    assert ly.loc["all", "model speedup vs vLLM default"] == pytest.approx((16 / 14 * 32 / 29 * 160 / 150) ** (1 / 3))
    assert ly.loc["all", "model speedup vs vLLM tuned"] == pytest.approx(math.sqrt(15 / 14 * 32 / 29))
    assert ly.loc["routing balanced", "n"] == 2 and ly.loc["M >1024", "n"] == 1
    # The test's families are training families: no held-out group (empty groups are left out).
    assert set(ly.index) == {"all", "training families (vLLM-tuned E, N)", "routing balanced", "routing skewed",
                             "M 1-16", "M 17-64", "M >1024"}

    md = B.report_section(res)
    assert "### Per stage" in md and "### Per layer (gate_up + down)" in md
    assert "2 shapes whose tuned pick is outside our space, 0 whose tuned pick has no ok row" in md
    assert "down 5000x128x96 E8 balanced -> moe_m32n64k256_g1_w4s5" in md
    assert "6 of 6 stage shapes have a vLLM tuned file" in md
    assert "one config for both stages on 0 of 3 layers" in md


def test_report_without_shape_columns_says_so():
    md = B.report_section(pd.DataFrame({"method": ["model"], "m": [1]}))
    assert "lack the columns" in md and "stage" in md


def test_report_without_vllms_files(moe_op, tmp_path, monkeypatch):
    monkeypatch.setenv(B.ENV_VLLM_DIR, str(tmp_path / "none"))
    ev = E.eval_rows(_frame())
    res = _results(ev, {"model": _model_score(ev), "oracle": ev["p50_us"].to_numpy(), **_scores(ev)})
    md = B.report_section(res)
    assert "No vLLM-tuned results" in md and "### Per layer" in md
    assert "vLLM tuned vs oracle" not in md


def test_acceptance_groups_split_held_out_families_by_routing_and_dtype():
    # Issue 17's targets are per routing class; with two dtypes each dtype gets its own group too,
    # so one dtype's worst case is visible on its own. Hand-built layer frame: 2 held-out rows per
    # (dtype, routing class) and one training-family row.
    frame = pd.DataFrame({
        "dtype": ["bf16", "bf16", "bf16", "fp8", "fp8", "fp8", "bf16"],
        "routing": ["balanced", "zipf", "balanced", "balanced", "hot2", "balanced", "balanced"],
        "family": ["gpt-oss-20b", "gpt-oss-20b", "phi-3.5-moe", "gpt-oss-20b", "deepseek-v2", "deepseek-v2",
                   "mixtral-8x7b"],
        "m": [1, 1, 16, 1, 1024, 64, 1],
        "model_us": [1.10, 1.0, 1.0, 1.05, 1.0, 1.0, 1.0],
        "oracle_us": [1.0] * 7,
    })
    groups = dict(B._groups(frame, by_stage=False))
    assert groups["held-out, balanced"].tolist() == [True, False, True, True, False, True, False]
    assert groups["held-out, balanced, bf16"].tolist() == [True, False, True, False, False, False, False]
    assert groups["held-out, skewed, bf16"].tolist() == [False, True, False, False, False, False, False]
    assert groups["held-out, balanced, fp8"].tolist() == [False, False, False, True, False, True, False]
    assert groups["held-out, skewed, fp8"].tolist() == [False, False, False, False, True, False, False]
    assert groups["training families (vLLM-tuned E, N)"].tolist() == [False] * 6 + [True]
    rows = {r["shapes"]: r for r in B._summary(frame, B._groups(frame, by_stage=False), "oracle_us")}
    assert rows["held-out, balanced, bf16"]["model worst vs oracle"] == pytest.approx(1.10)
    assert rows["held-out, balanced, bf16"]["model vs oracle"] == pytest.approx(math.sqrt(1.10))
    assert rows["held-out, balanced, fp8"]["model worst vs oracle"] == pytest.approx(1.05)
    # One dtype: no per-dtype groups (they would repeat the routing groups).
    one = dict(B._groups(frame[frame["dtype"] == "bf16"], by_stage=False))
    assert not any(label.endswith(", bf16") for label in one)
