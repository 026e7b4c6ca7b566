#!/usr/bin/env bash
# GEMV rows (M = 1) on the fp8_blockscale training shapes that had none (issue 16): the training
# sweep measured 12 of its 24 shards, so 112 of the 201 training (N, K) pairs that are not
# evaluation shapes at M = 1 got their M = 1 rows there (device_fp8bs_gemv.sh); the other 89
# (benchmarks/results/fp8_blockscale/gemv_train_shapes2.csv) get the GEMV configs here
# (fp8bs-traingemv3-h100). Why: the held-out loss at M = 1 is the model's choice among GEMV
# configs a few percent apart, learned from those 112 weights alone.
# The one-driver scheme of device_watch.sh's sweep_driver; only on an H100.
#
#   benchmarks/device_fp8bs_gemv3.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h100
sweep_driver /tmp/fp8bsgemv3 "$out" "$wait_s" '
    python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite train --dtype fp8 --mode variant:gemv \
        --only benchmarks/results/fp8_blockscale/gemv_train_shapes2.csv --out $run --quiet \
        --name fp8bs-traingemv3-h100' datasets/raw/fp8bs-traingemv3-h100-*.jsonl.gz
exit 0
