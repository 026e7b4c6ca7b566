"""`costmodel export-vllm`: vLLM tuned-config files (w8a8 block fp8) from the dispatcher's picks.

The dispatcher has no fp8_blockscale model here (an empty model folder), so its fallback rule
decides; a stub dispatcher covers the model's ranking (the best-ranked tiled config wins).
Files are checked the way vLLM reads them: its file name, JSON with int M keys, six int
values per entry, and the nearest-M lookup."""
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from gemm_costmodel.kernels.vllm import tables
from gemm_costmodel.cli import main as cli_main
from gemm_costmodel.kernels.fp8_blockscale import space as S
from gemm_costmodel.learning import vllm_export as V
from gemm_costmodel.serving.runtime import Choice, Dispatcher

GPU = "NVIDIA H100 80GB HBM3"
VLLM_DIR = Path(tables.tables_dir(tables.KIND_BLOCK_FP8))  # vLLM 0.33.0's tables, kept in the repository
# vLLM's name of a w8a8 block-fp8 config file (written independently of V.FILE_NAME_RE).
VLLM_NAME = re.compile(r"^N=(\d+),K=(\d+),device_name=(\S+),dtype=fp8_w8a8,block_shape=\[128,128\]\.json$")
VLLM_KEYS = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"]
# Two (N, K) pairs vLLM ships no tuned file for (Qwen2.5-7B-like MLP and attention shapes).
PAIRS = [(5120, 8960), (3072, 5120)]

pytestmark = pytest.mark.filterwarnings("ignore::gemm_costmodel.serving.runtime.DispatchWarning")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("no_models"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, models_dir):
    """(out dir, stdout, stderr) of one CLI export of PAIRS."""
    out = tmp_path_factory.mktemp("vllm")
    argv = ["export-vllm", "--op", "fp8_blockscale", "--gpu", GPU, "--models", models_dir, "--out", str(out)]
    for n, k in PAIRS:
        argv += ["--nk", f"{n},{k}"]
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        rc = cli_main(argv)
    assert rc == 0, se.getvalue()
    return out, so.getvalue(), se.getvalue()


def _vllm_files():
    return sorted(VLLM_DIR.glob("N=*.json")) if VLLM_DIR.is_dir() else []


def _load_like_vllm(path) -> dict:
    """vLLM's loader: JSON object, keys converted to int."""
    with open(path, encoding="utf-8") as fh:
        return {int(key): val for key, val in json.load(fh).items()}


def _nearest(configs: dict, m: int) -> dict:
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


def test_the_grid_is_vllms():
    assert list(V.VLLM_M_GRID) == sorted(V.VLLM_M_GRID)
    files = [p for p in _vllm_files() if "NVIDIA_H100_80GB_HBM3" in p.name]
    assert files, "vLLM's tables belong in the repository (datasets/vllm/)"
    for p in files:
        assert [int(m) for m in json.loads(p.read_text())] == list(V.VLLM_M_GRID), p.name


def test_file_name_is_vllms():
    name = V.file_name(5120, 8960, GPU)
    assert name == "N=5120,K=8960,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert VLLM_NAME.match(name) and V.FILE_NAME_RE.match(name)
    assert V.file_name(1, 2, "NVIDIA H200") == \
        "N=1,K=2,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    for p in _vllm_files():  # every name vLLM ships matches both patterns
        assert VLLM_NAME.match(p.name) and V.FILE_NAME_RE.match(p.name), p.name


