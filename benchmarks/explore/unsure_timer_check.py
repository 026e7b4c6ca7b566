"""Does the dense unsure mode's timer as it was (eager ``triton.testing.do_bench``, warmup 3, rep 15;
unsure mode has since moved to the graph timer, ``ops._graph_timer``) read what
the dataset's CUDA-graph timer reads? On the MoE stages it read the host's launch path (median
1.94x the graph time; benchmarks/results/moe/README.md). Here: decode and prefill dense shapes of
held-out weights, the shipped model's top 4 each, timed both ways in one process (the graph timer
over the harness's rotating copies; do_bench on one operand set, as unsure mode times the call's
own tensors), and whether the two pick the same config.

    python benchmarks/explore/unsure_timer_check.py
"""
import statistics

import torch
import triton.testing

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.gemm.space import Problem
from gemm_costmodel.serving.runtime import Dispatcher

SHAPES = [(m, n, k) for (n, k) in ((4096, 4096), (14336, 4096), (4096, 14336), (2048, 8192), (28672, 4096))
          for m in (1, 4, 16, 64, 512, 4096)]


def main():
    d = Dispatcher()
    timer = GraphTimer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    spec = registry.get("gemm")
    ratios, agree = [], 0
    for m, n, k in SHAPES:
        prob = Problem(m, n, k, "bf16")
        sets, _ = C.operand_sets(prob, 0, l2, "cuda", "gemm")
        top = [c.candidate for c in d.rank(m, n, k, "bf16", count=4)]
        g, b = {}, {}
        for cid in top:
            cfg = spec.config_from_id(cid)
            sets[0].run(cfg)
            g[cid] = statistics.median(timer.measure(lambda i, c=cfg: sets[i].run(c), len(sets), key=cid).p50_us
                                       for _ in range(3))
            b[cid] = float(triton.testing.do_bench(lambda c=cfg: sets[0].run(c), warmup=3, rep=15)) * 1e3
        r = [b[c] / g[c] for c in top]
        ratios += r
        gb, bb = min(g, key=g.get), min(b, key=b.get)
        agree += gb == bb
        print(f"{m}x{n}x{k}: graph best {gb} {g[gb]:.1f} us; do_bench best {bb} (its graph time {g[bb] / g[gb]:.3f}x); "
              f"do_bench / graph {min(r):.2f}-{max(r):.2f}", flush=True)
        del sets
        torch.cuda.empty_cache()
    ratios.sort()
    print(f"do_bench / graph over {len(ratios)} timings: median {statistics.median(ratios):.3f}, "
          f"min {ratios[0]:.3f}, max {ratios[-1]:.3f}; same pick on {agree} of {len(SHAPES)} shapes")


if __name__ == "__main__":
    main()
