"""Peer benchmark (issue 18): the dispatched kernel against cuBLAS and torch.compile max-autotune.

Per shape, in one process on one GPU, with the harness's CUDA-graph timer over rotating
buffers (>= 2x L2) and the harness's correctness gate (fp32 reference) before any time counts:

- ``dispatched``: ``Dispatcher().select`` (the shipped model) and the kernel it names;
- ``cublas``: ``torch.mm`` into a preallocated output (fp8: ``torch._scaled_mm``);
- ``inductor``: ``torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False)`` of the same
  matmul, compiled fresh per shape (dynamo reset, caches off, a fresh cache folder), with its
  compile + autotune wall time.

Timing order: Inductor compiles first, then the three contenders are timed side by side in
``--rounds`` rounds: within a round each has its own CUDA graph and the replays interleave (one of
each, in turn: ``GraphTimer.measure_paired``), the order rotated each round, and every
contender's time comes from the same round, the median one. Timing each contender once, one
after the other, let the GPU's clock state drift between them: run 3 timed Inductor right after
its compile (seconds with the GPU nearly idle) and measured it 12% faster than the same cuBLAS
kernel timed seconds before on 8192x28672x4096, a compute-bound shape whose clocks fall as the
card heats. Inductor's pick
(the first line of its AUTOTUNE table, which it prints to stderr) is kept in the row, so a tie of
two cuBLAS calls reads as one.

Also: our cold decision time (``clear_cache`` then ``select``, median of 5) and warm ``select``, the
device copy bandwidth once (``copy_bandwidth``: 2 GiB a side, read + write bytes / time, the
same timer, an SM kernel's copy, checked against the card's datasheet) and per shape the HBM
floor = (weight + x + y bytes) / copy bandwidth, so floor / time = bytes / time / copy bandwidth,
the fraction of the copy bandwidth reached (flagged above FLOOR_FRACTION_MAX: impossible). A failed gate or a compile error stays
as a row with its status. Rows are JSON lines in OUT/peers.jsonl (resumed: shapes already there
are skipped); OUT/summary.json and OUT/summary.md summarise them (``summarize``).

    python -m gemm_costmodel.benchmarks.peers --out DIR [--time-budget S] [--suite default|heldout | --shapes CSV]
        [--dtype bf16|fp16|fp8]

fp8 is per-tensor e4m3 (scale_a, scale_b; bf16 out): cuBLAS is ``torch._scaled_mm`` and Inductor
max-autotune compiles the same ``torch._scaled_mm`` call (its scaled-mm templates against the
extern kernel).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time

# Training-family weights (N, K) of different sizes, two of them >= 64 MB in bf16
# (llama-3.1-8B: 4096x14336 down_proj 112 MB, 28672x4096 gate_up 224 MB).
SUITE_NK = ((2048, 4096), (6144, 4096), (4096, 14336), (28672, 4096))
SUITE_M = (1, 2, 4, 16, 64, 128, 512, 2048, 8192, 16384)
# More M = 1 shapes (batch-1 decode is the first shape users time).
EXTRA_M1_NK = ((4096, 4096), (14336, 4096), (5120, 5120))
CONTENDERS = ("dispatched", "cublas", "inductor")
DEFAULT_ROUNDS = 3
_AUTOTUNE_ROW = re.compile(r"^\s+(\S+) ([0-9.]+) ms ([0-9.]+)%\s*(.*)$")


def default_suite(dtype: str = "bf16") -> list[tuple[int, int, int, str]]:
    """(M, N, K, dtype) of the default suite; every (N, K) is a training family's (checked by a test)."""
    out = [(m, n, k, dtype) for n, k in SUITE_NK for m in SUITE_M]
    out += [(1, n, k, dtype) for n, k in EXTRA_M1_NK]
    return out


# The held-out suite: 13 shapes (M 1-2048, as issue 63's run) of families outside the training
# families (kernels/shapes.py TRAINING_FAMILIES; a test checks none of these weights is a training
# layer's), from their published configs: Qwen3-32B (hidden 5120, 64 heads, 8 KV heads of 128,
# intermediate 25600), Gemma-3-27B (hidden 5376, 32 heads, 16 KV heads of 128, intermediate 21504)
# and Llama-2-7B (hidden 4096, 32 heads, 32 KV heads, intermediate 11008), at TP 1.
HELDOUT_SHAPES = (
    (1, 51200, 5120),    # Qwen3-32B gate_up, 500 MB
    (1, 10240, 5120),    # Qwen3-32B qkv
    (1, 5376, 21504),    # Gemma-3-27B down, 220 MB
    (1, 8192, 5376),     # Gemma-3-27B qkv
    (1, 22016, 4096),    # Llama-2-7B gate_up
    (2, 5120, 25600),    # Qwen3-32B down
    (2, 4096, 11008),    # Llama-2-7B down
    (4, 8192, 5376),     # Gemma-3-27B qkv (Qwen3-32B o_proj, 5120x8192, is a training layer's shape)
    (16, 43008, 5376),   # Gemma-3-27B gate_up
    (64, 12288, 4096),   # Llama-2-7B qkv
    (256, 5376, 4096),   # Gemma-3-27B o_proj
    (1024, 10240, 5120),  # Qwen3-32B qkv
    (2048, 5120, 25600),  # Qwen3-32B down
)


