"""Exploration (decision 073's cold-decision cost): multi-stage cascades of the shipped dense model.

A cold decision's onnxruntime time is tree traversals (prefix trees x shortlisted rows, suffix trees x
kept rows), bound by branch mispredictions rather than cache or session overhead, so only fewer
traversals make it cheaper. This script splits the shipped whole model into tree ranges (as
``export.write_cascade`` does) and scores each cold problem's shortlisted rows with a plan of stages
(``(trees_end, keep)``: the trees up to trees_end score the rows still in, then the keep best and
their ties go on), with the runtime's own tie rule; prints, per plan, the picks that differ from the
shipped cascade's ``select`` (every evaluation and vLLM shape, 3,000 training shapes and the cold
benchmark's first 1,000 problems, on the H200 and the H100) and the scoring time on the cold
benchmark's 500 problems (plans interleaved problem by problem).

    python benchmarks/explore/cascade_stages.py
"""
from __future__ import annotations

import random
import time

import numpy as np

from gemm_costmodel import registry
from gemm_costmodel.benchmarks.dispatch_cpu import cold_problems
from gemm_costmodel.serving.candidates import table as candidate_table
from gemm_costmodel.serving.runtime import Dispatcher

PLANS = {
    "40/16 (shipped)": [(40, 16), (200, None)],
    "20/32, 40/16": [(20, 32), (40, 16), (200, None)],
    "10/32, 40/16": [(10, 32), (40, 16), (200, None)],
    "40/16, 80/8": [(40, 16), (80, 8), (200, None)],
    "20/32, 40/16, 80/8": [(20, 32), (40, 16), (80, 8), (200, None)],
    "10/32, 40/12": [(10, 32), (40, 12), (200, None)],
    "20/24, 40/12, 80/6": [(20, 24), (40, 12), (80, 6), (200, None)],
}


def problems(train: int = 3000, cold: int = 1000, seed: int = 0) -> list[tuple]:
    op = registry.get("gemm")
    probs = [(dt, s.m, s.n, s.k) for dt in op.dtypes for name in ("eval", "vllm") if name in op.suites
             for s in op.suite(name, dt)]
    tr = [(dt, s.m, s.n, s.k) for dt in op.dtypes for s in op.suite("train", dt)]
    random.Random(seed).shuffle(tr)
    probs += tr[:train] + [(dt, m, n, k) for m, n, k, dt in cold_problems(cold)]
    return list(dict.fromkeys(probs))


class Stages:
    """Sessions of the whole model's tree ranges, made on first use."""

    def __init__(self, onnx_path: str):
        import onnx
        import onnxruntime as ort

        self.proto, self.ort, self.sessions = onnx.load(onnx_path), ort, {}

    def session(self, lo: int, hi: int):
        from gemm_costmodel.learning.export import slice_trees

        if (lo, hi) not in self.sessions:
            so = self.ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            data = slice_trees(self.proto, lo, hi, lo == 0).SerializeToString()
            self.sessions[lo, hi] = self.ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        return self.sessions[lo, hi]

    def best(self, X, tiebreak, plan, sign: float) -> int:
        rows, s, lo = np.arange(len(X)), np.zeros(len(X)), 0
        for hi, keep in plan:
            s = s + sign * self.session(lo, hi).run(None, {"features": X})[0].reshape(-1).astype(np.float64)
            lo = hi
            if keep is not None and len(rows) > keep:
                top = np.flatnonzero(s <= np.partition(s, keep - 1)[keep - 1])
                rows, s, X = rows[top], s[top], np.ascontiguousarray(X[top])
        return int(rows[np.lexsort((tiebreak[rows], s))[0]])


def rows_of(d: Dispatcher, m, n, k, dt):
    """The decision's table, scored candidates and feature rows, as Dispatcher._decide makes them."""
    ct = candidate_table(d.space_arch, dt, d.op)
    scored = d._scored(d.model_for(dt), ct, d._mask(ct, m, n, k), m)
    return ct, scored, d._features(ct, scored, m, n, k, dt, 1, 1)


def main() -> int:
    probs = problems()
    stages = None
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        d = Dispatcher(gpu_name=gpu)
        d.warm_up(("bf16", "fp16", "fp8"))
        stages = stages or Stages(d.model_for("bf16").path)
        sign = d.model_for("bf16").sign
        shipped = [d.select(m, n, k, dt).candidate for dt, m, n, k in probs]
        data = [rows_of(d, m, n, k, dt) for dt, m, n, k in probs]
        for name, plan in PLANS.items():
            picks = [ct.ids[sc[stages.best(X, sc, plan, sign)]] for ct, sc, X in data]
            differ = sum(a != b for a, b in zip(shipped, picks))
            print(f"{gpu}: {name:20s} differs from the shipped cascade on {differ} of {len(probs)}", flush=True)
    d = Dispatcher(gpu_name="NVIDIA H200")
    d.warm_up(("bf16", "fp16", "fp8"))
    data = [rows_of(d, m, n, k, dt) for m, n, k, dt in cold_problems(500)]
    times = {name: [] for name in PLANS}
    for r in range(4):
        for ct, sc, X in data:
            for name, plan in (list(PLANS.items()) if r % 2 == 0 else list(reversed(PLANS.items()))):
                t = time.perf_counter()
                stages.best(X, sc, plan, sign)
                times[name].append(time.perf_counter() - t)
    for name, v in times.items():
        print(f"{name:20s} scoring p50 {np.median(v) * 1e6:6.1f} us, p99 {np.percentile(v, 99) * 1e6:6.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
