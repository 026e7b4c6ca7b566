#!/usr/bin/env bash
# MoE rows for the GEMV variant (issue 17: MoeGemvConfig, M <= 4) on a GPU machine whose calls last
# at most 10 minutes, bf16 and fp8: the correctness gate's odd shapes (mode variant:gemv), the
# held-out evaluation and vLLM-tuned shapes with M <= 4 measured again with every candidate (their
# oracle must come from one run that timed the GEMV beside the rest), then the GEMV configs plus
# the vendor on TRAIN_SHARDS of the training shapes with M <= 4 (mode variant:gemv). The same
# driver, watch and resume scheme as device_moe.sh: the driver outlives the call; each call
# watches it for up to WAIT seconds and copies the shards it wrote to OUT (8 files at most: 7
# shards and the logs); a fresh machine resumes from the shards committed under datasets/raw/.
#
#   benchmarks/device_moe_gemv.sh OUT WAIT [TRAIN_SHARDS]   (default "0/1")
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-0/1}"
run=/tmp/moegemv
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/*moegemv*.jsonl.gz datasets/raw/moe-*gemv*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        python3 -c "from gemm_costmodel.kernels.moe import space, suites
print(\"M,N,K,dtype\")
for dt in (\"bf16\", \"fp8\"):
    for s in suites.eval_suite(dt) + suites.vllm_suite(dt):
        if s.m <= space.GEMV_MAX_M:
            print(f\"{s.m},{s.n},{s.k},{dt}\")" >$run/decode.csv || exit 1
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite gate --dtype bf16 fp8 --mode variant:gemv --name gate-moegemv-h100 || exit 1
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --suite eval --dtype $dt --mode all --only $run/decode.csv --name moe-evalgemv$sfx-h100 &&
            bench --suite vllm --dtype $dt --mode all --only $run/decode.csv --name moe-vllmgemv$sfx-h100 || exit 1
        done
        for s in '"$train_shards"'; do
            for dt in bf16 fp8; do
                sfx=""; [ $dt = bf16 ] || sfx=-$dt
                bench --suite train --dtype $dt --mode variant:gemv --shard $s --name moe-traingemv$sfx-h100 || exit 1
            done
        done
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
