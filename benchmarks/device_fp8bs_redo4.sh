#!/usr/bin/env bash
# A third complete run of the fp8_blockscale evaluation shapes whose two runs disagree (issue 16;
# benchmarks/results/fp8_blockscale/redo4_eval_shapes.csv, written by
# benchmarks/explore/disputed_shapes.py: a candidate within 10% of the shape's best reads more than
# 5% apart between two runs; 17 shapes). With two runs the loader's median is their mean, so one
# run's glitch still moves a key by half of it; with three the median rejects it. Every candidate
# in one run per shape (fp8bs-redo4-eval-h100). The one-driver scheme of device_watch.sh's
# sweep_driver; only on an H100.
#
#   benchmarks/device_fp8bs_redo4.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h100
sweep_driver /tmp/fp8bsredo4 "$out" "$wait_s" '
    python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite eval --dtype fp8 --mode all \
        --only benchmarks/results/fp8_blockscale/redo4_eval_shapes.csv --out $run --quiet \
        --name fp8bs-redo4-eval-h100' datasets/raw/fp8bs-redo4-eval-h100-*.jsonl.gz
exit 0
