"""Deprecated alias of gemm_costmodel.serving.runtime (kept for the public API).

The same module object as gemm_costmodel.serving.runtime (so monkeypatching either name
patches both); new code should import gemm_costmodel.serving.runtime.
"""
import sys

from gemm_costmodel.serving import runtime as _m

sys.modules[__name__] = _m
