"""vLLM's w8a8 block-fp8 linear Triton kernel (``_w8a8_triton_block_scaled_mm``) as a kernel family the
harness measures: vLLM's tuner space (docs/ops/vllm_w8a8_block.md)."""
