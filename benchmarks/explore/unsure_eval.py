"""What the unsure-mode checks share (``dense_unsure_check.py``, ``fp8bs_unsure_check.py``): gate,
then time a shape's candidates with the harness's CUDA-graph timer over rotating copies, and record
how the model's and unsure mode's picks compare with the best of them. Imported by bare name
(a script's folder is first on sys.path)."""
import json
import statistics
import time

import torch

from gemm_costmodel import registry
from gemm_costmodel.benchmarks import correctness as C


def rel(y, ref):
    return (torch.linalg.vector_norm(y.float() - ref) / torch.linalg.vector_norm(ref)).item()


def time_candidates(op_name, prob, cands, bound, timer, l2, rounds):
    """(status per candidate, p50 per round of the ok ones, their median p50): each candidate gated
    against the fp32 reference first (a wrong result is a status, never a time), then the ok ones
    timed in ``rounds`` rotated rounds."""
    space = registry.get(op_name)
    sets, ref = C.operand_sets(prob, 0, l2, "cuda", op_name)
    status = {}
    for cid in cands:
        try:
            err = rel(sets[0].run(space.config_from_id(cid)), ref)
            status[cid] = "ok" if err <= bound else f"wrong ({err:.1e})"
        except Exception as exc:  # noqa: BLE001 - a failure is a row
            status[cid] = f"error: {str(exc)[:120]}"
    ok_c = [c for c in cands if status[c] == "ok"]
    times = {c: [] for c in ok_c}
    for r in range(rounds):
        for cid in ok_c[r % len(ok_c):] + ok_c[:r % len(ok_c)]:
            cfg = space.config_from_id(cid)
            times[cid].append(timer.measure(lambda i, c=cfg: sets[i].run(c), len(sets), key=cid).p50_us)
    sets = ref = None  # freed before the cache is emptied
    torch.cuda.empty_cache()
    return status, times, {c: statistics.median(times[c]) for c in ok_c}


def record(out, gpu, shape, top, unsure, ks, status, times, p50, t0):
    """Append the shape's row to ``out`` and print how the model's first choice and unsure mode's
    picks (``unsure[k]``, their timings ``unsure[f"timed{k}"]``) compare with the best timed."""
    m, n, k = shape
    best = min(p50.values())
    row = {"kind": "shape", "gpu": gpu, "m": m, "n": n, "k": k, "model_top": top,
           "unsure": {str(kk): unsure[kk] for kk in ks},
           "unsure_timed": {str(kk): unsure[f"timed{kk}"] for kk in ks},
           "p50_us": p50, "rounds_us": times, "status": status, "best_us": best,
           "seconds": time.perf_counter() - t0}
    with open(out, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"{m}x{n}x{k} ({time.perf_counter() - t0:.0f}s, {len(p50)} timed): best {best:.2f} us, model "
          f"{p50.get(top[0], float('nan')) / best:.3f} "
          + " ".join(f"u{kk} {p50.get(unsure[kk], float('nan')) / best:.3f}" for kk in ks), flush=True)
