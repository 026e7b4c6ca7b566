"""Deprecated alias of gemm_costmodel.serving.ops (kept for the public API).

The same module object as gemm_costmodel.serving.ops (so monkeypatching either name
patches both); new code should import gemm_costmodel.serving.ops.
"""
import sys

from gemm_costmodel.serving import ops as _m

sys.modules[__name__] = _m
