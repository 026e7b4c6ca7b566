"""The grouped-GEMM op ``grouped_gemm``: MoE training's expert GEMMs (forward, dgrad, wgrad over G
groups of routed tokens): ``space`` (torch-free), ``impl`` (Triton kernels, reference, operands),
``suites``, ``features``, ``torch_op`` (``grouped_linear``). Nothing is imported here, so that
the space stays torch-free."""
