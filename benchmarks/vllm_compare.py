"""vLLM's kernels with vLLM's configs, with our exported configs, and our dispatcher with our kernels,
per MoE layer and block-fp8 linear, in one run on one GPU (issue 59).

Per (layer, M):
  (i)   ``vllm``: vLLM's kernel with the config vLLM 0.33.0 picks as shipped: its tuned file for the
        GPU in the carried vLLM folder (``try_get_optimal_moe_config`` / ``get_w8a8_block_fp8_configs``,
        vLLM's own functions, kernels/vllm/loader.py), else its default;
  (ii)  ``vllm_ours``: vLLM's kernel with the file ``costmodel export-vllm`` writes for the layer,
        found by the same vLLM functions (MoE from a VLLM_TUNED_CONFIG_FOLDER, block-fp8 from a
        package folder of its own);
  (iii) ``ours``: the shipped dispatcher's pick per stage with the project's kernels.
Each is checked against the project's fp32 reference first (a failure is recorded, not timed).
Times: the harness's CUDA-graph timer (kernels/timing.py), p50 of the whole layer (MoE: align or
the per-pair ids, both GEMMs, silu-and-mul, quantisation, the sum) or the one GEMM.

Writes ``OUT/rows.jsonl`` (one line per (layer, M, method)) and ``OUT/summary.json`` (geomean of
(i)/(ii) and (i)/(iii) per layer and overall, split by whether vLLM has a tuned file).

vLLM's source on a GPU host that cannot pip install: carry a folder made here by

    python -m gemm_costmodel.benchmarks.vllm_compare prepare --wheel vllm-0.33.0-...whl --out .vllm_src

(``.vllm_src/`` is git-ignored: vllm/_version.py, the four source files kernels/vllm/source.py
lists, and vLLM's two configs folders, about 3 MB), then

    python -m gemm_costmodel.benchmarks.vllm_compare run --vllm-src .vllm_src --out out/vllm_compare
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile

from gemm_costmodel.kernels.vllm import source as S

# The wheel's members a GPU host needs: the sources the loader and the kernels read, and vLLM's
# tuned files (the "as shipped" configs).
CONFIG_PREFIXES = ("vllm/model_executor/layers/fused_moe/configs/",
                   "vllm/model_executor/layers/quantization/utils/configs/")
NEEDED = S.SOURCE_FILES + ("vllm/_version.py",)

# Default layers: the held-out MoE families' eval variants (kernels/moe/suites.py) as
# (E, N, hidden, top_k), and block-fp8 (N, K): DeepSeek-V3's, which vLLM tuned, and three it did not.
DEFAULT_NK = ((2112, 7168), (7168, 2048), (24576, 1536), (5120, 8960), (3072, 5120), (13824, 5120))
DEFAULT_MOE_M = (1, 4, 16, 64, 256, 1024, 4096)
DEFAULT_BS_M = (1, 16, 64, 256, 1024, 4096)
METHODS = ("vllm", "vllm_ours", "ours")


def prepare(wheel: str, out: str) -> list[str]:
    """Extract from a vLLM wheel the files a GPU host needs into ``out`` (a folder holding vllm/)."""
    written = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            # The licence too: the carried tables' provenance names it (tests/test_vllm_tables.py).
            if (name in NEEDED or (name.startswith(CONFIG_PREFIXES) and name.endswith(".json"))
                    or (".dist-info/licenses/" in name and name.rsplit("/", 1)[-1] == "LICENSE")):
                z.extract(name, out)
                written.append(name)
    missing = [n for n in NEEDED if n not in written]
    if missing:
        raise SystemExit(f"{wheel}: missing {', '.join(missing)} (not a vLLM 0.33.0 wheel?)")
    return written


def default_moe_layers():
    from gemm_costmodel.kernels.moe import suites

    out = []
    for model in suites.HELDOUT_MODELS:
        v = suites.variant(model, model.eval_variant)
        out.append((v.e, v.inter, v.hidden, v.top_k))
    return out


def resolve_configs(src, gpu: str, moe_layers, nk_pairs, dtypes, models_dir=None, work=None):
    """{("moe", dtype, E, N, hidden, top_k) or ("bs", N, K): {"vllm": loader, "vllm_ours": loader,
    "tuned": bool}}: vLLM's lookup functions over the carried package (i) and over our exports (ii)."""
    from gemm_costmodel.kernels.vllm import loader
    from gemm_costmodel.learning import vllm_export as V

    work = work or tempfile.mkdtemp(prefix="vllm-compare-")
    ours_root, ours_tuned = os.path.join(work, "site"), os.path.join(work, "tuned")
    pkg_bs = os.path.join(ours_root, "vllm", *S.PACKAGE_CONFIG_DIRS[S.KIND_BLOCK_FP8].split(os.sep))
    for dtype in dtypes:
        if moe_layers:
            V.export_moe(moe_layers, ours_tuned, gpu_name=gpu, models_dir=models_dir, dtype=dtype)
    if nk_pairs:
        V.export(nk_pairs, pkg_bs, gpu_name=gpu, models_dir=models_dir)
    if getattr(src, "root", None) is None:  # a wheel: vLLM's tuned files must be on disk for its loader
        prepare(src.where, os.path.join(work, "shipped"))
        shipped_root = os.path.join(work, "shipped")
    else:
        shipped_root = src.root
    shipped = loader.load(src, gpu, shipped_root)
    ours = loader.load(src, gpu, ours_root, tuned_config_folder=ours_tuned)
    return shipped, ours