def test_cli_writes_one_vllm_file_per_pair(exported):
    out, stdout, _ = exported
    if _vllm_files():
        shipped = {(int(a), int(b)) for a, b, _ in (VLLM_NAME.match(p.name).groups() for p in _vllm_files())}
        assert not set(PAIRS) & shipped  # shapes vLLM has no tuned file for
    names = sorted(p.name for p in out.iterdir() if VLLM_NAME.match(p.name))
    assert names == sorted(V.file_name(n, k, GPU) for n, k in PAIRS)
    for name in names:
        n, k, dev = VLLM_NAME.match(name).groups()
        assert (int(n), int(k)) in PAIRS and dev == "NVIDIA_H100_80GB_HBM3"
    # Beside them only the sidecar (vLLM opens its files by exact name).
    assert {p.name for p in out.iterdir()} == set(names) | {V.SIDECAR}
    lines = stdout.strip().splitlines()
    assert len(lines) == len(PAIRS)
    for line, (n, k) in zip(lines, PAIRS):
        assert line.startswith(str(out / V.file_name(n, k, GPU)) + ": 18 M keys: 0 from the model, "), line
        assert "from the fallback rule" in line and "vLLM's default" in line


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_file_body_is_vllms_format_and_feasible(exported, pair):
    out, _, _ = exported
    n, k = pair
    path = out / V.file_name(n, k, GPU)
    text = path.read_text(encoding="utf-8")
    raw = json.loads(text)
    assert text == json.dumps(raw, indent=4) + "\n"  # written as vLLM's tuning script writes them
    assert list(raw) == [str(m) for m in V.VLLM_M_GRID]  # string keys, ascending numerically
    for key, entry in raw.items():
        assert list(entry) == VLLM_KEYS, key
        assert all(type(v) is int for v in entry.values()), (key, entry)
        cfg = S.from_vllm(entry)
        assert S.to_vllm(cfg) == entry
        ok, why = S.check_feasible(cfg, S.Problem(int(key), n, k, "fp8"))
        assert ok, (key, cfg.id, why)
    # vLLM's lookup: int keys, the nearest M for one not in the file.
    configs = _load_like_vllm(path)
    assert sorted(configs) == list(V.VLLM_M_GRID)
    for m in (1, 3, 20, 40, 100, 200, 700, 5000, 100000):
        got = _nearest(configs, m)
        want = min(V.VLLM_M_GRID, key=lambda x: abs(x - m))
        assert got == raw[str(want)], m
        assert S.check_feasible(S.from_vllm(got), S.Problem(m, n, k, "fp8"))[0]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_entries_are_the_dispatchers_tiled_picks_else_vllms_default(exported, models_dir, pair):
    out, _, _ = exported
    n, k = pair
    raw = json.loads((out / V.file_name(n, k, GPU)).read_text())
    side = json.loads((out / V.SIDECAR).read_text())
    assert side["format"] == V.SIDECAR_FORMAT
    rec = side["files"][V.file_name(n, k, GPU)]
    assert (rec["op"], rec["gpu_name"], rec["n"], rec["k"], rec["model"]) == ("fp8_blockscale", GPU, n, k, None)
    d = Dispatcher(gpu_name=GPU, models_dir=models_dir, op="fp8_blockscale")
    counts = {"model": 0, "rule": 0, "default": 0}
    for m in V.VLLM_M_GRID:
        ranked = d.rank(m, n, k, "fp8", count=10_000)
        tiled = [c for c in ranked if isinstance(S.config_from_id(c.candidate), S.BsTiledConfig)]
        if tiled:
            want, source = S.config_from_id(tiled[0].candidate), "rule"
            assert tiled[0].source == "heuristic"
        else:
            want, source = S.vllm_default(), "default"
        assert S.from_vllm(raw[str(m)]) == want, m
        assert rec["m"][str(m)] == {"candidate": want.id, "source": source}
        counts[source] += 1
    assert rec["counts"] == counts
    # The fallback rule picks split-K for decode here, a tiled config for prefill.
    assert counts["default"] > 0 and counts["rule"] > 0


class _StubDispatcher:
    """A dispatcher whose 'model' ranks a fixed list (the real one needs a trained model)."""

    op = "fp8_blockscale"
    space_arch = "sm90"
    gpu_name = GPU

    def __init__(self, ranked):
        self.ranked = ranked
        self.calls = []

    def rank(self, m, n, k, dtype, count=8):
        self.calls.append((m, n, k, dtype, count))
        return [Choice(c, "model") for c in self.ranked][:count]


def test_pick_takes_the_best_ranked_tiled_config_of_the_models_ranking():
    ranked = ["bsswapab_m16n64k128_s2_w4s3", "cublas", "bssplitk_m16n64k128_s2_w4s3",
              "bstiled_m16n64k128_g1_w4s4", "bstiled_m64n128k128_g32_w4s3"]
    d = _StubDispatcher(ranked)
    cfg, source = V.pick(d, 8, 5120, 8960)
    assert (cfg.id, source) == ("bstiled_m16n64k128_g1_w4s4", "model")
    # The whole ranking was asked for: every candidate of the space.
    assert d.calls[-1][3] == "fp8" and d.calls[-1][4] == len(S.generate_configs("sm90", "fp8"))
    table = V.build_table(d, 5120, 8960)
    assert table.counts() == {"model": len(V.VLLM_M_GRID), "rule": 0, "default": 0}
    assert all(e == S.to_vllm(S.config_from_id("bstiled_m16n64k128_g1_w4s4")) for e in table.entries.values())


def test_pick_without_a_tiled_config_is_vllms_default():
    d = _StubDispatcher(["bsswapab_m16n64k128_s2_w4s3", "cublas"])
    assert V.pick(d, 4, 3072, 5120) == (S.vllm_default(), "default")


def test_pick_passes_over_a_gemv_pick_at_m1():
    # The M = 1 GEMV is no vLLM config: its entry is the best-ranked tiled config after it.
    d = _StubDispatcher(["bsgemv_n4k1024_w4", "bsswapab_m16n64k128_s2_w4s3", "bstiled_m16n64k128_g1_w4s4"])
    assert V.pick(d, 1, 7168, 2048) == (S.config_from_id("bstiled_m16n64k128_g1_w4s4"), "model")


class _SplitModel:
    """A loaded model's manifest only: what ranking_m reads."""

    path = "models/fp8_blockscale-sm90.onnx"

    def __init__(self, split_m):
        self.manifest = {"hyperparameters": {"split_m": split_m}, "onnx_sha256": "0" * 64}


