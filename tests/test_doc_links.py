"""Every relative link in the README, docs/ and the benchmarks/ READMEs resolves to a committed file
or folder (issue 56: results and explore scripts were pruned and renamed; a link must not dangle).
Web links and same-page anchors are skipped; a link's own #anchor is dropped before the check."""
from __future__ import annotations

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^()\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def _pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    pages += glob.glob(os.path.join(ROOT, "benchmarks", "**", "README.md"), recursive=True)
    return sorted(p for p in pages if os.path.isfile(p))


def _dangling(page):
    text = CODE.sub("", open(page, encoding="utf-8").read())
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not path:
            continue
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), path))):
            out.append(target)
    return out


@pytest.mark.data
@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    assert _dangling(page) == [], f"{os.path.relpath(page, ROOT)}: links to missing files"
