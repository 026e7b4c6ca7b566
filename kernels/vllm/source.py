"""Where vLLM is: its installed package (for the folders it reads tuned files from) and its source
(a wheel, an unpacked folder, or the installed package) for the loader test and its kernels.
Torch-free; nothing of vLLM is imported (``importlib.util.find_spec`` locates the package without
running it: importing vLLM loads CUDA extensions this project does not need).

vLLM 0.33.0 reads tuned files from (read in its source):

- fused MoE (``fused_moe.py``, ``get_moe_configs``): the folder of the environment variable
  ``VLLM_TUNED_CONFIG_FOLDER`` first, then the package's ``model_executor/layers/fused_moe/configs/``;
- w8a8 block-fp8 linear (``fp8_utils.py``, ``get_w8a8_block_fp8_configs``): only the package's
  ``model_executor/layers/quantization/utils/configs/`` (``VLLM_TUNED_CONFIG_FOLDER`` is not read).
"""
from __future__ import annotations

import importlib.util
import os
import re
import zipfile

from .names import KIND_BLOCK_FP8, KIND_MOE, KINDS

# The variable vLLM reads for user MoE configs (vLLM's name, not ours: we read it to install
# where that vLLM will look).
VLLM_TUNED_CONFIG_FOLDER = "VLLM_TUNED_CONFIG_FOLDER"
# A vLLM source for the loader test and the kernels: a wheel file or a folder holding ``vllm/``.
ENV_SRC = "COSTMODEL_VLLM_SRC"
# The folder ``python -m gemm_costmodel.benchmarks.vllm_compare prepare`` writes by default (git-ignored),
# looked for in the current folder when COSTMODEL_VLLM_SRC is not set: a GPU host that carries it
# measures vLLM's kernels (``costmodel bench --op vllm_moe`` in the repository root) without setting
# anything.
DEFAULT_SRC_DIR = ".vllm_src"

# Folders of the package (relative to the folder holding vllm's __init__.py).
PACKAGE_CONFIG_DIRS = {
    KIND_MOE: os.path.join("model_executor", "layers", "fused_moe", "configs"),
    KIND_BLOCK_FP8: os.path.join("model_executor", "layers", "quantization", "utils", "configs"),
}
# The source files the loader test and the kernels read (paths inside a wheel / above ``vllm/``).
FUSED_MOE_PY = "vllm/model_executor/layers/fused_moe/fused_moe.py"
FP8_UTILS_PY = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
PLATFORM_UTILS_PY = "vllm/utils/platform_utils.py"
FUSED_MOE_UTILS_PY = "vllm/model_executor/layers/fused_moe/utils.py"
SOURCE_FILES = (FUSED_MOE_PY, FP8_UTILS_PY, PLATFORM_UTILS_PY, FUSED_MOE_UTILS_PY)


def installed_package_dir() -> str | None:
    """The folder of the ``vllm`` package this Python would import, or None (not installed)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def install_dir(kind: str, package_dir: str | None = None, environ=None) -> str:
    """The folder the installed vLLM reads ``kind`` files from (see the module's docstring).
    ``package_dir``: the vllm package folder (default: the installed one). ValueError when the
    folder cannot be known (no vLLM and, for MoE, no VLLM_TUNED_CONFIG_FOLDER)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    env = os.environ if environ is None else environ
    if kind == KIND_MOE and env.get(VLLM_TUNED_CONFIG_FOLDER):
        return env[VLLM_TUNED_CONFIG_FOLDER]
    pkg = package_dir or installed_package_dir()
    what = "fused-MoE" if kind == KIND_MOE else "block-fp8 linear"
    if pkg is None:
        extra = f" or set {VLLM_TUNED_CONFIG_FOLDER} (vLLM reads MoE files there first)" if kind == KIND_MOE else ""
        raise ValueError(f"--install: no vLLM is installed in this Python, so the folder vLLM reads {what} files "
                         f"from is unknown; give --vllm-package DIR (the vllm package folder of the Python that "
                         f"runs vLLM){extra}, or write them with --out DIR")
    if not os.path.isfile(os.path.join(pkg, "__init__.py")):
        raise ValueError(f"--vllm-package {pkg}: not a vllm package folder (no __init__.py)")
    return os.path.join(pkg, PACKAGE_CONFIG_DIRS[kind])


class Source:
    """Read-only access to vLLM's source files by their path inside a wheel (``vllm/...``)."""

    def __init__(self, where: str):
        self.where = where
        self._zip = zipfile.ZipFile(where) if os.path.isfile(where) else None
        self.root = None  # the folder holding vllm/ (None for a wheel)
        if self._zip is None:
            root = where
            # A folder holding vllm/, or the vllm package folder itself.
            if os.path.isfile(os.path.join(where, "__init__.py")) and os.path.basename(os.path.normpath(where)) == "vllm":
                root = os.path.dirname(os.path.normpath(where))
            self.root = root

    def read(self, path: str) -> str:
        if self._zip is not None:
            return self._zip.read(path).decode("utf-8")
        with open(os.path.join(self.root, *path.split("/")), encoding="utf-8") as fh:
            return fh.read()

    def has(self, path: str) -> bool:
        if self._zip is not None:
            return path in self._zip.namelist()
        return os.path.isfile(os.path.join(self.root, *path.split("/")))

    def version(self) -> str | None:
        """vLLM's version from its generated ``vllm/_version.py``, else None."""
        return self._version_field("__version__")

    def commit(self) -> str | None:
        """vLLM's commit id from ``vllm/_version.py`` (e.g. 'g4ba787ec9'), else None."""
        return self._version_field("__commit_id__")

    def _version_field(self, name: str) -> str | None:
        try:
            text = self.read("vllm/_version.py")
        except (OSError, KeyError):
            return None
        m = re.search(rf"^{re.escape(name)}\s*=.*?['\"]([^'\"]+)['\"]", text, re.M)
        return m.group(1) if m else None

    def __repr__(self) -> str:
        return f"Source({self.where!r})"


def find_source(where: str | None = None) -> tuple[Source | None, str]:
    """(Source, '') for ``where``, else COSTMODEL_VLLM_SRC, else a ``.vllm_src`` folder in the current
    folder (DEFAULT_SRC_DIR), else the installed vllm package; or (None, the reason) when none has
    vLLM's fused_moe.py."""
    tried = []
    env = os.environ.get(ENV_SRC)
    default = DEFAULT_SRC_DIR if not env and os.path.isdir(DEFAULT_SRC_DIR) else None
    for label, cand in (("argument", where), (ENV_SRC, env), (f"./{DEFAULT_SRC_DIR}", default),
                        ("installed vllm", installed_package_dir())):
        if not cand:
            continue
        if not os.path.exists(cand):
            tried.append(f"{label} {cand}: no such file or folder")
            continue
        try:
            src = Source(cand)
        except zipfile.BadZipFile:
            tried.append(f"{label} {cand}: not a wheel (zip) file")
            continue
        if not src.has(FUSED_MOE_PY):
            tried.append(f"{label} {cand}: no {FUSED_MOE_PY}")
            continue
        return src, ""
    why = "; ".join(tried) if tried else "none given"
    return None, (f"no vLLM source ({why}): set {ENV_SRC} to a vLLM wheel or a folder holding vllm/ "
                  f"(pip download vllm==0.33.0 --no-deps), make ./{DEFAULT_SRC_DIR} from a wheel "
                  "(python -m gemm_costmodel.benchmarks.vllm_compare prepare --wheel WHEEL), or install vllm")
