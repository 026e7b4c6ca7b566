"""The package's layers point down only (issue 56): every ``gemm_costmodel`` import of every .py
under costmodel/, kernels/ and benchmarks/ (function-level and relative imports included, read
with ast, nothing imported) goes to its own layer or one below it, and the sub-packages form no
cycle. A violation names the file, the line and the rule it breaks."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folders of the installed package and their import names (pyproject's package-dir).
FOLDERS = {"costmodel": "gemm_costmodel", "kernels": "gemm_costmodel.kernels",
           "benchmarks": "gemm_costmodel.benchmarks"}
# Not installed: exploration records (run from their folder), measured results.
SKIP = ("benchmarks/explore/", "benchmarks/results/")

# The layers, bottom first: a module may import its own layer and the layers below it, never one
# above. The bottom holds the op seam (registry: names modules as strings, imports none) and
# helpers of no concern (util, rows: reading the row files), and the packaged model files.
LAYERS = [
    ("base", ("gemm_costmodel", "gemm_costmodel.registry", "gemm_costmodel.util", "gemm_costmodel.rows",
              "gemm_costmodel.models")),
    # The ops' spaces, implementations, suites, baselines and features; the timer; the GPU table.
    ("kernels", ("gemm_costmodel.kernels",)),
    # Dispatch time: numpy + onnxruntime (torch lazily).
    ("serving", ("gemm_costmodel.serving",
                 # deprecated aliases of serving/kernels modules (the same module objects)
                 "gemm_costmodel.ops", "gemm_costmodel.runtime", "gemm_costmodel.triton_adapter",
                 "gemm_costmodel.hardware")),
    # Shard reading, the dataset, importers, data card (pandas).
    ("data", ("gemm_costmodel.data",)),
    # Training, evaluation, reports, export (xgboost, sklearn, onnx lazily).
    ("learning", ("gemm_costmodel.learning",)),
    # The timing harness and its store, measuring on a GPU.
    ("benchmarks", ("gemm_costmodel.benchmarks",)),
    ("adapt", ("gemm_costmodel.adapt",)),
    ("cli", ("gemm_costmodel.cli",)),
]


def layer_of(module: str) -> int:
    """Index in LAYERS of a module: its longest matching prefix."""
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"module {module} is in no layer of tests/test_layers.py: add it to LAYERS")
    return rank


def _module_of(path: pathlib.Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    name = ".".join([FOLDERS[parts[0]]] + parts[1:])
    is_pkg = parts[-1] == "__init__"
    return (name.rsplit(".", 1)[0] if is_pkg else name), is_pkg


def _sources() -> list[pathlib.Path]:
    out = []
    for folder in FOLDERS:
        for p in sorted((ROOT / folder).rglob("*.py")):
            if not str(p.relative_to(ROOT)).startswith(SKIP):
                out.append(p)
    return out


def imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing module, imported module) of every gemm_costmodel import."""
    out = []
    for p in _sources():
        mod, is_pkg = _module_of(p)
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from pkg import name`: the name is a submodule or an attribute of pkg; a
                # submodule that exists is the import, else the package itself.
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    targets.append(sub if _exists(sub) else target)
            for t in targets:
                if t == "gemm_costmodel" or t.startswith("gemm_costmodel."):
                    out.append((str(p.relative_to(ROOT)), node.lineno, mod, t))
    return out


def _exists(module: str) -> bool:
    parts = module.split(".")
    for folder, name in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        np_ = name.split(".")
        if parts[:len(np_)] == np_:
            rest = parts[len(np_):]
            base = ROOT / folder / pathlib.Path(*rest) if rest else ROOT / folder
            return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    return False


def test_rules_are_what_the_report_says():
    assert [name for name, _ in LAYERS] == ["base", "kernels", "serving", "data", "learning", "benchmarks",
                                           "adapt", "cli"]


def test_imports_point_down_only():
    bad = []
    for path, line, src, dst in imports():
        a, b = layer_of(src), layer_of(dst)
        if b > a:
            bad.append(f"{path}:{line}: {src} ({LAYERS[a][0]}) imports {dst} ({LAYERS[b][0]}), a layer above it")
    assert not bad, "\n".join(bad)


def _package(module: str) -> str:
    """The sub-package a module belongs to (gemm_costmodel.kernels.moe for its space); the modules
    at the top of costmodel/ count as packages of their own (gemm_costmodel.cli)."""
    if module.count(".") == 1 and not _is_package(module):
        return module
    return module if _is_package(module) else module.rpartition(".")[0]


def _is_package(module: str) -> bool:
    parts = module.split(".")
    for folder, name in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        np_ = name.split(".")
        if parts[:len(np_)] == np_:
            return (ROOT / folder / pathlib.Path(*parts[len(np_):]) / "__init__.py").is_file()
    return False


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for _, _, src, dst in imports():
        a, b = _package(src), _package(dst)
        if a != b:
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_the_checker_sees_function_level_and_relative_imports():
    found = {(p, dst) for p, _, _, dst in imports()}
    # A relative import inside a function (kernels/moe/baselines.py: `from .. import hardware`).
    assert ("kernels/moe/baselines.py", "gemm_costmodel.kernels.hardware") in found
    assert layer_of("gemm_costmodel.kernels.moe.space") == 1 and layer_of("gemm_costmodel.cli") == 7
