"""Learning: the cost model (model), held-out evaluation (evaluate), the report (report),
ONNX export (export) and the train/evaluate/export job (pipeline).

May import pandas, gemm_costmodel.data and gemm_costmodel.serving; xgboost, scikit-learn,
onnxmltools and matplotlib only lazily (inside the functions that train or export).
"""
