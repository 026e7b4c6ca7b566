"""The cost model and runtime (folder costmodel/, imported as ``gemm_costmodel``).

Data: shapes, dataset, importers, datacard, health. Model: features, hardware,
model, evaluate, report, export, pipeline. Runtime: runtime (``Dispatcher``),
candidates, heuristic, ops (torch custom ops), triton_adapter. cli.py is the
``costmodel`` command; util.py holds small helpers the benchmarks share.
"""
