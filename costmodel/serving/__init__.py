"""Serving: what runs next to the user's model at dispatch time.

runtime (``Dispatcher``, ``select``, ``rank``), candidates, features,
triton_adapter and ops (the torch custom ops). Imports numpy and onnxruntime only; torch
and triton lazily (ops.py imports torch). Never imports gemm_costmodel.data or .learning.
"""
