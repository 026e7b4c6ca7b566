"""Deprecated alias of gemm_costmodel.serving.hardware (kept for the public API).

The same module object as gemm_costmodel.serving.hardware (so monkeypatching either name
patches both); new code should import gemm_costmodel.serving.hardware.
"""
import sys

from gemm_costmodel.serving import hardware as _m

sys.modules[__name__] = _m
