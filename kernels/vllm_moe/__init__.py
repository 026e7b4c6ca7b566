"""vLLM's fused-MoE Triton kernel (``fused_moe_kernel``, launched as vLLM's ``fused_experts`` runs it) as a
kernel family the harness measures: one config per MoE layer, vLLM's tuner space (docs/ops/vllm_moe.md)."""
