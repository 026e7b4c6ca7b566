#!/usr/bin/env bash
# The peer benchmark (issue 18) on a GPU machine whose calls last at most 10 minutes: one driver
# process in its own session runs benchmarks/peers.py over the default suite (interleaved timing
# rounds), resumed from RESULTS/peers.jsonl when that is committed, then measures every candidate
# of the dense space on the suite's mid-M shapes (benchmarks/results/peers/midm_shapes.csv: M = 128
# and 512 of its four training-family weights), where Inductor's Triton template has beaten cuBLAS,
# the only kind of config the shipped model picks there. Each call watches the driver for up to
# WAIT seconds, then copies the peer results and any new shard to OUT.
#
#   benchmarks/device_peers.sh OUT WAIT RESULTS     (RESULTS: e.g. benchmarks/results/peers/run4)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; results="$3"
run=/tmp/peers
mkdir -p "$out" "$run/peers"
if driver_needed "$run" "$run/done"; then
    [ -f "$results/peers.jsonl" ] && [ ! -f "$run/peers/peers.jsonl" ] && cp "$results"/peers.jsonl "$results"/meta.json "$run/peers/"
    resume_shards "$run" datasets/raw/peers-midm*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        python3 -m gemm_costmodel.benchmarks.peers --out $run/peers 2>$run/peers.err &&
        python3 -m gemm_costmodel.cli bench --out $run --quiet --dtype bf16 --shapes benchmarks/results/peers/midm_shapes.csv --mode all --name peers-midm-h100 &&
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
cp "$run"/peers/*.json* "$run"/peers/summary.md "$out"/ 2>/dev/null
gzip -c "$run/peers.err" >"$out/peers.err.gz" 2>/dev/null
tail -n 5 "$run/peers.err"
exit 0
