"""Shared fixtures of the CPU test suite.

Triton kernels run through the interpreter on CPU tensors. The interpreter is
chosen when triton is first imported, so the environment variable must be set
before anything (torch included) can import triton.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from gemm_costmodel.benchmarks import correctness as C  # noqa: E402
from gemm_costmodel.kernels.gemm.space import Problem  # noqa: E402

DEVICE = "cpu"


@pytest.fixture(autouse=True, scope="session")
def _interpreter_only():
    """Guard: the suite is CPU-only and must never take the compiled Triton path."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "TRITON_INTERPRET=1 must be set before triton is imported"
    yield


@pytest.fixture
def device():
    return DEVICE


def operands_for(m: int, n: int, k: int, dtype: str, seed: int = 0):
    """(problem, operands, fp32 reference) of a small problem on the CPU."""
    prob = Problem(m, n, k, dtype)
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(C.seed_for(prob, seed))
    ops = C.make_operands(prob, DEVICE, gen)
    return prob, ops, C.reference(ops)


@pytest.fixture
def make_problem():
    """Factory fixture: make_problem(m, n, k, dtype) -> (problem, operands, reference)."""
    return operands_for


PROVENANCE = {
    "gpu_name": "FakeGPU H0",
    "gpu_uuid": "GPU-00000000-test",
    "sm_count": 4,
    "driver": "0.0-test",
    "l2_bytes": 1 << 20,
    "arch": "sm90",
    "git_sha": "deadbeefcafe",
    "torch_version": "test-torch",
    "triton_version": "test-triton",
    "hostname": "ci-host",
}


@pytest.fixture
def provenance():
    return dict(PROVENANCE)
