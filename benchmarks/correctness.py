"""Correctness gate: a candidate's timing counts only if its output is right.

Right means: every output element was written (the output is poisoned with
NaN before the run) and the relative Frobenius error against an fp32 torch
reference (TF32 off) is under a per-dtype bound.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable

import torch

from ..kernels.gemm.space import GemmConfig, Problem
# The dense GEMM's operands, reference and error bounds live with its kernels (the op
# registry's ``impl``); these names stay importable from here.
from ..kernels.gemm.impl import ERROR_BOUNDS, FP8_MAX, Operands, make_operands  # noqa: F401
# The timer's operand copies live with the timer (serving's unsure mode uses them too).
from ..kernels.timing import timing_copies  # noqa: F401

STATUS_OK = "ok"
STATUS_WRONG = "wrong"
STATUS_COMPILE_ERROR = "compile_error"
STATUS_OUT_OF_RESOURCES = "out_of_resources"
STATUS_CRASH = "crash"  # the process died while running this candidate (twice), or the CUDA context broke
# The device ran out of memory: a state of the process (what earlier candidates left
# reserved), not a property of the config. Such a row is not permanent: a resume
# measures it again, and its shape is no evaluation shape until it does.
STATUS_OUT_OF_MEMORY = "out_of_memory"
# A vendor library refused the problem (e.g. CUBLAS_STATUS_NOT_SUPPORTED): a property of the
# candidate on this problem, and the CUDA context is intact (not a crash).
STATUS_UNSUPPORTED = "unsupported"
STATUSES = (STATUS_OK, STATUS_WRONG, STATUS_COMPILE_ERROR, STATUS_OUT_OF_RESOURCES, STATUS_CRASH,
            STATUS_OUT_OF_MEMORY, STATUS_UNSUPPORTED)
# Failures that are a property of the config on this arch (it does not compile, or
# needs more shared memory or registers than there are): expected, not a health problem.
CONFIG_FAILURES = (STATUS_COMPILE_ERROR, STATUS_OUT_OF_RESOURCES, STATUS_UNSUPPORTED)

def seed_for(problem: Problem, seed: int) -> int:
    """Deterministic per-problem seed, independent of Python's hash randomisation."""
    h = hashlib.sha256(f"{problem.key}/{seed}".encode()).digest()
    return int.from_bytes(h[:4], "little")


def operand_sets(problem, seed: int, l2_bytes: int, device: str | torch.device = "cuda", *, op: str
                 ) -> tuple[list, torch.Tensor]:
    """The seeded operand sets a shape is timed on (enough copies to rotate over >= 2x L2,
    one on CPU) and the fp32 reference of the first, which the gate checks against."""
    from gemm_costmodel import registry

    impl = registry.get(op).impl_module()
    gen = torch.Generator(device=device)
    gen.manual_seed(seed_for(problem, seed))
    first = impl.make_operands(problem, device, gen)
    if str(device) == "cpu":
        return [first], impl.reference(first)
    return timing_copies(impl, problem, first, gen, l2_bytes, device), impl.reference(first)


def reference(ops) -> torch.Tensor:
    """fp32 reference output for one dense-GEMM operand set."""
    from ..kernels.gemm.impl import reference as ref

    return ref(ops)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether exc is the device running out of memory (torch's allocator, or a CUDA
    allocation error raised by a launcher), as opposed to a config's resource limit."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def classify_exception(exc: BaseException) -> str:
    """Map an exception raised while compiling/launching a candidate to a status."""
    name = type(exc).__name__
    text = str(exc)
    if is_out_of_memory(exc):
        return STATUS_OUT_OF_MEMORY
    if name == "OutOfResources" or "out of resource" in text.lower():
        return STATUS_OUT_OF_RESOURCES
    # cuBLAS status errors arrive as "CUDA error: CUBLAS_STATUS_..." but leave the context
    # intact; so do PyTorch's argument checks of the vendor call.
    if "CUBLAS_STATUS_NOT_SUPPORTED" in text or "CUBLAS_STATUS_INVALID_VALUE" in text \
            or "Invalid scaling configuration" in text:
        return STATUS_UNSUPPORTED
    if "CUDA error" in text or "illegal memory access" in text or name == "AcceleratorError":
        return STATUS_CRASH
    return STATUS_COMPILE_ERROR


def _ref_norm(ref: torch.Tensor) -> float:
    """Frobenius norm of a reference, computed once and kept on the tensor (references are
    never modified in place): every candidate of a shape is checked against the same one."""
    norm = getattr(ref, "_costmodel_fro", None)
    if norm is None:
        norm = torch.linalg.vector_norm(ref).item()
        ref._costmodel_fro = norm
    return norm


def check_output(y: torch.Tensor, ref: torch.Tensor, dtype: str, bounds: dict | None = None
                 ) -> tuple[bool, float, str]:
    """(passed, relative error, reason) of an output against the reference; ``bounds``: the
    op's relative error bound per dtype (default: the dense GEMM's)."""
    if y.shape != ref.shape:
        return False, float("nan"), f"shape {tuple(y.shape)} != {tuple(ref.shape)}"
    # One fp32 pass and one reduction with one sync: this runs for every candidate of every
    # shape, and on large outputs the separate finiteness pass, the float copy and three
    # syncs cost more than timing the candidate. A NaN (unwritten) or inf in y makes the
    # norm non-finite, and only then are the bad elements counted.
    err_abs = torch.linalg.vector_norm(torch.sub(y, ref)).item()
    if not math.isfinite(err_abs):
        nbad = int((~torch.isfinite(y)).sum())
        if nbad:
            return False, float("nan"), f"{nbad} elements unwritten or non-finite"
    err = err_abs / max(_ref_norm(ref), 1e-30)
    bound = (bounds or ERROR_BOUNDS)[dtype]
    if not err <= bound:
        return False, err, f"relative error {err:.3g} > {bound:g}"
    return True, err, ""


def gate(cfg: GemmConfig, ops: Operands, ref: torch.Tensor, dtype: str,
         run: Callable[[], torch.Tensor] | None = None, bounds: dict | None = None) -> tuple[str, float, str]:
    """Run cfg once on poisoned output and check it. Returns (status, rel_err, detail).

    ``run`` launches a kernel outside the committed family (explorations) on ``ops``.
    """
    ops.out.fill_(float("nan"))
    try:
        y = run() if run is not None else ops.run(cfg)
        if y.is_cuda:
            torch.cuda.synchronize(y.device)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a status row
        return classify_exception(exc), float("nan"), f"{type(exc).__name__}: {str(exc)[:300]}"
    ok, err, why = check_output(y, ref, dtype, bounds)
    return (STATUS_OK if ok else STATUS_WRONG), err, why


def gate_and_time(timer, cfg: GemmConfig, run: Callable[[Operands], torch.Tensor], ops: list[Operands],
                  ref: torch.Tensor, dtype: str) -> tuple[float | None, str]:
    """For explorations of kernels outside the space: (p50 in us of ``run`` over the operand
    sets, '' or 'unstable') once ``run`` on the first set passes the gate, else (None, why)."""
    status, _, why = gate(cfg, ops[0], ref, dtype, run=lambda: run(ops[0]))
    if status != STATUS_OK:
        return None, f"{status}: {why}"
    t = timer.measure(lambda i: run(ops[i]), len(ops))
    return t.p50_us, ("" if t.stable else "unstable")

