"""Every GPU campaign file's sweep lines are `costmodel bench` arguments that parse, for an op and a
suite the registry has, and every file a line names (a pick CSV, an --only shape list) is committed:
a typo found here costs nothing, found on the GPU host it costs a lease's minutes."""
from __future__ import annotations

from pathlib import Path

import pytest

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import vllm_picks as VP
from gemm_costmodel.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGNS = sorted((ROOT / "benchmarks" / "campaigns").glob("*.txt"))


@pytest.mark.parametrize("path", CAMPAIGNS, ids=lambda p: p.name)
def test_campaign_lines_parse_and_name_committed_files(path):
    parser = build_parser()
    for name, args in VP.campaign_lines(str(path)):
        a = parser.parse_args(["bench", "--name", name, *args])
        spec = registry.get(a.op)
        if getattr(a, "shapes", None):  # the shapes come from a CSV; --suite only labels the rows
            assert (ROOT / a.shapes).is_file(), f"{path.name}: {name}: no {a.shapes}"
        else:
            assert a.suite in spec.suites, f"{path.name}: {name}: op {a.op} has no suite {a.suite!r}"
        for d in a.dtype or []:
            assert d in spec.dtypes, f"{path.name}: {name}: op {a.op} has no dtype {d!r}"
        if a.mode.startswith("pick:"):
            assert (ROOT / a.mode[5:]).is_file(), f"{path.name}: {name}: no {a.mode[5:]}"
        if getattr(a, "only", None):
            assert (ROOT / a.only).is_file(), f"{path.name}: {name}: no {a.only}"


def test_campaign_lines_skip_shell_lines(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("# note\n\n!peers python3 -m x --suite heldout\nsweep --op gemm --suite train\n")
    assert VP.campaign_lines(str(f)) == [("sweep", ["--op", "gemm", "--suite", "train"])]
