"""Every distinct config of vLLM 0.33.0's block-fp8 fused-MoE tuned files for the H100 and the H200
(``dtype=fp8_w8a8,block_shape=[128,128]``: 128x128 weight scales, 1x128 activation scales), as vLLM
launches them: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages).

vLLM's launch caps BLOCK_SIZE_K at the scale block (``min(BLOCK_SIZE_K, min(block_shape))``), so a
file's 256 runs as 128 and is listed so. The files' BLOCK_SIZE_M 8 entries are left out: vLLM runs
them through its Hopper swap-AB path only, and this project's tiled kernel needs an MMA tile of at
least 16 rows (its swap-AB variant covers the decode shapes). Generated from the 13 files in
datasets/vllm/0.33.0/fused_moe_configs/; tests/test_moe_space.py checks it against them.
"""

FP8_BLOCK = (
    (16, 64, 128, 1, 4, 3), (16, 64, 128, 1, 4, 4), (16, 64, 128, 1, 4, 5), (16, 64, 128, 16, 4, 3),
    (16, 64, 128, 32, 4, 3), (16, 128, 128, 1, 4, 2), (16, 128, 128, 1, 4, 3), (16, 128, 128, 1, 4, 4),
    (16, 128, 128, 1, 4, 5), (16, 128, 128, 1, 8, 3), (16, 128, 128, 16, 4, 3),
    (16, 128, 128, 16, 4, 4), (16, 128, 128, 16, 4, 5), (16, 128, 128, 32, 4, 3),
    (16, 128, 128, 32, 4, 5), (16, 128, 128, 64, 4, 2), (16, 128, 128, 64, 4, 3),
    (16, 128, 128, 64, 4, 5), (32, 128, 128, 1, 4, 3), (32, 128, 128, 32, 4, 3),
    (32, 128, 128, 64, 4, 2), (32, 128, 128, 64, 4, 3), (64, 64, 128, 1, 4, 3), (64, 64, 128, 16, 4, 3),
    (64, 64, 128, 32, 4, 3), (64, 64, 128, 64, 4, 3), (64, 128, 128, 1, 4, 3), (64, 128, 128, 1, 4, 4),
    (64, 128, 128, 16, 4, 3), (64, 128, 128, 16, 4, 4), (64, 128, 128, 32, 4, 2),
    (64, 128, 128, 32, 4, 3), (64, 128, 128, 32, 4, 4), (64, 128, 128, 64, 4, 3),
    (64, 128, 128, 64, 4, 4), (64, 256, 128, 32, 8, 3), (128, 64, 128, 16, 4, 3),
)