def layer_bound(dtype: str) -> float:
    """Relative error a whole MoE layer may have against the fp32 reference: the per-GEMM gate's
    bound for each of its two GEMMs. In fp8 the intermediate is quantised again, so the first GEMM's
    rounding moves the second's inputs across quantisation steps: the H200 run of 2026-11-29 found
    all three methods (vLLM's kernel with either file, and ours) at the same 1.00-1.11e-2 on 24 of
    56 fp8 (layer, M), just above the one-GEMM 1e-2, and every bf16 layer below it."""
    from gemm_costmodel.kernels.moe import impl as MI

    return 2 * MI.ERROR_BOUNDS[dtype] if dtype == "fp8" else MI.ERROR_BOUNDS[dtype]


def _tag(dtype):
    return "fp8_w8a8" if dtype == "fp8" else None


class _WallTimer:
    """--device cpu: one wall-clock run (a smoke test of the code paths, not a measurement)."""

    def measure(self, fn, n_copies):
        from types import SimpleNamespace

        t0 = time.perf_counter()
        fn(0)
        return SimpleNamespace(p50_us=(time.perf_counter() - t0) * 1e6, spread=0.0)


def run(args) -> int:
    import torch

    ACT = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}
    from gemm_costmodel.kernels import timing
    from gemm_costmodel.kernels.fp8_blockscale import impl as BI
    from gemm_costmodel.kernels.fp8_blockscale import space as BS
    from gemm_costmodel.kernels.moe import impl as MI
    from gemm_costmodel.kernels.moe import space as MS
    from gemm_costmodel.kernels.moe import vllm_kernels as VK
    from gemm_costmodel.serving.runtime import Dispatcher
    from gemm_costmodel.util import geomean

    src, why = S.find_source(args.vllm_src)
    if src is None:
        print(why, file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    if dev.type != "cuda" and not args.gpu:
        print("--device cpu (a smoke run in the Triton interpreter) needs --gpu NAME for the lookups", file=sys.stderr)
        return 2
    gpu = args.gpu or torch.cuda.get_device_name(dev)
    moe_layers = [tuple(int(v) for v in t.split(",")) for t in args.moe] if args.moe else default_moe_layers()
    nk_pairs = [tuple(int(v) for v in t.split(",")) for t in args.nk] if args.nk else list(DEFAULT_NK)
    if args.no_moe:
        moe_layers = []
    if args.no_bs:
        nk_pairs = []
    os.makedirs(args.out, exist_ok=True)
    shipped, ours = resolve_configs(src, gpu, moe_layers, nk_pairs, args.dtype, args.models,
                                    os.path.join(args.out, "exported"))
    mod = VK.compile_kernels(src)
    timer = timing.GraphTimer() if dev.type == "cuda" else _WallTimer()
    d_moe = Dispatcher(gpu_name=gpu, models_dir=args.models, op="moe") if moe_layers else None
    d_bs = Dispatcher(gpu_name=gpu, models_dir=args.models, op="fp8_blockscale") if nk_pairs else None
    rows_path = os.path.join(args.out, "rows.jsonl")
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)

    def emit(row):
        rows.append(row)
        with open(rows_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def measure(fn, ref, bound):
        try:
            y = fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            err = float((y.float() - ref).norm() / ref.norm().clamp_min(1e-12))
            if not err < bound:
                return {"status": "wrong", "rel_err": err}
            t = timer.measure(lambda i: fn(), 1)
            return {"status": "ok", "rel_err": err, "us": t.p50_us, "spread": t.spread}
        except Exception as exc:  # noqa: BLE001 - recorded per method, the run goes on
            return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}

    for dtype in args.dtype:
        for e, n, hidden, top_k in moe_layers:
            tuned = shipped.get_moe_configs(e, n, _tag(dtype)) is not None
            w1 = (torch.randn(e, 2 * n, hidden, device=dev, generator=gen) / hidden ** 0.5)
            w2 = (torch.randn(e, hidden, n, device=dev, generator=gen) / n ** 0.5)
            w1_s = w2_s = a1_s = a2_s = None
            if dtype == "fp8":
                w1_s, w2_s = (w1.abs().amax(dim=(1, 2)) / 448).float(), (w2.abs().amax(dim=(1, 2)) / 448).float()
                w1 = (w1 / w1_s[:, None, None]).to(torch.float8_e4m3fn)
                w2 = (w2 / w2_s[:, None, None]).to(torch.float8_e4m3fn)
                a1_s, a2_s = torch.tensor([4.0 / 448], device=dev), torch.tensor([0.5 / 448], device=dev)
            else:
                w1, w2 = w1.to(ACT[dtype]), w2.to(ACT[dtype])
            for m in args.moe_m:
                x = torch.randn(m, hidden, device=dev, generator=gen).to(ACT[dtype])
                tw, ids = MI.route(torch.randn(m, e, device=dev, generator=gen), top_k)
                ref = MI.moe_reference(x, w1, w2, tw, ids, w1_scale=w1_s, w2_scale=w2_s, a1_scale=a1_s,
                                       a2_scale=a2_s).float()
                base = {"op": "moe", "gpu": gpu, "dtype": dtype, "e": e, "n": n, "hidden": hidden, "top_k": top_k,
                        "m": m, "vllm_tuned": tuned}
                w1_shape, w2_shape = tuple(w1.shape), tuple(w2.shape)
                for method, L in (("vllm", shipped), ("vllm_ours", ours)):
                    cfg = L.try_get_optimal_moe_config(w1_shape, w2_shape, top_k, _tag(dtype), m)
                    cfg = {k: v for k, v in cfg.items() if k != "SPLIT_K"}
                    r = measure(lambda: VK.fused_experts(mod, x, w1, w2, tw, ids, cfg, w1_scale=w1_s, w2_scale=w2_s,
                                                         a1_scale=a1_s, a2_scale=a2_s),
                                ref, layer_bound(dtype))
                    emit({**base, "method": method, "config": cfg, **r})
                picks = {}
                for stage, (sn, sk) in {"gate_up": (2 * n, hidden), "down": (hidden, n)}.items():
                    picks[stage] = d_moe.select(m, sn, sk, dtype, e=e, top_k=top_k, stage=stage).candidate
                cu, cd = MS.config_from_id(picks["gate_up"]), MS.config_from_id(picks["down"])
                r = measure(lambda: MI.fused_moe(x, w1, w2, tw, ids, cu, cd, w1_scale=w1_s, w2_scale=w2_s,
                                                 a1_scale=a1_s, a2_scale=a2_s, check=False),
                            ref, layer_bound(dtype))
                emit({**base, "method": "ours", "config": picks, **r})
            del w1, w2
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    for n, k in nk_pairs:
        tuned = shipped.get_w8a8_block_fp8_configs(n, k, 128, 128) is not None
        b, bs = BI.quantize_weight_blocks(torch.randn(n, k, device=dev, generator=gen))
        for m in args.bs_m:
            a, as_ = BI.quantize_per_token_group(torch.randn(m, k, device=dev, generator=gen))
            da, db = BI.dequantize(a, b, as_, bs)
            ref = da @ db.T
            base = {"op": "fp8_blockscale", "gpu": gpu, "dtype": "fp8", "n": n, "k": k, "m": m, "vllm_tuned": tuned}
            for method, L in (("vllm", shipped), ("vllm_ours", ours)):
                table = L.get_w8a8_block_fp8_configs(n, k, 128, 128)
                cfg = (table[min(table, key=lambda x: abs(x - m))] if table else
                       {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                        "num_warps": 4, "num_stages": 2})  # vLLM's default (w8a8_triton_block_scaled_mm)
                r = measure(lambda: VK.w8a8_block_fp8_matmul(mod, a, b, as_, bs, [128, 128], cfg, torch.bfloat16),
                            ref, 1e-2)
                emit({**base, "method": method, "config": cfg, **r})
            pick = d_bs.select(m, n, k, "fp8").candidate
            r = measure(lambda: BI.launch(BS.config_from_id(pick), a, b, as_, bs), ref, 1e-2)
            emit({**base, "method": "ours", "config": pick, **r})
    summary = summarize(rows, geomean)
    summary.update({"gpu": gpu, "vllm_version": src.version(), "vllm_commit": src.commit(),
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps(summary["overall"], indent=1))
    return 0


def summarize(rows, geomean) -> dict:
    """Speed-ups over (i) per layer (geomean over M of t_vllm / t_method, rows where both ran ok),
    and overall per (op, vLLM tuned or not)."""
    by = {}
    for r in rows:
        layer = (r["op"], r["dtype"], r.get("e"), r["n"], r.get("hidden", r.get("k")), r.get("top_k"))
        by.setdefault(layer, {}).setdefault(r["m"], {})[r["method"]] = r
    layers, overall = [], {}
    for layer, per_m in sorted(by.items(), key=str):
        rec = {"layer": layer, "vllm_tuned": next(iter(per_m.values()))["vllm"]["vllm_tuned"]
               if all("vllm" in v for v in per_m.values()) else None}
        for method in ("vllm_ours", "ours"):
            ratios = [v["vllm"]["us"] / v[method]["us"] for v in per_m.values()
                      if v.get("vllm", {}).get("status") == "ok" and v.get(method, {}).get("status") == "ok"]
            rec[method] = {"geomean_speedup": geomean(ratios) if ratios else None, "n_m": len(ratios),
                           "worst": min(ratios) if ratios else None}
            key = f"{layer[0]}/{'tuned' if rec['vllm_tuned'] else 'untuned'}/{method}"
            if rec[method]["geomean_speedup"]:
                overall.setdefault(key, []).append(rec[method]["geomean_speedup"])
        rec["failures"] = sorted({f"{m}:{k}:{v['status']}" for m, mm in per_m.items() for k, v in mm.items()
                                  if v["status"] != "ok"})
        layers.append(rec)
    return {"layers": layers,
            "overall": {k: {"geomean_of_layers": geomean(v), "layers": len(v)} for k, v in sorted(overall.items())}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="extract the files a GPU host needs from a vLLM wheel")
    p.add_argument("--wheel", required=True)
    p.add_argument("--out", default=".vllm_src")
    r = sub.add_parser("run", help="time (i), (ii), (iii) on this GPU")
    r.add_argument("--vllm-src", default=".vllm_src", help="a vLLM wheel or a folder holding vllm/")
    r.add_argument("--out", required=True)
    r.add_argument("--gpu", default=None, help="GPU name for the lookups (default: this device's)")
    r.add_argument("--models", default=None)
    r.add_argument("--moe", action="append", default=[], metavar="E,N,HIDDEN,TOPK")
    r.add_argument("--nk", action="append", default=[], metavar="N,K")
    r.add_argument("--dtype", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8", "fp16"],
                   help="MoE dtypes (fp16: for --device cpu, whose interpreter computes garbage for bf16/fp8 dots)")
    r.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (TRITON_INTERPRET=1)")
    r.add_argument("--moe-m", type=int, nargs="+", default=list(DEFAULT_MOE_M))
    r.add_argument("--bs-m", type=int, nargs="+", default=list(DEFAULT_BS_M))
    r.add_argument("--no-moe", action="store_true")
    r.add_argument("--no-bs", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        if os.path.isdir(os.path.join(args.out, "vllm")):
            shutil.rmtree(os.path.join(args.out, "vllm"))
        names = prepare(args.wheel, args.out)
        print(f"{args.out}: {len(names)} files")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
