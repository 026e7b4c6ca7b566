"""The cost model and runtime (folder costmodel/, imported as ``gemm_costmodel``).

Sub-packages by concern: ``serving`` (runtime ``Dispatcher``, candidates, features,
hardware, heuristic, ops, triton_adapter: numpy + onnxruntime, torch lazily), ``data``
(shapes, dataset, importers, datacard, health: pandas) and ``learning`` (model, evaluate,
report, export, pipeline: xgboost/sklearn lazily). At the top: registry.py (the op seam),
cli.py (the ``costmodel`` command), util.py (helpers the benchmarks share), and the
deprecated aliases runtime, ops, triton_adapter, hardware (the same module objects as
``gemm_costmodel.serving.<name>``).
"""