class _SplitStub(_StubDispatcher):
    """A stub whose model has decode trees of its own for M <= split_m: it ranks a tiled config
    that is a poor one first at those M (as such trees may: they only order the GEMVs)."""

    def __init__(self, split_m):
        super().__init__([])
        self.split_m = split_m

    def model_for(self, dtype):
        return _SplitModel(self.split_m)

    def rank(self, m, n, k, dtype, count=8):
        self.calls.append((m, n, k, dtype, count))
        first = "bstiled_m256n32k128_g1_w4s5" if m <= self.split_m else "bstiled_m16n64k128_g1_w8s5"
        return [Choice(c, "model") for c in ("bsgemv_n4k1024_w4", first, "bstiled_m64n128k128_g32_w4s3")][:count]


def test_keys_at_or_below_split_m_take_the_tiled_order_of_split_m_plus_one(tmp_path):
    """vLLM's M = 1 key is ranked at M = 2 when the model's decode trees are M = 1's alone: below
    BLOCK_SIZE_M 16 a tiled config runs the same programs at M = 1 and 2, and the decode trees
    leave the tiled configs unordered. The sidecar says which keys were ranked elsewhere."""
    d = _SplitStub(1)
    assert [V.ranking_m(d, m) for m in (1, 2, 3, 16)] == [2, 2, 3, 16]
    table = V.build_table(d, 3072, 5120)
    good = S.config_from_id("bstiled_m16n64k128_g1_w8s5")
    assert S.from_vllm(table.entries["1"]) == good and table.ranked_at == {1: 2}
    assert all(c[0] != 1 for c in d.calls)  # M = 1 itself was never ranked
    side = json.loads(Path(V.write_sidecar([table], d, str(tmp_path))).read_text())["files"][table.file_name]
    assert side["m"]["1"] == {"candidate": good.id, "source": "model", "ranked_at_m": 2}
    assert side["m"]["2"] == {"candidate": good.id, "source": "model"}
    # split_m 4: keys 1-4 ranked at 5 (still below BLOCK_SIZE_M 16).
    assert [V.ranking_m(_SplitStub(4), m) for m in (1, 4, 5)] == [5, 5, 5]
    # A split at or above the smallest BLOCK_SIZE_M: the tiled programs differ, M is ranked as it is.
    assert [V.ranking_m(_SplitStub(16), m) for m in (1, 16)] == [1, 16]
    # No split (or no model): every key ranked at its own M.
    assert [V.ranking_m(_SplitStub(0), m) for m in (1, 2)] == [1, 2]
    assert V.ranking_m(_StubDispatcher([]), 1) == 1


def test_sidecar_keeps_earlier_exports(tmp_path, models_dir, capsys):
    out = tmp_path / "o"
    for pair in ("256,7168", "512,1024"):
        assert cli_main(["export-vllm", "--nk", pair, "--models", models_dir, "--out", str(out)]) == 0
    side = json.loads((out / V.SIDECAR).read_text())
    assert set(side["files"]) == {V.file_name(256, 7168, GPU), V.file_name(512, 1024, GPU)}
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def assert_one_line_error(rc, capsys, *needles):
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("costmodel: error:"), err
    for n in needles:
        assert n in err, (n, err)


@pytest.mark.parametrize("case", ["op", "nk_form", "nk_zero", "nk_three", "models", "no_nk", "no_out", "gpu"])
def test_bad_inputs_exit_non_zero_with_one_line(tmp_path, models_dir, capsys, case):
    out = str(tmp_path / "o")
    argv = {"op": ["--op", "gemm", "--nk", "64,64"],
            "nk_form": ["--nk", "5120x8960"],
            "nk_zero": ["--nk", "0,128"],
            "nk_three": ["--nk", "1,2,3"],
            "models": ["--nk", "64,64", "--models", str(tmp_path / "missing")],
            "no_nk": [],
            "no_out": ["--nk", "64,64"],
            "gpu": ["--nk", "64,64", "--gpu", "Made Up GPU 9000"]}[case]
    if case != "models":
        argv += ["--models", models_dir]
    if case != "no_out":
        argv += ["--out", out]
    needles = {"op": ["export-vllm supports --op fp8_blockscale", "'gemm'"],
               "nk_form": ["'5120x8960'", "expected N,K"], "nk_zero": ["'0,128'", "expected N,K"],
               "nk_three": ["expected N,K"], "models": [str(tmp_path / "missing"), "no such directory"],
               "no_nk": ["--nk N,K"], "no_out": ["--out"], "gpu": ["'Made Up GPU 9000'", "candidate space"]}[case]
    rc = cli_main(["export-vllm", *argv])
    assert_one_line_error(rc, capsys, *needles)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


# -- the fused-MoE files (op moe) -------------------------------------------------------------

from gemm_costmodel.kernels.moe import space as MS  # noqa: E402

