"""Kernel variants for explorations: a committed Triton kernel recompiled with a changed signature.

``constexpr_copy(kernel, runtime, const)`` writes the kernel's own source, with the argument list
``runtime`` of its signature replaced by ``const`` (typically the same names annotated
``tl.constexpr``), to a temporary module and compiles it from there (Triton reads a kernel's
source from its file, so it cannot come from exec). The body is the committed one, so a timing
difference is the signature's alone. Used by benchmarks/explore/tiled_hints.py (and
once an MoE exploration, in git history) to ask whether compiling N, K and the strides as constants pays.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import tempfile

_HEADER = "import triton\nimport triton.language as tl\n"


def constexpr_copy(kernel, runtime: str, const: str, imports: str = ""):
    """The JIT kernel ``kernel`` (a triton.jit function) with ``runtime`` replaced by ``const`` in
    its source; ``imports``: the lines that bring the helpers its body calls into scope. Raises
    ValueError naming the kernel when ``runtime`` is not in its source."""
    fn = getattr(kernel, "fn", kernel)
    src = inspect.getsource(fn)
    if src.count(runtime) != 1:
        raise ValueError(f"{fn.__name__}: {runtime!r} occurs {src.count(runtime)} times in its source, "
                         "not once (has its signature changed?)")
    folder = tempfile.mkdtemp(prefix="costmodel-kernel-variant-")
    path = os.path.join(folder, f"{fn.__name__}_variant.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_HEADER + imports.rstrip() + "\n\n" + src.replace(runtime, const))
    spec = importlib.util.spec_from_file_location(f"{fn.__name__}_variant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn.__name__)
