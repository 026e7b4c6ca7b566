"""Measurement (folder benchmarks/, imported as ``gemm_costmodel.benchmarks``).

correctness.py (the gate), harness.py and store.py (resumable sweeps, their row files;
the CUDA-graph timer is kernels/timing.py, shared with serving's unsure mode), precompile.py, summary.py, provenance.py; the
standing benchmarks and acceptance runs (dispatch_*, foundation_acceptance,
reliability, remeasure, vendor_probe, cublaslt). Outputs in results/; one-off
explorations in benchmarks/explore/ (not installed).
"""
