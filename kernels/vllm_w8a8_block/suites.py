"""Shape suites of the op ``vllm_w8a8_block`` (torch-free): the fp8_blockscale op's, so the families, the
(N, K) pairs, the M grids and the held-out split are the same.

- ``train``, ``eval``, ``gate``: the fp8_blockscale op's suites (``kernels/fp8_blockscale/suites.py``);
- ``eval_core``: the evaluation problems a first campaign measures in full (``EVAL_CORE``, in priority
  order: a campaign takes the first few with ``--limit``). vLLM's kernel compiles per config for each
  class of M, N, K and ceil(K / 128) (``space.specialisation``), so the first six share one compile
  key: M a multiple of 16, N and K multiples of 16, ceil(K / 128) neither 1 nor a multiple of 16; they
  span six families (one problem each), vLLM-tuned (N, K) (DeepSeek-V3's, which Llama-3.1's 4096x7168 and Yi-1.5's
  4608x7168 share) and untuned ones, decode to prefill. The next two are M = 1 (a second key).
"""
from __future__ import annotations

from ..fp8_blockscale import suites as FS
from ..shapes import Shape

# (M, N, K) in priority order.
EVAL_CORE = (
    (16, 2112, 7168), (16, 5120, 8960), (512, 4096, 7168), (512, 3072, 5120), (4096, 17920, 1536),
    (64, 4608, 7168), (1, 2112, 7168), (1, 5120, 8960),
)


def training_suite(dtype: str = "fp8") -> list[Shape]:
    return FS.training_suite(dtype)


def eval_suite(dtype: str = "fp8") -> list[Shape]:
    return FS.eval_suite(dtype)


def eval_core_suite(dtype: str = "fp8") -> list[Shape]:
    """``EVAL_CORE``'s problems with the origins of their (N, K) (so their family), in its order."""
    pairs = FS._pairs()
    return [Shape(m, n, k, dtype, tuple(pairs[(n, k)])) for m, n, k in EVAL_CORE]


def gate_suite(dtype: str = "fp8") -> list[Shape]:
    return FS.gate_suite(dtype)


SUITES = {"train": training_suite, "eval": eval_suite, "eval_core": eval_core_suite, "gate": gate_suite}
