"""Decode roofline benchmark (issue 63): every GEMV config against torch.mm and torch.compile at M = 1-4.

Per shape (M = 1-4 on weights of 4 MB to 1 GB), in one process on one GPU, with the harness's
CUDA-graph timer over rotating buffers (>= 2x L2) and the harness's correctness gate (fp32
reference) before any time counts:

- every GEMV config of the space with the token rows that cover M (``gemv_rows``; at M = 3-4 the
  4-row GEMV even where the space's rules leave it out, so the script answers whether it should be
  in), each gated then timed alone (``GraphTimer.measure``);
- then, in ``--rounds`` interleaved rounds (``peers.time_rounds``, the peer benchmark's rule: all
  from the median round), the best GEMV of those, ``cublas`` (``torch.mm``), the shipped model's
  pick (``dispatched``, when it is none of those) and ``inductor``
  (``torch.compile(mode="max-autotune-no-cudagraphs")`` of the matmul, compiled fresh per shape).

And once per run the device copy bandwidth (``peers.copy_bandwidth``: 2 GiB a side, read + write,
the same timer, checked against the datasheet). Each contender's fraction of the copy bandwidth
is bytes moved (weight + x + y) / time / copy bandwidth (``peers.copy_fraction``).

Writes OUT/meta.json (copy bandwidth, provenance), OUT/decode.jsonl (one row per shape and
contender; resumed: shapes already there are skipped), OUT/summary.json and OUT/summary.md.

    python -m gemm_costmodel.benchmarks.decode --out DIR [--dtype bf16] [--m 1,2,3,4] [--time-budget S]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from . import peers

# Weights (N, K) by bf16 size, 4 MB to about 1 GB: training-family layers (kernels/shapes.py) and
# the three M = 1 shapes of held-out families where the GEMV lost to Inductor on the H200 (issue 63).
DECODE_NK = (
    (1024, 2048),     # 4 MB
    (2048, 2048),     # 8 MB
    (2048, 4096),     # 16 MB
    (6144, 4096),     # 48 MB
    (5120, 6912),     # 68 MB (held out)
    (8192, 4608),     # 72 MB (held out)
    (4096, 14336),    # 112 MB
    (28672, 4096),    # 224 MB
    (51200, 5120),    # 500 MB (held out)
    (8192, 28672),    # 448 MB
    (26624, 16384),   # 832 MB
    (16384, 26624),   # 832 MB, long K
    (32768, 16384),   # 1 GiB (no model's layer: the top of the range)
)
DECODE_M = (1, 2, 3, 4)


def decode_shapes(dtype: str = "bf16", ms=DECODE_M, nks=DECODE_NK) -> list[tuple[int, int, int, str]]:
    return [(m, n, k, dtype) for n, k in nks for m in ms]


def gemv_candidates(m: int, dtype: str, arch: str = "sm90") -> list:
    """Every statically feasible GEMV config of the space and of its pending grids
    (space.PENDING_SM90) with the token rows that cover M, the
    per-problem split-K rules applied by the caller (gate)."""
    from gemm_costmodel.kernels.gemm.space import GEMV_ROWS, generate_configs, pending_configs

    rows = next((r for r in (*GEMV_ROWS, 4) if r >= m), 0)
    cands = generate_configs(arch, dtype, include_vendor=False) + pending_configs(arch, dtype)
    return [c for c in cands if c.variant == "gemv" and c.block_m == rows]


def _usable(cfg, m, n, k, dtype) -> bool:
    """The per-problem rules other than GEMV's M limit (the split's K tiles and workspace)."""
    from gemm_costmodel.kernels.gemm.space import SPLITK_WORKSPACE_LIMIT

    if cfg.split_k > 1 and -(-k // cfg.block_k) < cfg.split_k:
        return False
    return cfg.split_k * m * n * 4 <= SPLITK_WORKSPACE_LIMIT


def measure_shape(m, n, k, dtype, timer, l2, gbps, d=None, rounds=peers.DEFAULT_ROUNDS, inductor=True) -> list[dict]:
    import torch

    from gemm_costmodel.benchmarks import correctness as C
    from gemm_costmodel.kernels.gemm.space import Problem, VendorConfig, config_from_id

    p = Problem(m, n, k, dtype)
    nbytes = peers.shape_bytes(m, n, k, dtype)
    base = {"m": m, "n": n, "k": k, "dtype": dtype, "bytes": nbytes}
    opsets, ref = C.operand_sets(p, 0, l2, op="gemm")
    first, n_copies = opsets[0], len(opsets)
    rows = []

    def row(contender, candidate, status, us=None, **kw):
        r = {**base, "contender": contender, "candidate": candidate, "status": status, "us": us, **kw}
        if us:
            r["gbps"] = nbytes / (us * 1e-6) / 1e9
            r["copy_fraction"] = peers.copy_fraction(nbytes, us, gbps)
        rows.append(r)
        return r

    # 1. Every GEMV config alone.
    gemv = {}
    for cfg in gemv_candidates(m, dtype):
        if not _usable(cfg, m, n, k, dtype):
            continue
        status, err, detail = C.gate(cfg, first, ref, dtype)
        if status != C.STATUS_OK:
            row("gemv", cfg.id, status, error=detail)
            continue
        t = timer.measure(lambda i, c=cfg: opsets[i].run(c), n_copies, key=cfg.id)
        row("gemv", cfg.id, status, t.p50_us, p20_us=t.p20_us, p80_us=t.p80_us, stable=t.stable, rel_err=err)
        gemv[cfg.id] = t.p50_us
    # 2. The best GEMV, cuBLAS, the shipped pick and Inductor side by side.
    runs, cands = {}, {}
    if gemv:
        best = config_from_id(min(gemv, key=gemv.get))
        runs["best_gemv"], cands["best_gemv"] = (lambda i, c=best: opsets[i].run(c)), best.id
    vendor = VendorConfig()
    status, err, detail = C.gate(vendor, first, ref, dtype)
    if status == C.STATUS_OK:
        runs["cublas"], cands["cublas"] = (lambda i: opsets[i].run(vendor)), "cublas"
    else:
        row("cublas", "cublas", status, error=detail)
    if d is not None:  # timed as a contender of its own even when it is the best GEMV or cuBLAS
        pick = d.select(m, n, k, dtype).candidate
        pcfg = config_from_id(pick)
        status, err, detail = C.gate(pcfg, first, ref, dtype)
        if status == C.STATUS_OK:
            runs["dispatched"], cands["dispatched"] = (lambda i, c=pcfg: opsets[i].run(c)), pick
        else:
            row("dispatched", pick, status, error=detail)
    if inductor:
        torch._dynamo.reset()
        if dtype == "fp8":
            def mm(x, w, sa, sb):
                return torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        else:
            def mm(x, w, sa, sb):
                return x @ w.t()
        try:
            fn = torch.compile(mm, mode="max-autotune-no-cudagraphs", dynamic=False)
            t0 = time.perf_counter()

            def first_call():
                fn(first.x, first.w, first.scale_a, first.scale_b)
                torch.cuda.synchronize()

            _, text = peers.capture_stderr(first_call)
            compile_s = time.perf_counter() - t0
            picks = peers.parse_autotune(text)

            def run_one():
                first.out.copy_(fn(first.x, first.w, first.scale_a, first.scale_b))
                return first.out

            status, err, detail = C.gate(vendor, first, ref, dtype, run=run_one)
            if status == C.STATUS_OK:
                runs["inductor"] = lambda i: fn(opsets[i].x, opsets[i].w, opsets[i].scale_a, opsets[i].scale_b)
                cands["inductor"] = picks[0]["choice"] if picks else "inductor"
                base["inductor_compile_s"] = compile_s
            else:
                row("inductor", "inductor", status, error=detail)
        except Exception as exc:  # noqa: BLE001 - a compile failure is a row, not the end of the run
            row("inductor", "inductor", "inductor_error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    for label, t in peers.time_rounds(runs, timer, n_copies, rounds).items():
        row(label, cands[label], C.STATUS_OK, t["us"], p20_us=t["p20_us"], p80_us=t["p80_us"], stable=t["stable"],
            rounds_us=t["rounds_us"])
    del opsets, first, ref
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return rows


def summarize(rows: list[dict], gbps: float) -> dict:
    """Per shape: the paired times of the best GEMV, cuBLAS, the shipped pick and Inductor, their
    fractions of the copy bandwidth, the best GEMV with one tile in flight (num_stages 1) against the
    best overall (alone), and whether the best GEMV is at least as fast as Inductor."""
    from gemm_costmodel.kernels.gemm.space import config_from_id

    shapes: dict = {}
    for r in rows:
        key = peers.shape_key(r["m"], r["n"], r["k"], r["dtype"])
        s = shapes.setdefault(key, {"m": r["m"], "n": r["n"], "k": r["k"], "dtype": r["dtype"], "bytes": r["bytes"],
                                    "weight_mb": r["n"] * r["k"] * peers._dtype_bytes(r["dtype"]) / 2**20})
        if r["status"] != "ok" or not r.get("us"):
            s.setdefault("failed", []).append(f"{r['contender']}:{r['candidate']}:{r['status']}")
            continue
        if r["contender"] == "gemv":
            # One tile in flight (num_stages 1): the GEMV's loop as it was before issue 63.
            slots = ("gemv_alone", "gemv_alone_s1") if config_from_id(r["candidate"]).num_stages == 1 else ("gemv_alone",)
            for sl in slots:
                if r["us"] < s.get(sl, (float("inf"), ""))[0]:
                    s[sl] = (r["us"], r["candidate"])
        else:
            s[r["contender"]] = {"candidate": r["candidate"], "us": r["us"],
                                 "copy_fraction": peers.copy_fraction(r["bytes"], r["us"], gbps)}
    out = []
    for key, s in shapes.items():
        e = {"shape": key, **{k: s[k] for k in ("m", "n", "k", "dtype", "weight_mb")}}
        for c in ("best_gemv", "cublas", "dispatched", "inductor"):
            if c in s:
                e[c] = s[c]
        if "gemv_alone" in s:
            e["best_gemv_alone"] = {"us": s["gemv_alone"][0], "candidate": s["gemv_alone"][1]}
        if "gemv_alone_s1" in s:
            e["best_gemv_s1_alone"] = {"us": s["gemv_alone_s1"][0], "candidate": s["gemv_alone_s1"][1]}
        if "best_gemv" in s and "inductor" in s:
            e["gemv_vs_inductor"] = s["inductor"]["us"] / s["best_gemv"]["us"]
        e["failed"] = s.get("failed", [])
        out.append(e)
    vs = [e["gemv_vs_inductor"] for e in out if "gemv_vs_inductor" in e]
    big = [e["best_gemv"]["copy_fraction"] for e in out
           if "best_gemv" in e and e["m"] == 1 and e["weight_mb"] * 2**20 >= peers.BIG_WEIGHT_BYTES]
    return {"copy_gbps": gbps, "shapes": out, "geomean_gemv_vs_inductor": peers._gm(vs) if vs else None,
            "gemv_at_least_as_fast_as_inductor": sum(v >= 1 for v in vs), "compared": len(vs),
            "m1_big_weights_min_copy_fraction": min(big) if big else None}


def summary_markdown(s: dict, meta: dict) -> str:
    copy = meta.get("copy") or {}
    L = ["# Decode roofline: every GEMV config vs torch.mm and torch.compile max-autotune", "",
         f"GPU {meta.get('gpu_name')}, torch {meta.get('torch_version')}, triton {meta.get('triton_version')}; "
         f"copy bandwidth {s['copy_gbps']:.0f} GB/s ({copy.get('method')}, {copy.get('datasheet_fraction') or 0:.2f} "
         f"of the datasheet; check: {copy.get('check')}). Fraction = (weight + x + y bytes) / time / copy bandwidth.", ""]
    if s["compared"]:
        L += [f"- best GEMV vs Inductor: geomean {s['geomean_gemv_vs_inductor']:.3f}x, at least as fast on "
              f"{s['gemv_at_least_as_fast_as_inductor']} of {s['compared']} shapes"]
    if s["m1_big_weights_min_copy_fraction"] is not None:
        L.append(f"- M = 1, weights >= {peers.BIG_WEIGHT_BYTES // 2**20} MB: least fraction of the copy bandwidth "
                 f"{s['m1_big_weights_min_copy_fraction']:.3f} (target 0.90)")
    L += ["", "| shape | MB | best GEMV (paired) | us | frac | one tile in flight (alone) | us | cuBLAS us | frac | "
          "Inductor us | frac | vs Inductor | dispatched | us |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def g(e, c, f):
        return f"{e[c][f]:.2f}" if c in e and f == "us" else (f"{e[c][f]:.3f}" if c in e else "")

    for e in s["shapes"]:
        s1 = e.get("best_gemv_s1_alone", {})
        L.append(f"| {e['shape']} | {e['weight_mb']:.0f} | {e.get('best_gemv', {}).get('candidate', '')} | "
                 f"{g(e, 'best_gemv', 'us')} | {g(e, 'best_gemv', 'copy_fraction')} | {s1.get('candidate', '')} | "
                 f"{s1.get('us', 0):.2f} | {g(e, 'cublas', 'us')} | {g(e, 'cublas', 'copy_fraction')} | "
                 f"{g(e, 'inductor', 'us')} | {g(e, 'inductor', 'copy_fraction')} | "
                 f"{e.get('gemv_vs_inductor', float('nan')):.3f} | {e.get('dispatched', {}).get('candidate', '')} | "
                 f"{g(e, 'dispatched', 'us')} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    ap.add_argument("--m", default=",".join(map(str, DECODE_M)), help="token counts, comma-separated (1-4)")
    ap.add_argument("--limit", type=int, default=0, help="first N shapes only")
    ap.add_argument("--time-budget", type=float, default=0, help="stop between shapes after this many seconds")
    ap.add_argument("--rounds", type=int, default=peers.DEFAULT_ROUNDS)
    ap.add_argument("--no-inductor", action="store_true", help="skip torch.compile (about 7 s a shape)")
    ap.add_argument("--no-dispatched", action="store_true", help="skip the shipped model's pick")
    args = ap.parse_args(argv)
    try:
        ms = tuple(int(x) for x in args.m.split(","))
    except ValueError:
        ap.error(f"--m must be comma-separated ints, got {args.m!r}")
    if not ms or any(m < 1 or m > 4 for m in ms):
        ap.error(f"--m takes token counts 1-4, got {args.m!r}")
    if args.limit < 0 or args.time_budget < 0 or args.rounds < 1:
        ap.error("--limit and --time-budget must be >= 0, --rounds >= 1")
    shapes = decode_shapes(args.dtype, ms)
    if args.limit:
        shapes = shapes[: args.limit]
    import torch

    if not torch.cuda.is_available():
        print("decode: error: no CUDA device", file=sys.stderr)
        return 2
    from gemm_costmodel.benchmarks import precompile, provenance
    from gemm_costmodel.kernels.gemm.space import Problem
    from gemm_costmodel.kernels.timing import GraphTimer

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode.jsonl")
    done = peers.done_keys(path)
    todo = [s for s in shapes if peers.shape_key(*s) not in done]
    peers._inductor_setup(tempfile.mkdtemp(prefix="costmodel-decode-inductor-"))
    prov = provenance.collect(torch.cuda.current_device())
    d = None
    if not args.no_dispatched:
        from gemm_costmodel.serving.runtime import Dispatcher

        d = Dispatcher()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    # The GEMV compiles per weight shape: every (weight, config) up front, in parallel.
    precompile.precompile([(Problem(*s), gemv_candidates(s[0], s[3])) for s in todo], log=log, op="gemm")
    timer = GraphTimer()
    meta_path = os.path.join(args.out, "meta.json")
    meta = json.load(open(meta_path)) if os.path.isfile(meta_path) else {}
    if "copy" not in meta:
        copy = peers.copy_bandwidth(timer, datasheet_gbps=peers.datasheet_gbps(prov.get("gpu_name", "")))
        meta = {"copy_gbps": copy["gbps"], "copy": copy, **prov}
        json.dump(meta, open(meta_path, "w"), indent=1)
    log(f"copy bandwidth {meta['copy_gbps']:.0f} GB/s ({meta['copy']['method']}; check: {meta['copy']['check']}); "
        f"readings: {[round(r['gbps']) for r in meta['copy']['readings']]}")
    l2 = prov.get("l2_bytes") or 50 * 2**20
    t0 = time.perf_counter()
    for s in todo:
        if args.time_budget and time.perf_counter() - t0 > args.time_budget:
            log(f"time budget reached: run again with the same --out to resume")
            break
        rows = measure_shape(*s, timer, l2, meta["copy_gbps"], d=d, rounds=args.rounds, inductor=not args.no_inductor)
        with open(path, "a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({**r, "provenance": prov}) + "\n")
        paired = {r["contender"]: round(r["us"], 2) for r in rows if r["contender"] != "gemv" and r.get("us")}
        log(json.dumps({"shape": peers.shape_key(*s), **paired}))
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    summ = summarize(rows, meta["copy_gbps"])
    json.dump(summ, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    md = summary_markdown(summ, meta)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