MOE_DIR = Path(tables.tables_dir(tables.KIND_MOE))
# vLLM's name of a fused-MoE config file (get_config_file_name; written independently of
# V.MOE_FILE_NAME_RE): E, N, device, optional dtype, optional block shape.
VLLM_MOE_NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]+?)(?:,dtype=([^,]+?))?"
                           r"(?:,block_shape=\[(\d+),\s*(\d+)\])?\.json$")
# Mixtral-8x7B at TP2: E = 8, N = I = 7168, hidden 4096, top 2.
MIX = V.MoeSpec(8, 7168, 4096, 2)
A, B_, C = "moe_m16n64k128_g1_w4s4", "moe_m32n64k128_g1_w4s3", "moe_m64n128k64_g1_w4s3"


def test_moe_file_name_is_vllms():
    name = V.moe_file_name(8, 7168, GPU)
    assert name == "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert V.moe_file_name(8, 7168, GPU, "fp16") == name  # vLLM names no dtype for bf16 / fp16
    fp8 = V.moe_file_name(64, 640, "NVIDIA H200", "fp8")
    assert fp8 == "E=64,N=640,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    for n in (name, fp8):
        mv, mo = VLLM_MOE_NAME.match(n), V.MOE_FILE_NAME_RE.match(n)
        assert mv and mo and (mo.group("e"), mo.group("n"), mo.group("device"), mo.group("dtype")) == mv.groups()[:4]
    with pytest.raises(ValueError, match="dtypes"):
        V.moe_file_name(8, 7168, GPU, "int8")
    files = sorted(MOE_DIR.glob("E=*.json")) if MOE_DIR.is_dir() else []
    for p in files:  # every name vLLM ships parses the same way with both patterns
        mv, mo = VLLM_MOE_NAME.match(p.name), V.MOE_FILE_NAME_RE.match(p.name)
        assert mv and mo, p.name
        assert (mo.group("e"), mo.group("n"), mo.group("device"), mo.group("dtype")) == mv.groups()[:4], p.name
        assert bool(mo.group("block")) == bool(mv.group(5)), p.name
        if not mv.group(4) and not mv.group(5) and "H100" in p.name:
            assert V.moe_file_name(int(mv.group(1)), int(mv.group(2)), GPU) == p.name


def test_moe_grid_is_vllms():
    from gemm_costmodel.kernels.moe import suites

    assert V.VLLM_M_GRID == suites.VLLM_M_GRID
    files = [p for p in (sorted(MOE_DIR.glob("E=*NVIDIA_H100_80GB_HBM3.json")) if MOE_DIR.is_dir() else [])]
    assert files, "vLLM's tables belong in the repository (datasets/vllm/)"
    grids = [[int(m) for m in json.loads(p.read_text()) if m.isdigit()] for p in files]
    assert sum(g == list(V.VLLM_M_GRID) for g in grids) >= len(files) - 3  # all but E=1, E=32 (one key), E=64,N=1536


class _MoeStub:
    """A dispatcher whose 'model' ranks fixed lists per stage: {stage: [(candidate, predicted_us)]}."""

    op = "moe"
    space_arch = "sm90"
    gpu_name = GPU

    def __init__(self, ranked, source="model"):
        self.ranked, self.source, self.calls = ranked, source, []

    def rank(self, m, n, k, dtype="bf16", count=8, e=1, top_k=1, **fields):
        self.calls.append(dict(m=m, n=n, k=k, dtype=dtype, count=count, e=e, top_k=top_k, **fields))
        ranked = self.ranked[fields["stage"]]
        return [Choice(c, self.source, t, None if t is None else float(t)) for c, t in ranked][:count]

    def model_for(self, dtype):
        return None


def _load_moe(path) -> dict:
    """vLLM's loader (keys converted to int)."""
    with open(path, encoding="utf-8") as fh:
        return {int(key): val for key, val in json.load(fh).items()}


