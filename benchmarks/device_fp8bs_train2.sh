#!/usr/bin/env bash
# More fp8_blockscale training shards (issue 16): device_fp8_blockscale.sh measured shards 0-12 of
# the training sweep's 24; this driver measures the listed others (sample:40 per shape, the same
# seed and shard split, so the rows are those that driver would have written) and nothing else:
# no gate, vendor probe or evaluation sweep, whose committed shards must not gain rows from another
# run (the harness resumes row by row). The one-driver scheme of device_watch.sh's sweep_driver;
# only on an H100.
#
#   benchmarks/device_fp8bs_train2.sh OUT WAIT "13/24 14/24 ..."
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-}"
require_card h100
[ -n "$train_shards" ] || { echo "name the training shards to sweep, e.g. \"13/24 14/24\"" >&2; exit 2; }
sweep_driver /tmp/fp8bstrain2 "$out" "$wait_s" '
    for s in '"$train_shards"'; do
        python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite train --dtype fp8 --mode sample:40 --shard $s \
            --name fp8bs-train-h100 --out $run --quiet || exit 1
    done' datasets/raw/fp8bs-train-h100-*.jsonl.gz
exit 0
