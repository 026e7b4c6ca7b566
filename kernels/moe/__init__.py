"""Fused mixture-of-experts (MoE) layer: E experts, top-k routing (registry op ``moe``)."""
