"""The package layout (issue 14): serving is light at import, the old top-level aliases are
gone (issue 56), and serving never imports data or learning."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

SERVING_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "costmodel", "serving")
HEAVY = ("torch", "triton", "pandas", "xgboost", "sklearn")


@pytest.mark.parametrize("module", ["serving.runtime", "serving.candidates", "serving.features", "kernels.hardware",
                                    "kernels.gemm.heuristic"])
def test_serving_imports_nothing_heavy(module):
    code = (f"import sys, gemm_costmodel.{module}; "
            f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules); "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["runtime", "ops", "triton_adapter", "hardware"])
def test_deprecated_alias_is_gone(name):
    # Issue 56 removed the top-level aliases; the API lives in gemm_costmodel.serving only.
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"gemm_costmodel.{name}")


def test_public_runtime_api_unchanged():
    from gemm_costmodel.serving.runtime import (Choice, DispatchWarning,  # noqa: F401
                                                Dispatcher, default_dispatcher, rank,
                                                select)


def _imported_modules(path: str) -> set[str]:
    """Absolute module names imported anywhere in a source file (function bodies included)."""
    tree = ast.parse(open(path).read(), filename=path)
    pkg = "gemm_costmodel.serving"
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against gemm_costmodel.serving
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


def test_serving_never_imports_data_or_learning():
    files = [f for f in os.listdir(SERVING_DIR) if f.endswith(".py")]
    assert "runtime.py" in files
    bad = {}
    for f in files:
        hits = sorted(m for m in _imported_modules(os.path.join(SERVING_DIR, f))
                      if m.startswith(("gemm_costmodel.data", "gemm_costmodel.learning")))
        if hits:
            bad[f] = hits
    assert not bad, bad