def test_moe_pick_minimises_the_layers_predicted_time(tmp_path):
    # Alone, gate_up's best is A and down's best is C; for the layer B wins (2 + 1.5 < 1 + 4, 5 + 1).
    d = _MoeStub({"gate_up": [(A, 1.0), ("grouped_mm", 0.5), (B_, 2.0), (C, 5.0)],
                  "down": [(C, 1.0), (B_, 1.5), (A, 4.0), ("tiled_m128n128k64_g8_w4s3", 0.1)]})
    cfg, source, detail = V.moe_pick(d, 16, MIX)
    assert (cfg.id, source) == (B_, "model")
    assert detail == {"combine": "latency", "predicted_us": {"gate_up": 2.0, "down": 1.5}}
    # Both stages were ranked in full, with the stage's (N, K), E, top_k and balanced routing.
    count = len(MS.generate_configs("sm90", "bf16"))
    assert d.calls == [dict(m=16, n=14336, k=4096, dtype="bf16", count=count, e=8, top_k=2, stage="gate_up",
                            routing="balanced"),
                       dict(m=16, n=4096, k=7168, dtype="bf16", count=count, e=8, top_k=2, stage="down",
                            routing="balanced")]
    written = V.export_moe([MIX, (64, 640, 3584, 8)], str(tmp_path), dispatcher=d)
    assert [p for p, _ in written] == [str(tmp_path / V.moe_file_name(8, 7168, GPU)),
                                       str(tmp_path / V.moe_file_name(64, 640, GPU))]
    path, table = written[0]
    text = open(path, encoding="utf-8").read()
    raw = json.loads(text)
    assert text == json.dumps(raw, indent=4) + "\n"
    assert list(raw) == [str(m) for m in V.VLLM_M_GRID]
    for key, entry in raw.items():
        assert list(entry) == VLLM_KEYS and all(type(v) is int for v in entry.values())
        assert MS.from_vllm(entry).id == B_
    assert table.counts() == {"model": 18, "rule": 0, "default": 0}
    configs = _load_moe(path)
    for m in (3, 20, 100, 5000):
        assert configs[min(configs, key=lambda x: abs(x - m))] == raw[str(min(V.VLLM_M_GRID, key=lambda x: abs(x - m)))]
    side = json.loads((tmp_path / V.SIDECAR).read_text())["files"][V.moe_file_name(8, 7168, GPU)]
    assert {k: side[k] for k in ("op", "e", "n", "hidden", "top_k", "dtype", "routing", "model")} == \
        {"op": "moe", "e": 8, "n": 7168, "hidden": 4096, "top_k": 2, "dtype": "bf16", "routing": "balanced",
         "model": None}
    assert "hidden size 4096 and top_k 2" in side["note"] and "E and N only" in side["note"]
    assert side["m"]["16"] == {"candidate": B_, "source": "model", "combine": "latency",
                               "predicted_us": {"gate_up": 2.0, "down": 1.5}}
    line = V.summary_line(path, table)
    assert "18 from the model" in line and "gate_up 14336x4096, down 4096x7168" in line and "top_k 2" in line


def test_moe_pick_without_latencies_sums_ranking_positions():
    # Positions: A 0 + 2, B 1 + 0, C 2 + 1: B.
    d = _MoeStub({"gate_up": [(A, None), (B_, None), (C, None)], "down": [(B_, None), (C, None), (A, None)]})
    cfg, source, detail = V.moe_pick(d, 64, MIX)
    assert (cfg.id, source, detail) == (B_, "model", {"combine": "rank", "predicted_us": None})
    # The fallback rule's one pick per stage: the gate_up pick wins a tie (0 + 1 = 1 + 0).
    d = _MoeStub({"gate_up": [(A, None)], "down": [(C, None)]}, source="heuristic")
    cfg, source, detail = V.moe_pick(d, 64, MIX)
    assert (cfg.id, source, detail["combine"]) == (A, "rule", "rank")


def test_moe_pick_without_a_tiled_config_is_vllms_default():
    d = _MoeStub({"gate_up": [("grouped_mm", 1.0)], "down": [("grouped_mm", 1.0)]})
    for m in (1, 33, 97, 513):
        cfg, source, detail = V.moe_pick(d, m, MIX)
        assert (cfg, source, detail["combine"]) == (MS.vllm_default(m, 8), "default", "none")
    assert V.moe_pick(d, 97, MIX, "fp8")[0].id == "moe_m64n128k128_g1_w4s3"


def test_moe_rank_without_stage_keywords():
    class Old(_MoeStub):
        def rank(self, m, n, k, dtype="bf16", count=8, e=1, top_k=1):
            self.calls.append((m, n, k))
            return [Choice(A, "model", 1.0)]

    d = Old({})
    assert V.moe_pick(d, 8, MIX)[0].id == A and d.calls == [(8, 14336, 4096), (8, 4096, 7168)]


@pytest.mark.skipif("moe" not in __import__("gemm_costmodel.registry").registry.names(), reason="no moe op yet")
def test_moe_export_with_the_real_dispatcher_and_no_model(tmp_path, models_dir):
    written = V.export_moe([MIX], str(tmp_path), gpu_name=GPU, models_dir=models_dir)
    (path, table), = written
    raw = json.loads(open(path, encoding="utf-8").read())
    assert table.counts()["model"] == 0
    cfgs = set(MS.generate_configs("sm90", "bf16"))
    for key, entry in raw.items():
        cfg = MS.from_vllm(entry)
        assert cfg in cfgs, (key, cfg.id)  # every exported config maps into our space
        # Without a model, the fallback rule is vLLM's default (in our space: picked exactly).
        assert table.picks[int(key)][1] in ("rule", "default")
        assert cfg == MS.vllm_default(int(key), 8), key


def test_moe_and_block_fp8_exports_share_the_sidecar(tmp_path, models_dir):
    d = _MoeStub({"gate_up": [(A, 1.0)], "down": [(A, 1.0)]})
    V.export_moe([MIX], str(tmp_path), dispatcher=d)
    assert cli_main(["export-vllm", "--nk", "256,7168", "--models", models_dir, "--out", str(tmp_path)]) == 0
    side = json.loads((tmp_path / V.SIDECAR).read_text())
    assert set(side["files"]) == {V.moe_file_name(8, 7168, GPU), V.file_name(256, 7168, GPU)}
    assert side["files"][V.file_name(256, 7168, GPU)]["op"] == "fp8_blockscale"