def heldout_suite(dtype: str = "bf16") -> list[tuple[int, int, int, str]]:
    """(M, N, K, dtype) of the held-out suite (HELDOUT_SHAPES)."""
    return [(m, n, k, dtype) for m, n, k in HELDOUT_SHAPES]


SUITES = {"default": default_suite, "heldout": heldout_suite}


def read_shapes(path: str, dtype: str) -> list[tuple[int, int, int, str]]:
    """Shapes of a CSV with columns m,n,k[,dtype]; ValueError naming the bad field and line."""
    import csv

    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            vals = []
            for f in ("m", "n", "k"):
                v = row.get(f) if row.get(f) is not None else row.get(f.upper())
                try:
                    vals.append(int(v))
                except (TypeError, ValueError):
                    raise ValueError(f"{path}:{i}: field {f!r} must be a positive int, got {v!r}") from None
                if vals[-1] < 1:
                    raise ValueError(f"{path}:{i}: field {f!r} must be >= 1, got {vals[-1]}")
            dt = row.get("dtype") or dtype
            if dt not in ("bf16", "fp16", "fp8"):
                raise ValueError(f"{path}:{i}: field 'dtype' must be bf16, fp16 or fp8, got {dt!r}")
            out.append((*vals, dt))
    return out


def shape_key(m, n, k, dtype) -> str:
    return f"{dtype}:{m}x{n}x{k}"


def done_keys(path: str) -> set[str]:
    """Keys of the shapes already in a results file (resume)."""
    if not os.path.isfile(path):
        return set()
    keys = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                r = json.loads(line)
                keys.add(shape_key(r["m"], r["n"], r["k"], r["dtype"]))
    return keys


def _bucket(m: int) -> str:
    return "M=1" if m == 1 else "M=2-64" if m <= 64 else "M=128-1024" if m <= 1024 else "M>=2048"


