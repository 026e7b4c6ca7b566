"""H200 memory-bandwidth probe (issue 63): what one card's copy and read bandwidth are, measured
several ways, so the peer benchmark's HBM floor can be checked against them.

Per buffer size (256 MiB to 4 GiB): a device-to-device copy timed (a) with CUDA events around 10
back-to-back copies and (b) with the harness's GraphTimer (as peers.copy_gbps does); a read-only
stream (torch.sum over the buffer) the same two ways. Bytes: copy = read + write, sum = read.

    python benchmarks/explore/h200_bandwidth_probe.py OUT.json
"""
from __future__ import annotations

import json
import sys

import torch

from gemm_costmodel.kernels.timing import GraphTimer


def events_us(fn, n: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / n


def main() -> None:
    out = {"gpu": torch.cuda.get_device_name(), "rows": []}
    timer = GraphTimer()
    for mib in (256, 1024, 4096):
        n = mib * 2**20 // 4
        a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
        b = torch.empty_like(a)
        acc = torch.empty((), dtype=torch.float32, device="cuda")
        nbytes = a.numel() * 4
        row = {"mib": mib}
        row["copy_events_gbps"] = 2 * nbytes / events_us(lambda: b.copy_(a)) / 1e3
        t = timer.measure(lambda i: b.copy_(a), 1)
        row["copy_graph_gbps"] = 2 * nbytes / t.p50_us / 1e3
        row["copy_graph_inner"] = t.n_inner
        row["sum_events_gbps"] = nbytes / events_us(lambda: torch.sum(a, dim=0, out=acc)) / 1e3
        t = timer.measure(lambda i: torch.sum(a, dim=0, out=acc), 1)
        row["sum_graph_gbps"] = nbytes / t.p50_us / 1e3
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        del a, b
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
