#!/usr/bin/env bash
# fp8_blockscale at M = 1 on an H200 (issue 16): the training weights' GEMV configs
# (gemv_train_shapes.csv and gemv_train_shapes2.csv, the H100's fp8bs-traingemv* lists) as
# fp8bs-traingemv-h200, then the M = 1 evaluation shapes with every candidate in one run per shape
# (gemv_eval_shapes.csv) as fp8bs-evalgemv-h200. Why: every M = 1 training weight was already
# measured on the H100, and the held-out M = 1 misses are the order among GEMV configs a few
# percent apart. A second card's view of the same weights is the one more M = 1 training signal the
# data rule allows; the evaluation rows say how the H100-trained model's M = 1 picks carry to an H200.
# The one-driver scheme of device_watch.sh's sweep_driver; only on an H200.
#
#   benchmarks/device_fp8bs_h200_m1.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h200
res=benchmarks/results/fp8_blockscale
# One list of the training weights, so one precompile covers them.
mkdir -p /tmp/fp8bsh200m1
{ cat $res/gemv_train_shapes.csv; tail -n +2 $res/gemv_train_shapes2.csv; } >/tmp/fp8bsh200m1/train_shapes.csv
sweep_driver /tmp/fp8bsh200m1 "$out" "$wait_s" '
    bench() { python3 -m gemm_costmodel.cli bench --op fp8_blockscale --dtype fp8 --out $run --quiet "$@"; }
    bench --suite train --mode variant:gemv --only $run/train_shapes.csv --name fp8bs-traingemv-h200 &&
    bench --suite eval --mode all --only '"$res"'/gemv_eval_shapes.csv --name fp8bs-evalgemv-h200' \
    datasets/raw/fp8bs-*gemv-h200-*.jsonl.gz
exit 0
