"""Deprecated alias of gemm_costmodel.kernels.hardware (kept for the public API).

The same module object as gemm_costmodel.kernels.hardware (so monkeypatching either name
patches both); new code should import gemm_costmodel.kernels.hardware.
"""
import sys

from gemm_costmodel.kernels import hardware as _m

sys.modules[__name__] = _m
