#!/usr/bin/env bash
# The peer benchmark (issue 18) on a GPU machine whose calls last at most 10 minutes: one driver
# process in its own session runs, with DEEP=1, the deep-pipeline exploration
# (benchmarks/explore/deep_stages.py, resumed from RESULTS/deep_stages.jsonl), then
# benchmarks/peers.py over the default suite (paired timing rounds), resumed from
# RESULTS/peers.jsonl when that is committed, then, with MIDM=1, measures every candidate of the dense space on
# the suite's mid-M shapes (benchmarks/results/peers/midm_shapes.csv: M = 128 and 512 of its four
# training-family weights; resumed from RESULTS/peers-midm*), where Inductor's Triton template
# has beaten cuBLAS, the only kind of config the shipped model picks there. Each call watches the
# driver for up to WAIT seconds, then copies the results and any new shard to OUT.
#
#   [DEEP=1] [MIDM=1] benchmarks/device_peers.sh OUT WAIT RESULTS   (RESULTS: e.g. benchmarks/results/peers/run5)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; results="$3"
run=/tmp/peers-$(basename "$results")
mkdir -p "$out" "$run/peers"
if driver_needed "$run" "$run/done"; then
    [ -f "$results/peers.jsonl" ] && [ ! -f "$run/peers/peers.jsonl" ] && cp "$results"/peers.jsonl "$results"/meta.json "$run/peers/"
    resume_shards "$run" "$results"/peers-midm*.jsonl.gz
    mkdir -p "$run/deep"
    [ -f "$results/deep_stages.jsonl" ] && [ ! -f "$run/deep/deep_stages.jsonl" ] && cp "$results/deep_stages.jsonl" "$run/deep/"
    setsid nohup bash -c '
        run='"$run"'
        if [ "'"${DEEP:-0}"'" = 1 ]; then python3 benchmarks/explore/deep_stages.py --out $run/deep >$run/deep.out 2>$run/deep.err || exit 1; fi
        python3 -m gemm_costmodel.benchmarks.peers --out $run/peers 2>$run/peers.err || exit 1
        if [ "'"${MIDM:-0}"'" = 1 ]; then python3 -m gemm_costmodel.cli bench --out $run --quiet --dtype bf16 --shapes benchmarks/results/peers/midm_shapes.csv --mode all --name peers-midm-h100 || exit 1; fi
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
cp "$run"/peers/*.json* "$run"/peers/summary.md "$run"/deep/deep_stages.jsonl "$out"/ 2>/dev/null
tail -n 22 "$run/deep.out" 2>/dev/null; tail -n 3 "$run/deep.err" 2>/dev/null
gzip -c "$run/peers.err" >"$out/peers.err.gz" 2>/dev/null
tail -n 5 "$run/peers.err"
exit 0
