"""Compiling an op's Triton launches for sm90 (the H200) on the CPU, without a GPU: shared by the
tests/test_*_sm90_compile.py files.

A launch goes through the op's own path with a stand-in driver that reports an sm90 target
(``Sm90Driver``) and Triton's compile hook, which records the launch's signature, constexprs and
specialisation instead of compiling and launching it (``recording``); ``compile_ttgir`` compiles
the record to TTGIR (where the layout passes run) or a later stage ("cubin": all of them, with
Triton's bundled ptxas). The suite runs under TRITON_INTERPRET=1, whose triton.language helpers
cannot be compiled in the same process, so a test compiles in a child process (``run_child``).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys


def no_cuda_backend() -> str:
    """'' when this Triton can compile for a CUDA target, else why not."""
    try:
        from triton.backends import backends
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as exc:  # pragma: no cover - triton is a dependency
        return f"no Triton compiler ({exc})"
    return "" if "nvidia" in backends else "this Triton has no CUDA backend (needed to compile for sm90)"


class Sm90Driver:
    """Triton's driver stand-in: an sm90 CUDA device, without one. Nothing is launched (the compile
    hook stops every launch first), so device-made tensor descriptors need no allocator here: the
    workspace Triton asks ``triton.set_allocator``'s allocator for is allocated at launch only."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def recording(kernels):
    """Launches of the Triton kernels named in ``kernels`` (a name or a collection of names)
    recorded, not compiled nor run: [(JITFunction, its compile arguments)]. Every other Triton
    launch is skipped too (only the sizes of its outputs can reach the recorded kernels)."""
    from triton import knobs
    from triton.runtime import driver

    names = {kernels} if isinstance(kernels, str) else set(kernels)
    got = []

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if fn.name in names:
            got.append((fn.jit_function, compile))
        return True  # skip compiling (and so launching)

    old_active = driver._active
    driver.set_active(Sm90Driver())
    try:
        with knobs.runtime.scope():
            knobs.runtime.jit_cache_hook = hook
            yield got
    finally:
        driver._active = old_active


def compile_ttgir(jit_fn, args, until: str = "ttgir") -> dict:
    """Compile one recorded launch for sm90 through TTGIR (the layout passes; ``until`` a later
    stage, "cubin" for all of them with Triton's ptxas); raises Triton's error (RuntimeError
    'PassManager::run failed') when a pass fails. Returns the compile's metadata (from "llir" on,
    its "shared": the bytes of shared memory a launch needs)."""
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource, make_backend

    target = Sm90Driver().target
    src = ASTSource(jit_fn, args["signature"], args["constants"], args["configs"][0])
    backend = make_backend(target)
    opts = backend.parse_options({k: args[k] for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion",
                                                        "launch_cooperative_grid")})
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    mod = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx)
    meta = {"hash": "sm90-check", "target": target, **opts.__dict__}
    for ext, stage in stages.items():
        mod = stage(mod, meta)
        if ext == until:
            return meta
    raise ValueError(f"no compile stage {until!r}; this Triton's: {list(stages)}")


def first_line(exc: Exception) -> str:
    """A compile error's first line (its type where it has no message)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def run_child(script: str, *argv: str, timeout: int = 600):
    """Run ``python script *argv`` without TRITON_INTERPRET and return the JSON its stdout's last
    line holds (the child prints MLIR's dumps and its progress to stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, script, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


NO_BACKEND_REASON = no_cuda_backend()
