"""vLLM's own config-lookup functions, run without importing vLLM (torch-free).

Importing vLLM pulls its CUDA extensions and most of its code; its lookup functions need none of
that. ``load`` reads vLLM's source (``source.Source``: a wheel, an unpacked folder, or the installed
package), takes the definitions of the named functions with ``ast``, and runs them in a namespace
of small stand-ins for what they use: ``envs`` (VLLM_TUNED_CONFIG_FOLDER, VLLM_BATCH_INVARIANT),
``logger`` (records its messages), ``current_platform`` (the GPU name and compute capability given)
and the standard modules. Imports inside a taken function (``from vllm... import x``) are dropped
and ``x`` comes from the namespace. A function that uses a name the namespace lacks raises
``LoaderError`` naming it: vLLM changed, and the stand-ins must follow.

Each vLLM module's ``__file__`` is set under ``package_root`` (a folder laid out as vLLM's, e.g. a
test's temp folder or a real site-packages), so the functions look for their package files there.
Nothing of vLLM is copied into this repository: it is read where the user has it.
"""
from __future__ import annotations

import ast
import builtins
import functools
import json
import os
import re
from types import SimpleNamespace

from . import source as S

# Functions taken per source file (only those whose names exist in that vLLM's file).
MOE_FUNCTIONS = ("get_config_file_name", "get_moe_configs", "get_default_config", "try_get_optimal_moe_config",
                 "should_moe_wna16_use_cuda")
FP8_FUNCTIONS = ("get_w8a8_block_fp8_configs",)
PLATFORM_FUNCTIONS = ("get_device_name_as_file_name",)
MOE_UTILS_FUNCTIONS = ("enable_swap_ab",)


class LoaderError(RuntimeError):
    """vLLM's source does not hold what the loader expects (a function, or a name it stands in for)."""


class Logger:
    """vLLM's logger stand-in: keeps (level, message) pairs."""

    def __init__(self):
        self.records: list[tuple[str, str]] = []

    def _log(self, level, msg, *args, **_kw):
        self.records.append((level, msg % args if args else msg))

    def info(self, msg, *a, **kw):
        self._log("info", msg, *a, **kw)

    def warning(self, msg, *a, **kw):
        self._log("warning", msg, *a, **kw)

    def debug(self, msg, *a, **kw):
        self._log("debug", msg, *a, **kw)

    info_once, warning_once, debug_once = info, warning, debug

    def messages(self, level: str | None = None) -> list[str]:
        return [m for lv, m in self.records if level is None or lv == level]


class Platform:
    """vLLM's ``current_platform`` stand-in: a CUDA GPU of the given name and compute capability."""

    def __init__(self, gpu_name: str, capability: tuple[int, int] = (9, 0)):
        self.gpu_name, self.capability = gpu_name, tuple(capability)

    def get_device_name(self, device_id: int = 0) -> str:
        return self.gpu_name

    def get_device_capability(self, device_id: int = 0):
        return self.capability

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return self.capability == capability
        return self.capability[0] * 10 + self.capability[1] == capability

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return self.capability >= capability
        return self.capability[0] * 10 + self.capability[1] >= capability

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False


def _next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (int(n) - 1).bit_length()


def functions_of(text: str, names, path: str = "") -> dict[str, ast.FunctionDef]:
    """The top-level function definitions of ``names`` present in a source text."""
    tree = ast.parse(text, filename=path)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}


def _strip_vllm_imports(fn: ast.FunctionDef) -> list[str]:
    """Drop ``from vllm... import`` statements inside fn (anywhere in its body); returns the names
    they bound (the namespace must hold them)."""
    bound = []

    class Strip(ast.NodeTransformer):
        def visit_ImportFrom(self, node):
            if node.module and (node.module == "vllm" or node.module.startswith("vllm.")):
                bound.extend(a.asname or a.name for a in node.names)
                return ast.Pass()
            return node

    Strip().visit(fn)
    return bound


def free_names(fn: ast.FunctionDef) -> set[str]:
    """Names fn reads that it neither binds nor takes (its globals and builtins)."""
    bound, loads = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.arguments):
            for a in node.posonlyargs + node.args + node.kwonlyargs + [node.vararg, node.kwarg]:
                if a is not None:
                    bound.add(a.arg)
        elif isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not fn and isinstance(node, ast.FunctionDef):
            bound.add(node.name)
    return loads - bound


