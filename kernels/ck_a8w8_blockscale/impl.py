"""No implementation: the CK kernels are AMD GPU code built by AITER. Nothing here launches,
times or checks a kernel (no AMD GPU is lent to this project); the op's rows come from AITER's
published tuning tables (importer.py). Every entry point raises and says so."""
from __future__ import annotations

_WHY = ("ck_a8w8_blockscale is served as a kernel name only: its CK kernels are AITER's and need an AMD "
        "GPU; this project neither launches nor times them (call aiter.gemm_a8w8_blockscale with the name)")
ERROR_BOUNDS: dict = {}


def launch(*args, **kwargs):
    raise NotImplementedError(_WHY)


def make_operands(*args, **kwargs):
    raise NotImplementedError(_WHY)


def reference(*args, **kwargs):
    raise NotImplementedError(_WHY)


def check_operands(*args, **kwargs):
    raise NotImplementedError(_WHY)
