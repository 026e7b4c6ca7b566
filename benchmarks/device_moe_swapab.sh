#!/usr/bin/env bash
# MoE rows for the swap-AB variant (issue 17) on a GPU machine whose calls last at most 10 minutes,
# for bf16 then fp8: the held-out evaluation and vLLM-tuned shapes with M <= 64 measured again
# with every candidate (their oracle must come from one run that timed swap-AB beside the rest),
# then the swap-AB configs plus the vendor on TRAIN_SHARDS of the training shapes with M <= 64
# (mode variant:swapab; larger M has no swap-AB candidate and is skipped). The same driver, watch
# and resume scheme as device_moe.sh: the driver outlives the call; each call watches it for up to
# WAIT seconds and copies the shards it wrote to OUT; a fresh machine resumes from the shards
# committed under datasets/raw/.
#
#   benchmarks/device_moe_swapab.sh OUT WAIT [TRAIN_SHARDS]   (default 0/2)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-0/2}"
run=/tmp/moeswap
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-*swapab*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        python3 -c "from gemm_costmodel.kernels.moe import suites
print(\"M,N,K,dtype\")
for dt in (\"bf16\", \"fp8\"):
    for s in suites.eval_suite(dt) + suites.vllm_suite(dt):
        if s.m <= 64:
            print(f\"{s.m},{s.n},{s.k},{dt}\")" >$run/decode.csv || exit 1
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --suite eval --dtype $dt --mode all --only $run/decode.csv --name moe-evalswapab$sfx-h100 &&
            bench --suite vllm --dtype $dt --mode all --only $run/decode.csv --name moe-vllmswapab$sfx-h100 || exit 1
        done
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            for s in '"$train_shards"'; do
                bench --suite train --dtype $dt --mode variant:swapab --shard $s --name moe-trainswapab$sfx-h100 || exit 1
            done
        done
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new
exit 0
