#!/usr/bin/env bash
# Reliability acceptance on a GPU machine whose calls last at most 10 minutes: the
# 150+-shape sweep runs as ONE process in its own session (it outlives the call that
# started it), and each call watches it for up to WAIT seconds, copying its files to OUT.
#
#   benchmarks/device_reliability.sh start OUT WAIT   # start the sweep, then watch
#   benchmarks/device_reliability.sh watch OUT WAIT   # watch again (a later call)
set -uo pipefail
what="$1"; out="$2"; wait_s="$3"
run=/tmp/reliability
mkdir -p "$out" "$run"
if [ "$what" = start ]; then
    python3 -m gemm_costmodel.benchmarks.reliability shapes --out "$run/shapes.csv" \
        --budget "${COSTMODEL_RELIABILITY_BUDGET:-560}"
    setsid nohup costmodel bench --shapes "$run/shapes.csv" --dtype bf16 fp8 --mode all \
        --name reliability --out "$run" --quiet >"$run/sweep.out" 2>"$run/sweep.err" &
    echo $! >"$run/pid"
fi
start=$(date +%s)
while :; do
    alive=0; kill -0 "$(cat "$run/pid")" 2>/dev/null && alive=1
    rows=$(cat "$run"/reliability-shard00of01.jsonl 2>/dev/null | wc -l)
    shapes=$(cat "$run"/reliability-shard00of01.shapes.log 2>/dev/null | wc -l)
    oom=$(grep -c '"status":"out_of_memory"' "$run"/reliability-shard00of01.jsonl 2>/dev/null)
    last=$(tail -n 1 "$run"/reliability-shard00of01.shapes.log 2>/dev/null | cut -c1-300)
    echo "$(date +%T) alive=$alive rows=$rows shapes=$shapes oom_rows=$oom last: $last"
    [ "$alive" = 0 ] && break
    [ $(( $(date +%s) - start )) -ge "$wait_s" ] && break
    sleep 30
done
gzip -c "$run"/reliability-shard00of01.jsonl >"$out/reliability-shard00of01.jsonl.gz" 2>/dev/null
cp "$run"/reliability-shard00of01.shapes.log "$run"/sweep.out "$run/shapes.csv" "$out/" 2>/dev/null
tail -c 20000 "$run/sweep.err" >"$out/sweep.err" 2>/dev/null
[ "$alive" = 0 ] && { cat "$run/sweep.out"; tail -n 40 "$run/sweep.err"; }
exit 0
