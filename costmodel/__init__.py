"""The cost model and runtime (folder costmodel/, imported as ``gemm_costmodel``).

Sub-packages by concern: ``serving`` (runtime ``Dispatcher``, candidates, features,
hardware, heuristic, ops, triton_adapter: numpy + onnxruntime, torch lazily), ``data``
(shapes, dataset, importers, datacard, health: pandas) and ``learning`` (model, evaluate,
report, export, pipeline: xgboost/sklearn lazily). At the top: registry.py (the op seam),
cli.py (the ``costmodel`` command) and util.py (helpers the benchmarks share). The runtime
API is imported from ``gemm_costmodel.serving.<name>`` (the old top-level aliases are gone,
issue 56).
"""
