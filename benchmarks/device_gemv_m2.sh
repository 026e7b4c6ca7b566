#!/usr/bin/env bash
# The dense GEMV's configs on the training shapes with M = 2 that have no GEMV rows (issue 18):
# after device_gemv_more.sh every M = 1 training shape of the three dtypes has them, but 179 bf16,
# 218 fp16 and 222 fp8 M = 2 training shapes (benchmarks/results/gemv/train_shapes_m2.csv) had none,
# while the GEMV is in the space up to M = 2. The one-driver scheme of device_watch.sh's
# sweep_driver; two calls; only on an H100.
#
#   benchmarks/device_gemv_m2.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h100
sweep_driver /tmp/gemvm2 "$out" "$wait_s" '
    python3 -m gemm_costmodel.cli bench --suite train --dtype bf16 fp16 fp8 --mode variant:gemv \
        --only benchmarks/results/gemv/train_shapes_m2.csv --out $run --quiet \
        --name gemv3-train-m2-h100' datasets/raw/gemv3-train-m2-h100-*.jsonl.gz
exit 0
