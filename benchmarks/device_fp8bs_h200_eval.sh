#!/usr/bin/env bash
# fp8_blockscale's evaluation shapes with M > 1 on an H200, every candidate in one run per shape
# (h200_eval_shapes.csv; the M = 1 ones are device_fp8bs_h200_m1.sh's), as fp8bs-eval-h200. Why:
# the runtime serves an H200 with the H100-trained model through the H200's own GPU description;
# these rows measure how far its picks are from an H200's own best, beside vLLM's H200 tables.
# The one-driver scheme of device_watch.sh's sweep_driver; only on an H200.
#
#   benchmarks/device_fp8bs_h200_eval.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h200
sweep_driver /tmp/fp8bsh200eval "$out" "$wait_s" '
    python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite eval --dtype fp8 --mode all \
        --only benchmarks/results/fp8_blockscale/h200_eval_shapes.csv --out $run --quiet \
        --name fp8bs-eval-h200' datasets/raw/fp8bs-eval-h200-*.jsonl.gz benchmarks/results/fp8_blockscale/*/fp8bs-eval-h200-*.jsonl.gz
exit 0
