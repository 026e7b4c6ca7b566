"""Every code example of the user docs runs, on CPU, and prints what the page says it prints.

Covers each ```python and ```bash block of README.md and docs/**/*.md (docs/decisions/ holds
records, not examples). The conventions, which a page follows in its markdown source:

- ``<!-- gpu -->`` on the line before a block: it needs a GPU; skipped with that reason.
- ``<!-- skip: REASON -->`` on the line before a block: skipped with REASON (a pip install, a
  job of minutes such as `costmodel run`, the test suite itself).
- A ```text block right after a code block (blank lines between allowed) is that block's shown
  output: the block's stdout must match it under doctest's rules with ELLIPSIS (``...`` matches
  anything, including several lines) and NORMALIZE_WHITESPACE.

Python blocks of one page run in order in one namespace (a later block may use an earlier one's
names), in this process, with TRITON_INTERPRET=1 (tests/conftest.py): the Triton kernels run in the
interpreter. Bash blocks run in `bash -e` in a scratch folder whose entries link to the repository's
top-level entries, so a command reads the shipped files and writes its new files into the scratch
folder, never into the checkout.
"""
from __future__ import annotations

import contextlib
import doctest
import glob
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(p for p in glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True)
                              if not p.startswith("docs/decisions/"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(gpu|skip:\s*(.+?))\s*-->\s*$")


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason, or None
    want: str | None  # the shown output, or None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    raw, i = [], 0  # (line, lang, body, mark)
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        prev = next((lines[p] for p in range(i - 1, -1, -1) if lines[p].strip()), "")
        mark = MARK.match(prev.strip())
        reason = None if not mark else ("needs a GPU" if mark.group(1) == "gpu" else mark.group(2))
        raw.append((i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n", reason, j))
        i = j + 1
    out = []
    for n, (line, lang, body, reason, end) in enumerate(raw):
        if lang not in ("python", "bash"):
            continue
        want = None
        if n + 1 < len(raw) and raw[n + 1][1] == "text":
            between = lines[end + 1:raw[n + 1][0] - 1]
            if not any(s.strip() for s in between):
                want = raw[n + 1][2]
        out.append(Block(page, line, lang, body, reason, want))
    return out


BLOCKS = [b for p in PAGES for b in blocks_of(p)]
_namespaces: dict[str, dict] = {}


def _check_output(block: Block, got: str) -> None:
    if block.want is None:
        return
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(block.want, got, flags), (
        f"{block.id}: the output differs from the page's\n--- shown:\n{block.want}--- got:\n{got}")


def _scratch(tmp_path) -> str:
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv"):
            os.symlink(os.path.join(ROOT, name), tmp_path / name)
    return str(tmp_path)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example(block: Block, tmp_path, monkeypatch):
    if block.skip:
        pytest.skip(block.skip)
    if block.lang == "python":
        ns = _namespaces.setdefault(block.page, {"__name__": f"example:{block.page}"})
        out = io.StringIO()
        monkeypatch.chdir(_scratch(tmp_path))
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, block.id, "exec"), ns)
        _check_output(block, out.getvalue())
    else:
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               "TRITON_INTERPRET": "1"}
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=_scratch(tmp_path), env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{block.id} exited {res.returncode}\n{res.stdout}\n{res.stderr}"
        _check_output(block, res.stdout)


def test_every_page_has_examples_found():
    """The parser sees the README's blocks (a fence it missed would be an untested example)."""
    assert sum(b.page == "README.md" for b in BLOCKS) >= 5


def test_results_block_is_generated():
    """The README's results table is exactly what `costmodel results --readme` writes from the reports."""
    from gemm_costmodel.learning import glance

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert glance.BEGIN in text, "README.md has no results block"
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        assert glance.rewrite(text) == text, "stale results block: run `costmodel results --readme README.md`"
    finally:
        os.chdir(old)


def test_page_lengths():
    """README <= 250 lines; no markdown file of the repository over 400 (issue 56)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        assert len(fh.read().splitlines()) <= 250
    for p in [*PAGES, *glob.glob("docs/decisions/*.md", root_dir=ROOT)]:
        with open(os.path.join(ROOT, p), encoding="utf-8") as fh:
            n = len(fh.read().splitlines())
        assert n <= 400, f"{p}: {n} lines"
