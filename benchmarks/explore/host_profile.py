"""Where a cold decision's time goes on a GPU host (issue 18), one process, one JSON line per probe.

- host: CPU model, clock, affinity and the cgroup's CPU quota (a throttled container reads slow);
- python: the per-call cost of a few numpy and pure-Python operations (interpreter speed);
- onnxruntime: session.run of the shipped dense models (whole, cascade prefix, suffix) over
  1 / 16 / 135 / 322 feature rows, median of repeats, with a few session options;
- profile: cProfile of cold decisions, the top functions by own time.

    python benchmarks/explore/host_profile.py [--decisions 300]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import time

import numpy as np


def _median_us(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e6)


def host() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
           "affinity": len(os.sched_getaffinity(0))}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        out["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
        mhz = [float(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu MHz")]
        out["cpu_mhz_median"] = float(np.median(mhz)) if mhz else None
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        try:
            with open(path, encoding="utf-8") as fh:
                out[os.path.basename(path)] = fh.read().strip()
        except OSError:
            pass
    return out


def python_speed() -> dict:
    a = np.random.default_rng(0).random(135)
    b = a + 1

    def loop():
        s = 0
        for i in range(1000):
            s += i * i
        return s

    return {"np_where_135_us": _median_us(lambda: np.where(a > 0.5, a, b), 2000),
            "np_ceil_div_135_us": _median_us(lambda: np.ceil(a / b), 2000),
            "py_loop_1000_us": _median_us(loop, 500)}


def onnx_speed(models: str) -> dict:
    import onnxruntime as ort

    out = {"onnxruntime": ort.__version__}
    man = json.load(open(os.path.join(models, "gemm-sm90.json"), encoding="utf-8"))
    width = len(man["feature_names"])
    rng = np.random.default_rng(0)
    variants = {"default": {}, "no_graph_opt": {"graph_optimization_level": ort.GraphOptimizationLevel.ORT_DISABLE_ALL},
                "no_arena": {"enable_cpu_mem_arena": False}}
    for vname, opts in variants.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        for k, v in opts.items():
            setattr(so, k, v)
        for part in ("", "-prefix", "-suffix"):
            sess = ort.InferenceSession(os.path.join(models, f"gemm-sm90{part}.onnx"), sess_options=so,
                                        providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            for rows in (1, 16, 135, 322):
                x = rng.random((rows, width), dtype=np.float32) * 8
                out[f"{vname}{part or '-whole'}_{rows}_us"] = _median_us(lambda: sess.run(None, {name: x}), 300)
    return out


def profile(decisions: int) -> dict:
    from gemm_costmodel.serving.runtime import Dispatcher
    from gemm_costmodel.benchmarks.dispatch_cpu import cold_problems

    d = Dispatcher(gpu_name="NVIDIA H100 80GB HBM3")
    d.warm_up(("bf16", "fp16", "fp8"))
    probs = cold_problems(decisions)
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    for p in probs:
        d.select(*p)
    pr.disable()
    per = (time.perf_counter() - t) / len(probs) * 1e6
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    return {"profiled_us_per_decision": per, "top": s.getvalue().splitlines()[:60]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--decisions", type=int, default=300)
    args = ap.parse_args()
    print(json.dumps({"host": host()}), flush=True)
    print(json.dumps({"python_speed": python_speed()}), flush=True)
    print(json.dumps({"onnx": onnx_speed(args.models)}), flush=True)
    prof = profile(args.decisions)
    print(json.dumps({"profiled_us_per_decision": prof["profiled_us_per_decision"]}), flush=True)
    print("\n".join(prof["top"]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