def exec_functions(text: str, names, namespace: dict, path: str, required=()) -> dict:
    """Run the definitions of ``names`` from a source text in ``namespace`` (which they then use as
    their globals); returns namespace. LoaderError: a required function missing, or a free name
    the namespace and builtins lack."""
    found = functions_of(text, names, path)
    missing = [n for n in required if n not in found]
    if missing:
        raise LoaderError(f"{path}: no function {', '.join(missing)} (another vLLM version?)")
    for name, fn in found.items():
        for b in _strip_vllm_imports(fn):
            if b not in namespace:
                raise LoaderError(f"{path}: {name} imports {b} from vLLM, which the loader does not stand in for")
        lacking = sorted(n for n in free_names(fn) if n not in namespace and n not in found
                         and not hasattr(builtins, n))
        if lacking:
            raise LoaderError(f"{path}: {name} uses {', '.join(lacking)}, which the loader does not stand in for")
        mod = ast.Module(body=[fn], type_ignores=[])
        ast.fix_missing_locations(mod)
        exec(compile(mod, path, "exec"), namespace)  # noqa: S102 - vLLM's own function, read from its source
    return namespace


def load(src: "S.Source", gpu_name: str, package_root: str, tuned_config_folder: str | None = None,
         capability: tuple[int, int] = (9, 0), batch_invariant: bool = False) -> SimpleNamespace:
    """vLLM's lookup functions for a GPU, reading package files under ``package_root`` (the folder
    holding ``vllm/``). Attributes: the functions named above that this vLLM has, ``logger``
    (a Logger), ``platform`` (the Platform), ``envs``."""
    logger = Logger()
    platform = Platform(gpu_name, capability)
    envs = SimpleNamespace(VLLM_TUNED_CONFIG_FOLDER=tuned_config_folder, VLLM_BATCH_INVARIANT=batch_invariant,
                           VLLM_TRITON_USE_TD=None)
    common = {"__builtins__": builtins, "functools": functools, "json": json, "os": os, "re": re,
              "cache": functools.cache, "lru_cache": functools.lru_cache, "Any": object,
              "envs": envs, "logger": logger, "current_platform": platform,
              "next_power_of_2": _next_power_of_2}

    def module_ns(path):
        ns = dict(common)
        ns["__file__"] = os.path.join(package_root, *path.split("/"))
        ns["__name__"] = path[:-3].replace("/", ".")
        return ns

    plat = exec_functions(src.read(S.PLATFORM_UTILS_PY), PLATFORM_FUNCTIONS, module_ns(S.PLATFORM_UTILS_PY),
                          S.PLATFORM_UTILS_PY, required=PLATFORM_FUNCTIONS)
    utils = exec_functions(src.read(S.FUSED_MOE_UTILS_PY), MOE_UTILS_FUNCTIONS, module_ns(S.FUSED_MOE_UTILS_PY),
                           S.FUSED_MOE_UTILS_PY, required=MOE_UTILS_FUNCTIONS)
    shared = {"get_device_name_as_file_name": plat["get_device_name_as_file_name"],
              "enable_swap_ab": utils["enable_swap_ab"],
              # try_get_optimal_moe_config's override (vLLM's override_config context): none.
              "get_config": lambda: None}
    moe_ns = module_ns(S.FUSED_MOE_PY)
    moe_ns.update(shared)
    moe = exec_functions(src.read(S.FUSED_MOE_PY), MOE_FUNCTIONS, moe_ns, S.FUSED_MOE_PY,
                         required=("get_config_file_name", "get_moe_configs", "get_default_config",
                                   "try_get_optimal_moe_config"))
    fp8_ns = module_ns(S.FP8_UTILS_PY)
    fp8_ns.update(shared)
    fp8 = exec_functions(src.read(S.FP8_UTILS_PY), FP8_FUNCTIONS, fp8_ns, S.FP8_UTILS_PY, required=FP8_FUNCTIONS)
    out = {n: moe[n] for n in MOE_FUNCTIONS if n in moe}
    out.update({n: fp8[n] for n in FP8_FUNCTIONS}, get_device_name_as_file_name=plat["get_device_name_as_file_name"],
               enable_swap_ab=utils["enable_swap_ab"], logger=logger, platform=platform, envs=envs)
    return SimpleNamespace(**out)


def kernel_parameters(src: "S.Source", path: str, kernel: str) -> list[str]:
    """The parameter names of a (Triton) function of vLLM's source: what a config's keys may name."""
    fn = functions_of(src.read(path), (kernel,), path).get(kernel)
    if fn is None:
        raise LoaderError(f"{path}: no function {kernel}")
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
