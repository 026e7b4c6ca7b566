#!/usr/bin/env bash
# fp8_blockscale data on a GPU machine whose calls last at most 10 minutes (issue 16): one
# driver process in its own session runs, in order, the vendor probe, the correctness gate
# on odd shapes, the evaluation sweep (every candidate) and a training shard (a sample of
# candidates per shape); it outlives the call that started it, and each call watches it for
# up to WAIT seconds and copies the gzipped shards it wrote to OUT (at most 8 come back). A fresh machine resumes from the
# shards committed under datasets/raw/ and benchmarks/results/fp8_blockscale/.
#
#   benchmarks/device_fp8_blockscale.sh OUT WAIT [TRAIN_SHARDS]
# TRAIN_SHARDS (default "0/24") lists the training shards to sweep, in order, e.g. "1/24 2/24".
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-0/24}"
run=/tmp/fp8bs
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/fp8bs-*.jsonl.gz benchmarks/results/fp8_blockscale/*-shard*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        [ -s $run/probe.jsonl ] || [ -s benchmarks/results/fp8_blockscale/vendor_probe.jsonl ] || python3 benchmarks/explore/fp8bs_vendor_probe.py >$run/probe.jsonl 2>$run/probe.err
        # "done" only when every sweep finished: a failed one is resumed by the next call.
        python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite gate --dtype fp8 --mode all --name gate-fp8bs-h100 --out $run --quiet &&
        python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite eval --dtype fp8 --mode all --name fp8bs-eval-h100 --out $run --quiet &&
        for s in '"$train_shards"'; do
            python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite train --dtype fp8 --mode sample:40 --shard $s \
                --name fp8bs-train-h100 --out $run --quiet || exit 1
        done &&
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new
cp "$run/probe.jsonl" "$out/" 2>/dev/null
exit 0
