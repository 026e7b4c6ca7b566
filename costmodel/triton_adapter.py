"""Deprecated alias of gemm_costmodel.serving.triton_adapter (kept for the public API).

The same module object as gemm_costmodel.serving.triton_adapter (so monkeypatching either name
patches both); new code should import gemm_costmodel.serving.triton_adapter.
"""
import sys

from gemm_costmodel.serving import triton_adapter as _m

sys.modules[__name__] = _m
