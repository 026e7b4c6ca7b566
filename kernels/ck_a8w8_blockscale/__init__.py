"""AMD CK a8w8 block-scale GEMM op ``ck_a8w8_blockscale`` (AITER's ``gemm_a8w8_blockscale``, the
Composable Kernel path): a kernel *selector* learned from AITER's published tuning tables.

No AMD GPU is lent here: nothing in this folder times or launches a kernel. ``space`` (the
kernel names, the part table, the seed's hand heuristic; stdlib only), ``features`` (numpy),
``importer`` (AITER's tuned/untuned CSVs -> rows with provenance; pandas), ``train`` (held-out
evaluation, the classifier and its ONNX export; xgboost), ``serving`` (the classifier dispatcher;
numpy and onnxruntime only). Nothing is imported here."""
