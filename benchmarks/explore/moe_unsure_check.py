"""Unsure mode on the MoE layer at decode (issue 17), on layers nobody measured.

The shipped MoE model picks a GEMV config 3-5% off the best at M = 1 on held-out families (its
configs are up to 4x apart on one layer with no smooth pattern). Unsure mode
(``ops.enable_unsure_mode(k)``) times the model's top k of each stage on the layer's own operands
at the first call. This checks both on the held-out families' tensor-parallel variants that no
sweep measured (the evaluation suite holds one variant per family; expert-parallel variants only
change E, which the M = 1 GEMV does not see), at M = 1, bf16 and fp8:

1. decisions: the shipped model's top 8 per stage, then unsure mode with k = 2 and k = 4 (its own
   timer, ``triton.testing.do_bench``, on the layer's real operands);
2. evaluation, in the same process: every GEMV config of the stage, the model's top 8 and vLLM's
   default, timed with the harness's CUDA-graph timer over rotating operand copies (the dataset's
   method), ROUNDS rounds in rotated order, median per candidate;
3. each decision scored against the best of those timed (at M = 1 the GEMV is the space's best on
   48 of the 52 measured evaluation stage shapes).

Rows go to OUT (JSON lines, appended; a rerun skips the layers already there).

    python benchmarks/explore/moe_unsure_check.py OUT.jsonl [--dtype bf16 fp8] [--time-budget 420]
"""
import argparse
import json
import os
import statistics
import time
import zlib

import torch

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import correctness as C
from gemm_costmodel.kernels.timing import GraphTimer
from gemm_costmodel.kernels.moe import impl as I
from gemm_costmodel.kernels.moe import routing as R
from gemm_costmodel.kernels.moe import space as S
from gemm_costmodel.kernels.moe import suites as SU
from gemm_costmodel.serving import ops
from gemm_costmodel.serving.runtime import Dispatcher

ROUNDS = 3
KS = (2, 4)


def layers():
    """(family, variant, E, inter, hidden, top_k) of the held-out families' unmeasured TP variants."""
    out = []
    for model in SU.HELDOUT_MODELS:
        for v in SU.variants(model):
            if v.name.startswith("tp") and v.name != model.eval_variant:
                out.append((v.family, v.name, v.e, v.inter, v.hidden, v.top_k))
    return out


def layer_operands(m, e, inter, hidden, top_k, dtype, gen):
    x = torch.randn((m, hidden), generator=gen, device="cuda").to(torch.bfloat16)
    w1, s1 = I.random_weights(e, 2 * inter, hidden, dtype, "cuda", gen)
    w2, s2 = I.random_weights(e, hidden, inter, dtype, "cuda", gen)
    ids = torch.from_numpy(R.topk_ids("balanced", m, e, top_k).copy()).to("cuda")
    tw = torch.rand((m, top_k), generator=gen, device="cuda") + 0.25
    tw /= tw.sum(dim=1, keepdim=True)
    fp8 = dict(w1_scale=s1, w2_scale=s2, a1_scale=I.dynamic_scale(x.float())) if dtype == "fp8" else {}
    return x, w1, w2, tw, ids, fp8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--time-budget", type=float, default=420.0)
    args = ap.parse_args()
    done = set()
    if os.path.isfile(args.out):
        with open(args.out) as fh:
            done = {(r["dtype"], r["family"], r["variant"]) for r in map(json.loads, fh) if r.get("kind") == "layer"}
    gpu = torch.cuda.get_device_name()
    d = Dispatcher(op="moe")
    ops.set_dispatcher(d)
    timer = GraphTimer()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    t_start = time.perf_counter()
    m = args.m
    for dtype in args.dtype:
        for fam, var, e, inter, hidden, top_k in layers():
            if (dtype, fam, var) in done:
                continue
            if time.perf_counter() - t_start > args.time_budget:
                print("time budget spent; rerun to resume", flush=True)
                return
            t0 = time.perf_counter()
            gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{fam}:{var}:{dtype}".encode()))
            x, w1, w2, tw, ids, fp8 = layer_operands(m, e, inter, hidden, top_k, dtype, gen)
            dims = {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}
            top = {st: [c.candidate for c in d.rank(m, n, k, dtype, count=8, e=e, top_k=top_k, stage=st)]
                   for st, (n, k) in dims.items()}
            unsure = {}
            for kk in KS:
                tuner = ops.enable_unsure_mode(k=kk)
                up, down = ops.choose_moe(x, w1, w2, tw, ids, **fp8)
                unsure[kk] = {"gate_up": up, "down": down,
                              "timed": {key.split(":")[1]: ent["timed"] for key, ent in tuner.op_entries["moe"].items()}}
                ops.disable_unsure_mode()
            del x, w1, w2
            rows = []
            for st, (n, k) in dims.items():
                prob = S.Problem(m, n, k, dtype, e, top_k, st, "balanced")
                cands = [c.id for c in S.generate_configs("sm90", dtype)
                         if isinstance(c, S.MoeGemvConfig) and S.check_feasible(c, prob)[0]]
                cands = list(dict.fromkeys(cands + top[st] + [S.vllm_default(m, e, dtype).id]
                                           + [unsure[kk][st] for kk in KS]))
                sets, _ = C.operand_sets(prob, 0, l2, "cuda", "moe")
                times = {c: [] for c in cands}
                for r in range(ROUNDS):
                    order = cands[r % len(cands):] + cands[:r % len(cands)]
                    for cid in order:
                        cfg = registry.get("moe").config_from_id(cid)
                        try:
                            t = timer.measure(lambda i, c=cfg: sets[i].run(c), len(sets), key=cid)
                            times[cid].append(t.p50_us)
                        except Exception as exc:  # noqa: BLE001 - a failure is a row
                            times[cid].append(float("nan"))
                            print(f"{cid}: {str(exc)[:200]}", flush=True)
                for cid in cands:
                    rows.append({"kind": "candidate", "dtype": dtype, "family": fam, "variant": var, "stage": st,
                                 "m": m, "n": n, "k": k, "e": e, "top_k": top_k, "candidate": cid,
                                 "p50_us": statistics.median(times[cid]), "rounds_us": times[cid],
                                 "model_rank": top[st].index(cid) + 1 if cid in top[st] else None,
                                 "unsure": [kk for kk in KS if unsure[kk][st] == cid], "n_copies": len(sets)})
                del sets
                torch.cuda.empty_cache()
            with open(args.out, "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")
                fh.write(json.dumps({"kind": "layer", "dtype": dtype, "family": fam, "variant": var, "e": e,
                                     "inter": inter, "hidden": hidden, "top_k": top_k, "gpu": gpu,
                                     "unsure": {str(kk): unsure[kk] for kk in KS}, "model_top": top,
                                     "seconds": time.perf_counter() - t0}) + "\n")
            best = {st: min((r["p50_us"], r["candidate"]) for r in rows if r["stage"] == st) for st in dims}
            msg = []
            for st in dims:
                got = {r["candidate"]: r["p50_us"] for r in rows if r["stage"] == st}
                msg.append(f"{st}: best {best[st][0]:.1f} model {got[top[st][0]] / best[st][0]:.3f} "
                           + " ".join(f"u{kk} {got[unsure[kk][st]] / best[st][0]:.3f}" for kk in KS))
            print(f"{dtype} {fam} {var} ({time.perf_counter() - t0:.0f}s): " + "; ".join(msg), flush=True)


if __name__ == "__main__":
    main()
