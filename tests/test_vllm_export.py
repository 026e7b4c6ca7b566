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

from gemm_costmodel.cli import main as cli_main
from gemm_costmodel.kernels.fp8_blockscale import space as S
from gemm_costmodel.learning import vllm_export as V
from gemm_costmodel.serving.runtime import Choice, Dispatcher

GPU = "NVIDIA H100 80GB HBM3"
VLLM_DIR = Path(__file__).resolve().parents[2] / "shared" / "external" / "vllm_w8a8_block_fp8_configs"
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
    if not files:
        pytest.skip("vLLM's tuned files are not beside the repository")
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
