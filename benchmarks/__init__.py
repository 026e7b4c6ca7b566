"""Measurement (folder benchmarks/, imported as ``gemm_costmodel.benchmarks``).

correctness.py (the gate), timing.py (CUDA-graph timer), harness.py and store.py
(resumable sweeps, their row files), precompile.py, summary.py, provenance.py; the
standing benchmarks and acceptance runs (dispatch_*, foundation_acceptance,
reliability, remeasure, vendor_probe, cublaslt). Outputs in results/; one-off
explorations in benchmarks/explore/ (not installed).
"""
