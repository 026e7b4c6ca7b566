"""The shipped models (folder models/, package data of ``gemm_costmodel.models``).

``<op>-<arch>.onnx`` with its manifest ``.json`` (and the ``-latency`` companion),
which the runtime loads; report/ is the held-out evaluation report (not installed).
"""
