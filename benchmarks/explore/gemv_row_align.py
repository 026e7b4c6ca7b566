"""Exploration (kept as a record; CPU): do weight-row alignment features explain the M = 1 GEMV
configs' erratic order? GEMV rows at M = 1 only (MoE: balanced routing; dense: H100 bf16), an
xgboost regressor on log2(t / the problem's best GEMV time), leave-one-family-out (a row's first
family), pick = the lowest prediction among the problem's GEMV configs, scored against its best.
Feature sets: the op's features as trained ("base"), plus log2 of the largest power of two
dividing K x element bytes ("stride_tz", capped at 16), plus that of N x element bytes and K's
remainder over the K tile; or the bytes a thread loads per row and K step and the masked share
of the last K tile. Results: docs/decisions/024-weight-row-alignment-as-a-feature-measured.md, "Weight-row alignment".

    python benchmarks/explore/gemv_row_align.py fp8_blockscale|moe|gemm
"""
import sys

import numpy as np
import xgboost as xgb

from gemm_costmodel.learning import pipeline
from gemm_costmodel.learning.evaluate import families_of
from gemm_costmodel.serving import features as F
from gemm_costmodel.kernels import hardware

op = sys.argv[1]
df = pipeline.load_training_frame(op=op, **({"dtypes": ["bf16"], "gpus": ["NVIDIA H100 80GB HBM3"]} if op == "gemm" else {}))
pre = {'fp8_blockscale': 'bsgemv', 'moe': 'moegemv', 'gemm': 'gemv'}[op]
d = df[(df.status == 'ok') & (df.m == 1) & df.candidate.str.startswith(pre) & df.stable.astype(bool)].copy()
if op == 'moe':
    d = d[d.routing == 'balanced']
if op == 'gemm':
    d = d[d.gpu_name.str.contains('H100') & (d.dtype == 'bf16')]
key = [c for c in ['gpu_name', 'dtype', 'n', 'k', 'e', 'top_k', 'stage', 'routing'] if c in d]
d = d.groupby(key + ['candidate'], observed=True, as_index=False).agg({**{c: 'first' for c in d.columns if c not in key + ['candidate', 'p50_us']}, 'p50_us': 'median'})
d['best'] = d.groupby(key, observed=True).p50_us.transform('min')
d['y'] = np.log2(d.p50_us / d.best)
X = F.from_frame(d, hardware.spec_for)
ib = np.where(d.dtype.astype(str) == 'fp8', 1, 2)
stride = d.k.to_numpy() * ib
tz = np.array([min((int(s) & -int(s)).bit_length() - 1, 16) for s in stride])
nstride = d.n.to_numpy() * ib
tzn = np.array([min((int(s) & -int(s)).bit_length() - 1, 16) for s in nstride])
kmod = (d.k.to_numpy() % d.block_k.to_numpy()) / d.block_k.to_numpy()
# Bytes each thread loads per weight row and K step (Triton's blocked layout gives a thread at most
# 16 contiguous bytes; a (block_n, block_k) tile over 32 x warps threads gives it fewer when small:
# fp8 1x512 over 4 warps is 4-byte loads), and the share of the last K tile that is masked.
loadb = np.log2(np.minimum(16, d.block_n.to_numpy() * d.block_k.to_numpy() * ib / (32 * d.num_warps.to_numpy())))
tail = 1 - d.k.to_numpy() / (np.ceil(d.k.to_numpy() / d.block_k.to_numpy()) * d.block_k.to_numpy())
variants = {'base': X, 'stride_tz': np.column_stack([X, tz]), 'stride_tz+n_tz+kmod': np.column_stack([X, tz, tzn, kmod]),
            'load_bytes': np.column_stack([X, loadb]), 'load_bytes+tail': np.column_stack([X, loadb, tail])}
d['fam'] = d.origins.map(lambda o: sorted(families_of(o))[0])
fams = sorted(d.fam.unique())
for name, XX in variants.items():
    sl = []
    for f in fams:
        tr = (d.fam != f).to_numpy()
        te = ~tr
        if te.sum() == 0:
            continue
        m = xgb.XGBRegressor(n_estimators=300, max_depth=6, learning_rate=0.1, subsample=0.8, colsample_bytree=0.8, random_state=0, n_jobs=2)
        m.fit(XX[tr], d.y.to_numpy()[tr])
        t = d[te].assign(pred=m.predict(XX[te]))
        pick = t.loc[t.groupby(key, observed=True).pred.idxmin()]
        sl += list(2 ** pick.y)
    sl = np.array(sl)
    print(op, name, len(sl), 'geomean %.4f max %.3f within2 %.2f' % (np.exp(np.log(sl).mean()), sl.max(), (sl <= 1.02).mean()), flush=True)
