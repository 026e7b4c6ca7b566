"""The block-scaled fp8 GEMM op ``fp8_blockscale`` (vLLM's w8a8 block fp8 linear): ``space``
(torch-free config space and feasibility) and ``impl`` (Triton kernel, quantisation helpers,
reference). Nothing is imported here, so that the space stays torch-free."""
