"""Exploration (issue 58): are the dense op's fp16 and fp8 cold decisions dearer than bf16's?

The same process, every dtype's sessions and tables warmed, ``dispatch_ops``' own problems per dtype
(the same seeds): per dtype, the median of each phase of a cold decision (mask + shortlist,
feature rows, cascade), of a whole cold ``select``, of the rows scored, of the rows the suffix
scores and of the feasible candidates; the dtypes alternate in 3 rounds so a drift of the host
hits all of them.

    python benchmarks/explore/dense_dtype_phases.py
"""
import collections
import time
import warnings
import zlib

import numpy as np

from gemm_costmodel import registry
from gemm_costmodel.benchmarks.dispatch_ops import draw_problems
from gemm_costmodel.serving.runtime import Dispatcher
from gemm_costmodel.serving.candidates import table as ctab
warnings.simplefilter("ignore")
d = Dispatcher(gpu_name="NVIDIA H200", op="gemm")
d.warm_up(("bf16","fp16","fp8"))
spec = registry.get("gemm")
probs = {dt: draw_problems(spec, dt, 300, seed=zlib.crc32(f"gemm:{dt}".encode())) for dt in ("bf16","fp16","fp8")}
for dt in ("bf16","fp16","fp8"):
    pool = spec.suite("eval" if "eval" in spec.suites else next(iter(spec.suites)), dt)
    ct = ctab(d.space_arch, dt, "gemm"); model = d.model_for(dt)
    print(dt, "suite", next(iter(spec.suites)), "pool", len(list(pool)), "table", len(ct), "cascade keep", model.cascade[2], "buckets", {b: len(v) for b,v in model.buckets.items()})
stats = {}
for rep in range(3):
  for dt in ("bf16","fp16","fp8"):
    ct = ctab(d.space_arch, dt, "gemm"); model = d.model_for(dt)
    pre, suf, keep = model.cascade
    rows = collections.defaultdict(list)
    for p in probs[dt]:
        m,n,k = p["m"],p["n"],p["k"]
        t0=time.perf_counter(); mask = d._mask(ct,m,n,k); sc = d._scored(model, ct, mask, m)
        t1=time.perf_counter(); X = d._features(ct, sc, m,n,k,dt,1,1)
        t2=time.perf_counter(); order, s = model.best(X, sc, 1)
        t3=time.perf_counter()
        d.clear_cache(); t4=time.perf_counter(); d.select(m,n,k,dt); t5=time.perf_counter()
        sp = model.score(X, pre); topn = int((sp <= np.partition(sp, keep-1)[keep-1]).sum()) if len(sc)>keep else 0
        rows["mask"].append(t1-t0); rows["feat"].append(t2-t1); rows["casc"].append(t3-t2); rows["select"].append(t5-t4)
        rows["nscored"].append(len(sc)); rows["nsuffix"].append(topn); rows["nfeas"].append(int(mask.sum()))
    for kk,v in rows.items():
        stats.setdefault(dt,{}).setdefault(kk,[]).append(np.median(v)*(1e6 if kk in ("mask","feat","casc","select") else 1))
for dt, st in stats.items():
    print(dt, {k: [round(x,1) for x in v] for k,v in st.items()})