@pytest.mark.parametrize("text, needle", [("8,7168,4096", "expected E,N,K,TOPK"), ("8x7168x4096x2", "E,N,K,TOPK"),
                                          ("8,7168,4096,0", "top_k must be a positive int"),
                                          ("2,7168,4096,4", "top_k (4) must be <= E (2)"),
                                          ("1024,64,64,2", "E must be <= 512")])
def test_moe_spec_parsing(text, needle):
    with pytest.raises(ValueError) as exc:
        V.parse_moe_spec(text)
    assert needle in str(exc.value) and repr(text) in str(exc.value)


def test_moe_spec_ok_and_export_refusals(tmp_path):
    assert V.parse_moe_spec(" 8, 7168,4096 ,2") == MIX
    d = _MoeStub({"gate_up": [(A, 1.0)], "down": [(A, 1.0)]})
    with pytest.raises(ValueError, match="E and N only"):
        V.export_moe([MIX, (8, 7168, 5120, 2)], str(tmp_path), dispatcher=d)
    with pytest.raises(ValueError, match="at least one"):
        V.export_moe([], str(tmp_path), dispatcher=d)
    with pytest.raises(ValueError, match="int8"):
        V.export_moe([MIX], str(tmp_path), dtype="int8", dispatcher=d)
    with pytest.raises(ValueError, match="no such directory"):
        V.export_moe([MIX], str(tmp_path), models_dir=str(tmp_path / "missing"), dispatcher=d)
    d.space_arch = None
    with pytest.raises(ValueError, match="no moe candidate space"):
        V.export_moe([MIX], str(tmp_path), dispatcher=d)
    # The block-fp8 entry point refuses moe, naming the way to export it; the op check takes it.
    V.check_op("moe")
    with pytest.raises(ValueError, match="--moe E,N,K,TOPK"):
        V.export([(64, 64)], str(tmp_path), op="moe")
    assert not any(tmp_path.iterdir())


def _cli_has_moe() -> bool:
    from gemm_costmodel.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return any("--moe" in a.option_strings for a in sub.choices["export-vllm"]._actions)


def test_cli_export_vllm_op_moe(tmp_path, models_dir, capsys):
    if not _cli_has_moe():
        pytest.skip("the CLI has no export-vllm --moe yet")
    out = tmp_path / "o"
    argv = ["export-vllm", "--op", "moe", "--moe", "8,7168,4096,2", "--moe", "128,384,4096,8", "--models", models_dir,
            "--out", str(out)]
    assert cli_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [V.moe_file_name(8, 7168, GPU), V.moe_file_name(128, 384, GPU)]
    assert [line.split(": ")[0] for line in lines] == [str(out / n) for n in names]
    assert {p.name for p in out.iterdir()} == set(names) | {V.SIDECAR}
    for name in names:
        for key, entry in json.loads((out / name).read_text()).items():
            assert list(entry) == VLLM_KEYS and MS.from_vllm(entry) in set(MS.generate_configs("sm90", "bf16"))
    assert cli_main([*argv[:5], "--dtype", "fp8", "--models", models_dir, "--out", str(out)]) == 0
    assert (out / V.moe_file_name(8, 7168, GPU, "fp8")).is_file()
    capsys.readouterr()
    for bad, needle in ((["--op", "moe", "--nk", "64,64"], "not --nk"), (["--op", "moe"], "--moe E,N,K,TOPK"),
                        (["--moe", "8,7168,4096,2", "--nk", "64,64"], "for --op moe"),
                        (["--op", "moe", "--moe", "8,7168"], "expected E,N,K,TOPK")):
        rc = cli_main(["export-vllm", *bad, "--models", models_dir, "--out", str(tmp_path / "bad")])
        assert_one_line_error(rc, capsys, needle)
    assert not (tmp_path / "bad").exists()


# vLLM 0.33.0's device names per GPU: (fused-MoE file part, block-fp8 file part). Read from vLLM's
# get_device_name_as_file_name and get_config_file_name (tests/test_vllm_loader.py checks this
# list against vLLM's own functions when a vLLM source is present).
DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3"),
    "NVIDIA H100 PCIe": ("NVIDIA_H100_PCIe", "NVIDIA_H100_PCIe"),
    "NVIDIA H100 NVL": ("NVIDIA_H100_NVL", "NVIDIA_H100_NVL"),
    "NVIDIA H200": ("NVIDIA_H200", "NVIDIA_H200"),
    "NVIDIA H200 NVL": ("NVIDIA_H200", "NVIDIA_H200_NVL"),  # MoE files: the H200 family reads H200's
    "NVIDIA GH200 480GB": ("NVIDIA_GH200_480GB", "NVIDIA_GH200_480GB"),  # part 'GH200', not 'H200'
    "NVIDIA H20": ("NVIDIA_H20", "NVIDIA_H20"),
}


