#!/usr/bin/env bash
# Run a list of sweeps on a GPU machine within one call's time limit, resuming
# shards that are already committed, and always leaving gzipped shards in OUT.
#
#   benchmarks/device_collect.sh OUT PLAN_SECONDS "bf16 all 25/40 eval-bf16-h100" "fp16 sample:48 4/16 train-fp16-h100" ...
#
# Each job is "<dtype> <mode> <shard i/n> <name>"; the jobs share PLAN_SECONDS
# (what is left is split evenly among the remaining jobs). A shard whose gzipped
# file exists under datasets/raw/ is unpacked into OUT first, so the harness
# skips its stored rows (resume). Every sweep runs under `timeout` so the final
# gzip always happens, whatever a sweep does.
set -uo pipefail

out="$1"; shift
plan_s="$1"; shift
mkdir -p "$out"
start=$(date +%s)
n=$#
i=0
for job in "$@"; do
    read -r dtype mode shard name <<<"$job"
    idx=${shard%/*}; tot=${shard#*/}
    file=$(printf "%s-shard%02dof%02d.jsonl" "$name" "$idx" "$tot")
    if [ -f "datasets/raw/$file.gz" ] && [ ! -f "$out/$file" ]; then
        gunzip -c "datasets/raw/$file.gz" > "$out/$file"
    fi
    now=$(date +%s)
    left=$(( plan_s - (now - start) ))
    share=$(( left / (n - i) ))
    i=$((i + 1))
    if [ "$share" -lt 40 ]; then
        echo "skip $job: ${share}s left for it" >&2
        continue
    fi
    # Precompilation comes before the harness's own budget (keep 30 s for it), and
    # the budget is checked between shapes: an evaluation shape can take 30 s more.
    reserve=30; [ "$mode" = all ] && reserve=60
    budget=$(( share - reserve > 20 ? share - reserve : 20 ))
    echo "run $job: ${share}s (sweep budget ${budget}s)" >&2
    timeout "$share" costmodel bench --suite train --dtype "$dtype" --mode "$mode" --shard "$shard" \
        --name "$name" --out "$out" --time-budget "$budget" --quiet
done
gzip -f "$out"/*.jsonl 2>/dev/null
ls -la "$out"