def _gm(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def parse_autotune(text: str) -> list[dict]:
    """Inductor's AUTOTUNE tables in captured stderr: per table, the op, and its fastest choice's
    name, time (ms) and description (the first row: Inductor sorts them, best first)."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("AUTOTUNE "):
            continue
        for row in lines[i + 1:]:
            if row.startswith("AUTOTUNE ") or "AUTOTUNE benchmarking" in row:
                break
            m = _AUTOTUNE_ROW.match(row)
            if m:
                out.append({"op": line[len("AUTOTUNE "):].strip(), "choice": m.group(1),
                            "ms": float(m.group(2)), "description": m.group(4)[:300]})
                break
    return out


def is_extern_choice(name: str) -> bool:
    """Inductor names a library call by its aten op (mm, addmm, _scaled_mm), a template choice
    with a numbered suffix (triton_mm_7, decompose_k_mm_4_split, ...)."""
    return re.fullmatch(r"_?[a-z_]*mm", name) is not None


def capture_stderr(call):
    """(call(), what it wrote to file descriptor 2), echoed back to stderr after. Inductor writes
    its AUTOTUNE tables with sys.stderr.write, and its compile workers inherit the descriptor, so
    the descriptor is redirected, not sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = call()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", errors="replace")
    sys.stderr.write(text)
    return result, text


def rotated(labels, r: int) -> list:
    """The round-r order: the labels rotated left by r."""
    labels = list(labels)
    r %= len(labels)
    return labels[r:] + labels[:r]


def time_rounds(runs: dict, timer, n_copies: int, rounds: int) -> dict:
    """Time each ``runs[label]`` (a function of the copy index) in ``rounds`` rounds, the order
    rotated each round; within a round the contenders' replays interleave (``measure_paired``),
    where the timer has it. Every contender's reported time comes from the same round, the median
    one (by the geometric mean of the round's p50s; the lower middle of an even count): a median
    taken per contender could pair one's round 2 with another's round 3, and the card's clocks
    move between rounds (peer run 7: two cuBLAS calls of 2048x6144x4096 read 4.7% apart that
    way). Per label: that round's p50 (``us``), p20 and p80, stable when every round was, and
    every round's p50."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    per = {label: [] for label in runs}
    for r in range(rounds):
        order = rotated(runs, r)
        if hasattr(timer, "measure_paired"):
            got = timer.measure_paired({label: runs[label] for label in order}, n_copies)
        else:
            got = {label: timer.measure(runs[label], n_copies, key=label) for label in order}
        for label in order:
            per[label].append(got[label])
    if not per:
        return {}
    level = [math.fsum(math.log(ts[r].p50_us) for ts in per.values()) for r in range(rounds)]
    pick = sorted(range(rounds), key=lambda r: (level[r], r))[(rounds - 1) // 2]
    out = {}
    for label, ts in per.items():
        t = ts[pick]
        out[label] = {"us": t.p50_us, "p20_us": t.p20_us, "p80_us": t.p80_us, "round": pick,
                      "stable": all(x.stable for x in ts), "rounds_us": [x.p50_us for x in ts]}
    return out


# The acceptance's M = 1 roofline check (issue 63) counts weights of at least this many bytes.
BIG_WEIGHT_BYTES = 64 * 2**20


def summarize(rows: list[dict], copy_gbps: float | None = None, peak_gbps: float | None = None) -> dict:
    """Speedups of the dispatched kernel (time of the peer / ours, > 1 = we are faster) over the rows
    where both were timed ok: geomean overall and per M bucket, the worst shape vs Inductor, the
    shapes more than 3% slower than Inductor, every M = 1 shape, compile and decision times. With
    ``copy_gbps`` (the run's meta.json) every fraction of the copy bandwidth is computed from it
    (copy_fraction), else read from the rows; one that ``floor_impossible`` flags (with ``peak_gbps``,
    the card's datasheet HBM bandwidth: faster than it) is listed as impossible and ``floor_check``
    says "failed"."""
    ok = [r for r in rows if r.get("dispatched_us") and r.get("inductor_us") and r.get("cublas_us")]
    out = {"shapes": len(rows), "shapes_compared": len(ok)}

    def frac(r, label):
        us = r.get(f"{label}_us")
        if not us:
            return None
        if copy_gbps:
            return copy_fraction(r.get("bytes") or shape_bytes(r["m"], r["n"], r["k"], r["dtype"]), us, copy_gbps)
        return r.get(f"{label}_floor_fraction")

    bad = [{"shape": shape_key(r["m"], r["n"], r["k"], r["dtype"]), "contender": c, "fraction": f}
           for r in rows for c in CONTENDERS
           if (f := frac(r, c)) is not None and floor_impossible(f, copy_gbps, peak_gbps)]
    out["floor_impossible"] = bad
    out["floor_check"] = "failed" if bad else "ok"
    if not ok:
        return out
    vs_ind = {shape_key(r["m"], r["n"], r["k"], r["dtype"]): r["inductor_us"] / r["dispatched_us"] for r in ok}
    out["geomean_vs_inductor"] = _gm(vs_ind.values())
    out["geomean_vs_cublas"] = _gm(r["cublas_us"] / r["dispatched_us"] for r in ok)
    buckets = {}
    for b in ("M=1", "M=2-64", "M=128-1024", "M>=2048"):
        sel = [r for r in ok if _bucket(r["m"]) == b]
        if sel:
            buckets[b] = {"shapes": len(sel), "vs_inductor": _gm(r["inductor_us"] / r["dispatched_us"] for r in sel),
                          "vs_cublas": _gm(r["cublas_us"] / r["dispatched_us"] for r in sel)}
    out["buckets"] = buckets
    worst = min(vs_ind, key=vs_ind.get)
    out["worst_vs_inductor"] = {"shape": worst, "speedup": vs_ind[worst]}
    out["slower_than_inductor_by_3pct"] = sorted(k for k, v in vs_ind.items() if v < 1 / 1.03)
    # Issue 63's acceptance: no shape slower than Inductor by more than 2%.
    out["slower_than_inductor_by_2pct"] = sorted(k for k, v in vs_ind.items() if v < 1 / 1.02)
    by_key = {shape_key(r["m"], r["n"], r["k"], r["dtype"]): r for r in ok}
    out["slower_detail"] = [{"shape": k, "speedup": vs_ind[k], "dispatched": by_key[k]["dispatched"],
                             "inductor_choice": by_key[k].get("inductor_choice")}
                            for k in out["slower_than_inductor_by_3pct"]]
    picks = [r.get("inductor_choice") for r in ok if r.get("inductor_choice")]
    if picks:
        out["inductor_picks_extern"] = sum(is_extern_choice(c) for c in picks)
        out["inductor_picks_known"] = len(picks)
    out["m1"] = [{"shape": shape_key(r["m"], r["n"], r["k"], r["dtype"]), "dispatched": r["dispatched"],
                  "dispatched_us": r["dispatched_us"], "inductor_us": r["inductor_us"], "cublas_us": r["cublas_us"],
                  "weight_bytes": r["n"] * r["k"] * _dtype_bytes(r["dtype"]),
                  "floor_fraction": frac(r, "dispatched"), "inductor_floor_fraction": frac(r, "inductor")}
                 for r in ok if r["m"] == 1]
    out["m1_at_least_as_fast_as_inductor"] = all(x["dispatched_us"] <= x["inductor_us"] for x in out["m1"])
    big = [x["floor_fraction"] for x in out["m1"] if x["weight_bytes"] >= BIG_WEIGHT_BYTES and x["floor_fraction"]]
    if big:
        out["m1_big_weights_min_copy_fraction"] = min(big)
    m2 = [r for r in ok if r["m"] == 2]
    out["m2_at_least_as_fast_as_inductor"] = all(r["dispatched_us"] <= r["inductor_us"] for r in m2)
    comp = [r["inductor_compile_s"] for r in rows if r.get("inductor_compile_s") is not None]
    dec = [r["cold_decision_us"] for r in rows if r.get("cold_decision_us") is not None]
    if comp:
        out["inductor_compile_s"] = {"median": statistics.median(comp), "max": max(comp)}
    if dec:
        out["cold_decision_us"] = {"median": statistics.median(dec), "max": max(dec)}
    return out


def _dtype_bytes(dtype: str) -> int:
    from gemm_costmodel.kernels.gemm.space import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def summary_markdown(s: dict, meta: dict) -> str:
    L = ["# Peer benchmark: dispatched vs cuBLAS vs torch.compile max-autotune", "",
         f"GPU {meta.get('gpu_name')}, torch {meta.get('torch_version')}, triton {meta.get('triton_version')}, "
         f"copy bandwidth {meta.get('copy_gbps', float('nan')):.0f} GB/s; {s.get('shapes_compared', 0)} of "
         f"{s.get('shapes', 0)} shapes compared. Speedup = peer time / dispatched time (> 1: dispatched faster).", ""]
    copy = meta.get("copy") or {}
    if copy.get("check", "ok") != "ok":
        L += [f"**Copy bandwidth check failed**: {copy['check']}.", ""]
    if s.get("floor_check") == "failed":
        L += [f"**Floor check failed**: {len(s['floor_impossible'])} timings move their bytes faster than "
              f"the card's datasheet HBM bandwidth (or, for a card missing from the table, {FLOOR_FRACTION_MAX}x "
              "the copy bandwidth), which cannot be (fraction of the copy bandwidth): "
              + ", ".join(f"{x['shape']} {x['contender']} {x['fraction']:.2f}" for x in s["floor_impossible"][:8]), ""]
    if not s.get("shapes_compared"):
        return "\n".join(L + ["No shape was timed ok for all three contenders."])
    L += [f"- geomean vs Inductor: **{s['geomean_vs_inductor']:.3f}x**; vs cuBLAS: {s['geomean_vs_cublas']:.3f}x",
          f"- worst vs Inductor: {s['worst_vs_inductor']['shape']} {s['worst_vs_inductor']['speedup']:.3f}x; "
          f"shapes > 3% slower than Inductor: {len(s['slower_than_inductor_by_3pct'])} "
          f"{', '.join(s['slower_than_inductor_by_3pct'])}; > 2%: {len(s.get('slower_than_inductor_by_2pct', []))} "
          f"{', '.join(s.get('slower_than_inductor_by_2pct', []))}",
          f"- every M = 1 shape at least as fast as Inductor: {s['m1_at_least_as_fast_as_inductor']}"]
    if "inductor_compile_s" in s:
        L.append(f"- Inductor compile + autotune: median {s['inductor_compile_s']['median']:.1f} s, max "
                 f"{s['inductor_compile_s']['max']:.1f} s per shape; our cold decision: median "
                 f"{s['cold_decision_us']['median']:.0f} us, max {s['cold_decision_us']['max']:.0f} us")
    if s.get("inductor_picks_known"):
        L.append(f"- Inductor picked cuBLAS (extern) on {s['inductor_picks_extern']} of {s['inductor_picks_known']} "
                 f"shapes whose AUTOTUNE table was read")
    if s.get("slower_detail"):
        L += ["", "| > 3% slower than Inductor | speedup | dispatched | Inductor's pick |", "|---|---|---|---|"]
        for x in s["slower_detail"]:
            L.append(f"| {x['shape']} | {x['speedup']:.3f} | {x['dispatched']} | {x['inductor_choice'] or '?'} |")
    L += ["", "| M bucket | shapes | vs Inductor | vs cuBLAS |", "|---|---|---|---|"]
    for b, v in s["buckets"].items():
        L.append(f"| {b} | {v['shapes']} | {v['vs_inductor']:.3f} | {v['vs_cublas']:.3f} |")
    if "m1_big_weights_min_copy_fraction" in s:
        L += ["", f"M = 1, weights >= {BIG_WEIGHT_BYTES // 2**20} MB: least fraction of the copy bandwidth "
              f"{s['m1_big_weights_min_copy_fraction']:.3f} (bytes moved / time / copy bandwidth)"]
    L += ["", "| M = 1 shape | dispatched | us | Inductor us | cuBLAS us | fraction of copy bandwidth (ours / Inductor) |",
          "|---|---|---|---|---|---|"]
    for x in s["m1"]:
        ff, fi = x["floor_fraction"], x.get("inductor_floor_fraction")
        L.append(f"| {x['shape']} | {x['dispatched']} | {x['dispatched_us']:.2f} | {x['inductor_us']:.2f} | "
                 f"{x['cublas_us']:.2f} | {'' if ff is None else f'{ff:.3f}'} / {'' if fi is None else f'{fi:.3f}'} |")
    return "\n".join(L) + "\n"


def _inductor_setup(cache_dir: str) -> None:
    """Fresh caches so that every shape really compiles and autotunes (names guarded: the knobs
    move between torch versions)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch._inductor.config as ic

    for name, val in (("force_disable_caches", True), ("fx_graph_cache", False), ("autotune_local_cache", False),
                      ("autotune_remote_cache", False)):
        if hasattr(ic, name):
            setattr(ic, name, val)


# The device copy that sets the HBM floor. Each side is 2 GiB, about 35x the H200's 60 MB L2 (40x
# the H100's 50 MB), so no replay finds any of it in L2; read + write = 4 GiB per copy.
COPY_BYTES = 2 * 2**30
# Readings per method, after COPY_WARMUP_S of copies that bring the clocks up from idle (the device
# notes read the H200's SMs at 345 MHz idle); the best reading counts: every way a copy is timed
# wrongly (idle clocks, a slower engine) reads low, never high, and the datasheet bounds it above.
COPY_TRIALS = 3
COPY_WARMUP_S = 0.5
# How copy_bandwidth moves the bytes. "memcpy" is torch's copy_, a cudaMemcpyAsync, which inside a
# CUDA graph becomes a memcpy node run by a copy engine (DMA), not by the SMs: it read 2,430 GB/s on
# H100s with this timer (every peer run's meta.json) where the same copy_ outside a graph (do_bench,
# foundation ceilings) read 3,003, and 2,764 GB/s on an H200 against about 4,300 in the device
# notes, which made the floor fractions 1.22-1.51. "kernel" is an elementwise kernel (torch.neg,
# same bytes read and written) on the SMs, as every GEMM candidate is. Both are recorded.
COPY_METHODS = ("memcpy", "kernel")
# A reading outside these fractions of the card's datasheet HBM bandwidth (kernels/hardware.py) is
# flagged: above 1 is impossible; below COPY_LOW is a copy the card's memory did not limit (H100:
# 0.90 with the SM copy, 0.73 with the copy engine).
COPY_LOW = 0.75
# A shape that moves its bytes faster than the card's datasheet HBM bandwidth is impossible. A
# read-only kernel may pass the copy's read + write rate (the H200: GEMVs at 1.05 of the copy's
# 4,252 GB/s, 4,460 GB/s, 0.93 of the datasheet's 4,800; the copy pays the read-write turnaround),
# so the copy is the roofline the acceptance measures against and the datasheet the physical
# ceiling. For a card missing from the table, more than FLOOR_FRACTION_MAX of the copy is flagged.
FLOOR_FRACTION_MAX = 1.02


def peak_gbps_of(gpu_name: str | None) -> float | None:
    """The card's datasheet HBM bandwidth (kernels/hardware.py), or None if it is not in the table."""
    from gemm_costmodel.kernels import hardware

    spec = hardware.lookup(gpu_name) if gpu_name else None
    return float(spec.hbm_gbps) if spec else None


def floor_impossible(fraction: float, copy_gbps: float | None, peak_gbps: float | None) -> bool:
    """A reading at ``fraction`` of the copy bandwidth is impossible: above the datasheet where the
    card is known, else above FLOOR_FRACTION_MAX of the copy."""
    if peak_gbps and copy_gbps:
        return fraction * copy_gbps > peak_gbps
    return fraction > FLOOR_FRACTION_MAX


def shape_bytes(m: int, n: int, k: int, dtype: str) -> int:
    """Bytes a GEMM must move at least once: weight + x + y (fp8 writes bf16)."""
    from gemm_costmodel.kernels.gemm.space import DTYPE_BYTES, OUT_DTYPE

    e = DTYPE_BYTES[dtype]
    return (n * k + m * k) * e + m * n * DTYPE_BYTES[OUT_DTYPE[dtype]]


def copy_bandwidth(timer, nbytes: int = COPY_BYTES, device: str = "cuda", trials: int = COPY_TRIALS,
                   warmup_s: float = COPY_WARMUP_S, datasheet_gbps: float | None = None) -> dict:
    """Device copy bandwidth, (read + written bytes) / time, with the given timer (the harness's
    GraphTimer on a GPU). ``timer.measure`` returns the time of ONE launch: it divides each replay
    (``n_inner`` copies in one graph) by ``n_inner``, so one copy moves 2 * nbytes per reported
    microsecond. Returns {"gbps": the best reading, "method": its method, "readings": [{method,
    trial, us, gbps, n_inner}], "nbytes", "datasheet_gbps", "datasheet_fraction", "check": "ok" |
    a sentence}. """
    import torch

    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    fns = {"memcpy": lambda i: b.copy_(a), "kernel": lambda i: torch.neg(a, out=b)}
    cuda = str(device).startswith("cuda")
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        for m in COPY_METHODS:
            fns[m](0)
        if cuda:
            torch.cuda.synchronize()
    moved = 2 * a.numel() * a.element_size()
    readings = []
    for trial in range(trials):
        for m in COPY_METHODS:
            t = timer.measure(fns[m], 1, key=f"copy_{m}")
            readings.append({"method": m, "trial": trial, "us": t.p50_us, "n_inner": t.n_inner,
                             "gbps": moved / (t.p50_us * 1e-6) / 1e9})
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    best = max(readings, key=lambda r: r["gbps"])
    out = {"gbps": best["gbps"], "method": best["method"], "nbytes": nbytes, "readings": readings,
           "datasheet_gbps": datasheet_gbps, "datasheet_fraction": None, "check": "ok"}
    if datasheet_gbps:
        out["datasheet_fraction"] = frac = best["gbps"] / datasheet_gbps
        if frac > 1.0:
            out["check"] = f"copy reads {frac:.2f}x the datasheet's {datasheet_gbps:.0f} GB/s: impossible"
        elif frac < COPY_LOW:
            out["check"] = (f"copy reads {frac:.2f}x the datasheet's {datasheet_gbps:.0f} GB/s (< {COPY_LOW}): "
                            "suspect, the floor fractions are too high")
    return out


def datasheet_gbps(gpu_name: str) -> float | None:
    """The card's datasheet HBM bandwidth from kernels/hardware.py, or None for an unknown card."""
    from gemm_costmodel.kernels.hardware import lookup

    spec = lookup(gpu_name) if gpu_name else None
    return spec.hbm_gbps if spec else None


def copy_fraction(nbytes: int, us: float, gbps: float) -> float:
    """The fraction of the copy bandwidth a kernel reached: bytes moved / time / copy bandwidth (the
    same number as the HBM floor / time, the floor being bytes / copy bandwidth)."""
    return nbytes / (us * 1e-6) / 1e9 / gbps


def measure_shape(m, n, k, dtype, d, timer, l2, gbps, rounds: int = DEFAULT_ROUNDS,
                  peak_gbps: float | None = None) -> dict:
    import torch

    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig, config_from_id

    p = Problem(m, n, k, dtype)
    row = {"m": m, "n": n, "k": k, "dtype": dtype}
    colds = []
    for _ in range(5):
        d.clear_cache()
        t = time.perf_counter()
        choice = d.select(m, n, k, dtype)
        colds.append((time.perf_counter() - t) * 1e6)
    t = time.perf_counter()
    for _ in range(1000):
        d.select(m, n, k, dtype)
    row.update(dispatched=choice.candidate, source=choice.source, cold_decision_us=statistics.median(colds),
               warm_decision_ns=(time.perf_counter() - t) * 1e6)
    opsets, ref = C.operand_sets(p, 0, l2, op="gemm")
    first, n_copies = opsets[0], len(opsets)
    row["n_copies"] = n_copies
    row["bytes"] = nbytes = shape_bytes(m, n, k, dtype)
    floor_us = nbytes / (gbps * 1e3)
    row["floor_us"] = floor_us
    cfg = config_from_id(choice.candidate)
    vendor = VendorConfig()
    # Inductor first: its compile leaves the GPU nearly idle for seconds, so no contender may be
    # timed right after it alone (the rounds below interleave all three).
    torch._dynamo.reset()
    if dtype == "fp8":
        def mm(x, w, sa, sb):
            return torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    else:
        def mm(x, w, sa, sb):
            return x @ w.t()
    fn = None
    # Inductor's scaled-mm lowering in torch 2.11 fails on (1,)-shaped per-tensor scales (the shape
    # the harness's operands carry) and takes 0-dim ones (benchmarks/explore/inductor_fp8_probe.py
    # on the H200), so its compiled call gets the same scales as 0-dim views.
    iscales = [(_as_scalar(o.scale_a), _as_scalar(o.scale_b)) for o in opsets]
    try:
        fn = torch.compile(mm, mode="max-autotune-no-cudagraphs", dynamic=False)
        t0 = time.perf_counter()

        def first_call():
            fn(first.x, first.w, *iscales[0])
            torch.cuda.synchronize()

        _, text = capture_stderr(first_call)
        row["inductor_compile_s"] = time.perf_counter() - t0
        picks = parse_autotune(text)
        if picks:
            row.update(inductor_choice=picks[0]["choice"], inductor_choice_description=picks[0]["description"],
                       inductor_autotune_ms=picks[0]["ms"])
    except Exception as exc:  # noqa: BLE001 - a compile failure is a row, not the end of the run
        row["inductor_status"] = f"inductor_error: {type(exc).__name__}: {str(exc)[:300]}"
        row["inductor_us"] = None
        fn = None

    def run_inductor_one():
        first.out.copy_(fn(first.x, first.w, *iscales[0]))
        return first.out

    contenders = {"dispatched": (cfg, None, lambda i: opsets[i].run(cfg)),
                  "cublas": (vendor, None, lambda i: opsets[i].run(vendor))}
    if fn is not None:
        contenders["inductor"] = (vendor, run_inductor_one,
                                  lambda i: fn(opsets[i].x, opsets[i].w, *iscales[i]))
    runs = {}
    for label, (cfg_, run_one, run_i) in contenders.items():
        # gate turns a failing launch (Inductor's kernel included) into its status row itself.
        status, err, detail = C.gate(cfg_, first, ref, dtype, run=run_one)
        row[f"{label}_status"] = status
        if status != C.STATUS_OK:
            row[f"{label}_us"] = None
            row[f"{label}_error"] = detail
        else:
            runs[label] = run_i
    for label, t in time_rounds(runs, timer, n_copies, rounds).items():
        row[f"{label}_us"], row[f"{label}_p20_us"], row[f"{label}_p80_us"] = t["us"], t["p20_us"], t["p80_us"]
        row[f"{label}_stable"] = t["stable"]
        row[f"{label}_rounds_us"] = t["rounds_us"]
        # = bytes / time / copy bandwidth (copy_fraction): the fraction of the copy bandwidth reached.
        row[f"{label}_floor_fraction"] = floor_us / t["us"]
        row[f"{label}_floor_impossible"] = floor_impossible(floor_us / t["us"], gbps, peak_gbps)
    row["rounds"] = rounds
    del opsets, first, ref, fn
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def _as_scalar(scale):
    """A one-element scale tensor as a 0-dim view of it (None and per-row scales unchanged)."""
    return scale.reshape(()) if scale is not None and scale.numel() == 1 else scale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", help="CSV with columns m,n,k[,dtype] (default: the --suite)")
    ap.add_argument("--suite", default="default", choices=sorted(SUITES),
                    help="built-in suite: default (training-family weights, 43 shapes) or heldout (13 shapes of "
                         "families outside training)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    ap.add_argument("--limit", type=int, default=0, help="first N shapes only")
    ap.add_argument("--time-budget", type=float, default=0, help="stop between shapes after this many seconds")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help=f"interleaved timing rounds per shape, order rotated (default {DEFAULT_ROUNDS})")
    args = ap.parse_args(argv)
    if args.limit < 0:
        ap.error(f"--limit must be >= 0, got {args.limit}")
    if args.time_budget < 0:
        ap.error(f"--time-budget must be >= 0, got {args.time_budget}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        shapes = read_shapes(args.shapes, args.dtype) if args.shapes else SUITES[args.suite](args.dtype)
    except (OSError, ValueError) as exc:
        print(f"peers: error: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        shapes = shapes[: args.limit]
    import torch

    if not torch.cuda.is_available():
        print("peers: error: no CUDA device", file=sys.stderr)
        return 2
    from gemm_costmodel.benchmarks import precompile, provenance
    from gemm_costmodel.kernels.timing import GraphTimer
    from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig, config_from_id
    from gemm_costmodel.serving.runtime import Dispatcher

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "peers.jsonl")
    done = done_keys(path)
    todo = [s for s in shapes if shape_key(*s) not in done]
    _inductor_setup(tempfile.mkdtemp(prefix="costmodel-peers-inductor-"))
    prov = provenance.collect(torch.cuda.current_device())
    d = Dispatcher()
    pre = [(Problem(*s), [config_from_id(d.select(*s).candidate)]) for s in todo]
    precompile.precompile([(p, [c for c in cs if not isinstance(c, VendorConfig)]) for p, cs in pre],
                          log=lambda m: print(m, file=sys.stderr, flush=True), op="gemm")
    timer = GraphTimer()
    meta_path = os.path.join(args.out, "meta.json")
    meta = json.load(open(meta_path)) if os.path.isfile(meta_path) else {}
    if "copy" not in meta:  # a folder from before the fixed copy is measured again (summarize recomputes)
        copy = copy_bandwidth(timer, datasheet_gbps=datasheet_gbps(prov.get("gpu_name", "")))
        meta = {**meta, "copy_gbps": copy["gbps"], "copy": copy, **prov}
        json.dump(meta, open(meta_path, "w"), indent=1)
    print(f"copy bandwidth {meta['copy_gbps']:.0f} GB/s ({meta['copy']['method']}; check: {meta['copy']['check']})",
          file=sys.stderr, flush=True)
    l2 = prov.get("l2_bytes") or 50 * 2**20
    t0 = time.perf_counter()
    for i, s in enumerate(todo):
        if args.time_budget and time.perf_counter() - t0 > args.time_budget:
            print(f"time budget reached: {len(todo) - i} shapes left to a resumed run", file=sys.stderr)
            break
        row = measure_shape(*s, d, timer, l2, meta["copy_gbps"], rounds=args.rounds,
                            peak_gbps=peak_gbps_of(meta.get("gpu_name")))
        row.update(provenance=prov)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        # The log line keeps what a lost peers.jsonl would need to explain a missing time (a call
        # returns at most 8 files: the H200's fp8 run kept only its log, without Inductor's error).
        print(json.dumps({k: row.get(k) for k in ("m", "n", "k", "dtype", "dispatched", "dispatched_us", "cublas_us",
                                                   "inductor_us", "inductor_choice", "inductor_compile_s",
                                                   "inductor_status", "dispatched_status", "cublas_status")
                          if k in row}),
                  file=sys.stderr,
              flush=True)
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    s = summarize(rows, meta["copy_gbps"], peak_gbps_of(meta.get("gpu_name")))
    json.dump(s, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(summary_markdown(s, meta))
    print(summary_markdown(s, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- the README's peers table (``costmodel results --readme README.md --peers``) --

PEERS_BEGIN = "<!-- peers:begin (generated by `costmodel results --readme README.md --peers`; do not edit) -->"
PEERS_END = "<!-- peers:end -->"
# The runs the README shows, folders under benchmarks/results/peers/ (peers.jsonl + meta.json each):
# the H200's runs after issue 63's space grew.
README_RUNS = ("h200-m4-rows/heldout-bf16", "h200-m4-rows/default-bf16", "h200-m4-rows/heldout-fp8")
RESULTS_DIR = os.path.join("benchmarks", "results", "peers")


def readme_table(root: str = RESULTS_DIR, runs=README_RUNS) -> str:
    """A short markdown table of the peer runs, recomputed from each folder's rows and meta.json
    (``summarize``): a run whose copy bandwidth predates the fixed copy (no ``copy`` in meta.json)
    shows no fraction of it."""
    L = ["| run | GPU | shapes | vs Inductor (geomean) | vs cuBLAS | M = 1 vs Inductor | M = 1 at least as fast "
         "| shapes > 2% slower | M = 1, >= 64 MB: least fraction of copy bandwidth |",
         "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        folder = os.path.join(root, run)
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as fh:
            meta = json.load(fh)
        with open(os.path.join(folder, "peers.jsonl"), encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        fixed = "copy" in meta
        s = summarize(rows, meta["copy_gbps"] if fixed else None, peak_gbps_of(meta.get("gpu_name")) if fixed else None)
        m1 = s.get("m1", [])
        b1 = s.get("buckets", {}).get("M=1", {})
        frac = (f"{s['m1_big_weights_min_copy_fraction']:.3f}" if fixed and "m1_big_weights_min_copy_fraction" in s
                else "- (copy timed on the copy engine)")
        gpu = (meta.get("gpu_name") or "?").replace("NVIDIA ", "")
        L.append(f"| {run} | {gpu} | {s.get('shapes_compared', 0)} | **{s.get('geomean_vs_inductor', float('nan')):.3f}x** "
                 f"| {s.get('geomean_vs_cublas', float('nan')):.3f}x | {b1.get('vs_inductor', float('nan')):.3f}x | "
                 f"{sum(x['dispatched_us'] <= x['inductor_us'] for x in m1)} of {len(m1)} | "
                 f"{len(s.get('slower_than_inductor_by_2pct', []))} | {frac} |")
    return "\n".join(L)


def rewrite_readme(text: str, root: str = RESULTS_DIR, runs=README_RUNS) -> str:
    """``text`` with the block between PEERS_BEGIN and PEERS_END replaced by ``readme_table``;
    ValueError when the markers are missing or out of order."""
    i, j = text.find(PEERS_BEGIN), text.find(PEERS_END)
    if i < 0 or j < i:
        raise ValueError(f"no peers block ({PEERS_BEGIN!r} ... {PEERS_END!r})")
    return text[: i + len(PEERS_BEGIN)] + "\n" + readme_table(root, runs) + "\n" + text[j:]