@pytest.mark.parametrize("gpu", list(DEVICE_NAMES))
def test_device_names_are_vllms(gpu):
    moe, block = DEVICE_NAMES[gpu]
    assert V.device_name(gpu, V.KIND_MOE) == moe
    assert V.device_name(gpu, V.KIND_BLOCK_FP8) == block
    assert V.moe_file_name(8, 7168, gpu) == f"E=8,N=7168,device_name={moe}.json"
    assert V.file_name(256, 7168, gpu) == f"N=256,K=7168,device_name={block},dtype=fp8_w8a8,block_shape=[128,128].json"


def test_h200_nvl_exports_the_names_vllm_reads(tmp_path, models_dir):
    """--gpu "NVIDIA H200 NVL": the MoE file is H200's (vLLM maps the family), the block-fp8 one the NVL's."""
    gpu = "NVIDIA H200 NVL"
    out = tmp_path / "o"
    assert cli_main(["export-vllm", "--op", "moe", "--moe", "8,7168,4096,2", "--gpu", gpu, "--models", models_dir,
                     "--out", str(out)]) == 0
    assert cli_main(["export-vllm", "--nk", "256,7168", "--gpu", gpu, "--models", models_dir, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {
        "E=8,N=7168,device_name=NVIDIA_H200.json",
        "N=256,K=7168,device_name=NVIDIA_H200_NVL,dtype=fp8_w8a8,block_shape=[128,128].json", V.SIDECAR}
    with pytest.raises(ValueError, match="kind"):
        V.device_name(gpu, "dense")


# -- --install / --dry-run: each kind where vLLM 0.33.0 reads it ------------------------------

MOE_PKG_DIR = ("model_executor", "layers", "fused_moe", "configs")
BLOCK_PKG_DIR = ("model_executor", "layers", "quantization", "utils", "configs")


def _fake_vllm(tmp_path) -> Path:
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    return pkg


def test_install_writes_each_kind_where_vllm_reads_it(tmp_path, models_dir, monkeypatch, capsys):
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    pkg = _fake_vllm(tmp_path)
    base = ["--models", models_dir, "--install", "--vllm-package", str(pkg)]
    assert cli_main(["export-vllm", "--op", "moe", "--moe", "8,7168,4096,2", *base]) == 0
    assert cli_main(["export-vllm", "--nk", "256,7168", *base]) == 0
    moe_dir, block_dir = pkg.joinpath(*MOE_PKG_DIR), pkg.joinpath(*BLOCK_PKG_DIR)
    assert {p.name for p in moe_dir.iterdir()} == {V.moe_file_name(8, 7168, GPU), V.SIDECAR}
    assert {p.name for p in block_dir.iterdir()} == {V.file_name(256, 7168, GPU), V.SIDECAR}
    # With VLLM_TUNED_CONFIG_FOLDER set, MoE files go there (vLLM reads it first); block-fp8 do not.
    user = tmp_path / "user"
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(user))
    assert cli_main(["export-vllm", "--op", "moe", "--moe", "16,3200,4096,2", *base]) == 0
    assert cli_main(["export-vllm", "--nk", "512,7168", *base]) == 0
    assert {p.name for p in user.iterdir()} == {V.moe_file_name(16, 3200, GPU), V.SIDECAR}
    assert V.file_name(512, 7168, GPU) in {p.name for p in block_dir.iterdir()}
    capsys.readouterr()


def test_dry_run_lists_every_file_and_writes_nothing(tmp_path, models_dir, monkeypatch, capsys):
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    pkg = _fake_vllm(tmp_path)
    block_dir = pkg.joinpath(*BLOCK_PKG_DIR)
    block_dir.mkdir(parents=True)
    shipped = block_dir / V.file_name(256, 7168, GPU)  # stands for a tuned file vLLM ships
    shipped.write_text("{}\n")
    argv = ["export-vllm", "--nk", "256,7168", "--nk", "5120,8960", "--models", models_dir, "--install",
            "--vllm-package", str(pkg)]
    assert cli_main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"would write {shipped} ({V.PLAN_FOREIGN})",
                     f"would write {block_dir / V.file_name(5120, 8960, GPU)} ({V.PLAN_NEW})"]
    assert [p.name for p in block_dir.iterdir()] == [shipped.name]
    # Replacing a file no export wrote takes --force; then a later export replaces its own.
    assert cli_main(argv) != 0
    assert "--force" in capsys.readouterr().err and shipped.read_text() == "{}\n"
    assert cli_main([*argv, "--force"]) == 0
    capsys.readouterr()
    assert cli_main([*argv, "--dry-run"]) == 0
    assert all(line.endswith(f"({V.PLAN_EXPORT})") for line in capsys.readouterr().out.strip().splitlines())
    # MoE dry run into VLLM_TUNED_CONFIG_FOLDER.
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "user"))
    assert cli_main(["export-vllm", "--op", "moe", "--moe", "8,7168,4096,2", "--gpu", "NVIDIA H200 NVL", "--install",
                     "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == \
        f"would write {tmp_path / 'user' / 'E=8,N=7168,device_name=NVIDIA_H200.json'} ({V.PLAN_NEW})"
    assert not (tmp_path / "user").exists()


@pytest.mark.parametrize("case", ["no_vllm_block", "no_vllm_moe", "both", "package_without_install", "bad_package"])
def test_install_errors_name_the_way_out(tmp_path, models_dir, monkeypatch, capsys, case):
    from gemm_costmodel.kernels.vllm import source

    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    monkeypatch.setattr(source, "installed_package_dir", lambda: None)
    argv, needles = {
        "no_vllm_block": (["--nk", "256,7168", "--install"], ("no vLLM is installed", "--out DIR", "--vllm-package")),
        "no_vllm_moe": (["--op", "moe", "--moe", "8,7168,4096,2", "--install"],
                        ("no vLLM is installed", "--out DIR", "VLLM_TUNED_CONFIG_FOLDER")),
        "both": (["--nk", "256,7168", "--install", "--out", str(tmp_path)], ("not both",)),
        "package_without_install": (["--nk", "256,7168", "--vllm-package", str(tmp_path), "--out", str(tmp_path)],
                                    ("--vllm-package is for --install",)),
        "bad_package": (["--nk", "256,7168", "--install", "--vllm-package", str(tmp_path)], ("not a vllm package",)),
    }[case]
    assert cli_main(["export-vllm", "--models", models_dir, *argv]) != 0
    err = capsys.readouterr().err
    assert all(n in err for n in needles), err


def test_moe_fp8bs_file_name_is_vllms():
    """Block-scaled fp8 MoE (dtype fp8bs): vLLM 0.33.0's get_config_file_name with block_shape
    [128, 128] (its list printed, spaces dropped); the H200 family reads NVIDIA_H200's files."""
    name = V.moe_file_name(256, 256, GPU, "fp8bs")
    assert name == "E=256,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"
    for gpu in ("NVIDIA H200", "NVIDIA H200 NVL"):
        assert V.moe_file_name(384, 256, gpu, "fp8bs") == \
            "E=384,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    mv, mo = VLLM_MOE_NAME.match(name), V.MOE_FILE_NAME_RE.match(name)
    assert mv and mo and mo.group("block") == "128,128" and mo.group("dtype") == "fp8_w8a8"
    assert V.planned_names("moe", GPU, moe_specs=[V.MoeSpec(256, 256, 7168, 8)], dtype="fp8bs") == [name]


def test_moe_fp8bs_pick_without_a_tiled_config_is_vllms_block_default():
    d = _MoeStub({"gate_up": [("grouped_mm", 1.0)], "down": [("grouped_mm", 1.0)]})
    for m in (1, 8, 16, 64, 65):
        cfg, source, _ = V.moe_pick(d, m, MIX, "fp8bs")
        assert (cfg, source) == (MS.vllm_default(m, 8, "fp8bs"), "default")


def _export_fp8bs_moe(tmp_path, capsys, *extra):
    """`export-vllm --dtype fp8bs` of one MoE layer (E 256, N 256) for the H200: the CLI's line, the
    file's entries as configs (each checked to be of the fp8bs space with its K tile in one 128-column
    scale group) and the file's provenance sidecar entry."""
    assert cli_main(["export-vllm", "--op", "moe", "--dtype", "fp8bs", "--moe", "256,256,7168,8", "--gpu",
                     "NVIDIA H200", *extra, "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out
    path = tmp_path / "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    space = set(MS.generate_configs("sm90", "fp8bs"))
    entries = {key: MS.from_vllm(entry) for key, entry in json.loads(path.read_text()).items()}
    for key, cfg in entries.items():
        assert cfg in space and 128 % cfg.block_k == 0, key
    side = json.loads((tmp_path / V.SIDECAR).read_text())["files"][path.name]
    assert side["dtype"] == "fp8bs"
    return line, entries, side


def test_moe_fp8bs_export_without_a_model_is_the_rule_and_says_so(tmp_path, capsys):
    """Where no model serves fp8bs (here a model folder without any): every entry is the op's
    fallback rule, vLLM's block-fp8 default, in the fp8bs space; the CLI's line says so."""
    empty = tmp_path / "no-models"
    empty.mkdir()
    line, entries, side = _export_fp8bs_moe(tmp_path, capsys, "--models", str(empty))
    assert "no moe model serves fp8bs on NVIDIA H200" in line and "fallback rule" in line
    for key, cfg in entries.items():
        assert cfg == MS.vllm_default(int(key), 256, "fp8bs"), key
    assert side["counts"]["model"] == 0


def test_moe_fp8bs_export_with_the_shipped_model_ranks_and_stays_in_the_space(tmp_path, capsys):
    """The shipped MoE model serves fp8bs (its H200 rows): the export ranks with it, says so, and every
    entry is a config of the fp8bs space whose K tile lies in one 128-column scale group."""
    line, _, side = _export_fp8bs_moe(tmp_path, capsys)
    assert "no moe model serves fp8bs" not in line
    assert side["counts"]["model"] > 0
