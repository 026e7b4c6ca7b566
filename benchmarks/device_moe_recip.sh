#!/usr/bin/env bash
# The fp8 MoE down-stage decode rows measured again after the GEMV's in-kernel fp8 quantisation
# began multiplying by the scale's reciprocal instead of dividing (impl._gemv_x;
# benchmarks/results/moe/README.md, "The fp8 down GEMV's division"): only the fp8 down GEMV
# quantises in the kernel, so only those rows changed. Every fp8 down evaluation and vLLM-tuned
# problem with M <= 4 with every candidate (their earlier rows move to superseded-*.jsonl.gz, not
# loaded), and the GEMV configs on every fp8 down training problem with M <= 4 (their earlier GEMV
# rows move out likewise). The same driver, watch and resume scheme as device_moe_spec.sh.
#
#   benchmarks/device_moe_recip.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/moerecip
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-*recip*.jsonl.gz
    decode_problems "$run/decode.csv" fp8 down || exit 1
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite gate --dtype fp8 --mode variant:gemv --name gate-moerecip-h100 || exit 1
        bench --suite eval --dtype fp8 --mode all --only $run/decode.csv --name moe-evalrecip-fp8-h100 &&
        bench --suite vllm --dtype fp8 --mode all --only $run/decode.csv --name moe-vllmrecip-fp8-h100 &&
        bench --suite train --dtype fp8 --mode variant:gemv --only $run/decode.csv --name moe-trainrecip-fp8-h100 || exit 1
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
