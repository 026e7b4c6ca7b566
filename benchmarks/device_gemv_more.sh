#!/usr/bin/env bash
# The dense GEMV's configs on the fp16 and fp8 training shapes with M = 1 that have no GEMV rows
# (issue 18: fp16's held-out geomean is 0.13% worse than before the GEMV joined the space):
# device_gemv.sh measured the GEMV on every bf16 M = 1 training shape but on 60 fp16 and 60 fp8
# ones, so 162 fp16 and 166 fp8 M = 1 training shapes (benchmarks/results/gemv/train_shapes_m1_fp16fp8.csv)
# have none. The same fix paid on fp8_blockscale, whose match at M = 1 rose from 59.5% to 67.6%
# with GEMV rows on every training weight (models/NOTES.md). About 26k shape-specialised kernels:
# two or three calls. The one-driver scheme of device_watch.sh's sweep_driver; only on an H100.
#
#   benchmarks/device_gemv_more.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h100
sweep_driver /tmp/gemvmore "$out" "$wait_s" '
    python3 -m gemm_costmodel.cli bench --suite train --dtype fp16 fp8 --mode variant:gemv \
        --only benchmarks/results/gemv/train_shapes_m1_fp16fp8.csv --out $run --quiet \
        --name gemv3-train-m1more-h100' datasets/raw/gemv3-train-m1more-h100-*.jsonl.gz
exit 0
