#!/usr/bin/env bash
# The MoE decode rows measured again after the GEMV began compiling per weight shape (N, K and the
# strides constant; impl.moe_gemv_*_kernel, benchmarks/results/moe/README.md "Compiled per weight
# shape"): every evaluation and vLLM-tuned problem with M <= 4 with every candidate (its earlier
# rows, whose GEMV rows came from the runtime-shaped kernel, moved to superseded-*.jsonl.gz, not
# loaded), and the GEMV configs and the vendor on every training problem with M <= 4 (their earlier
# GEMV rows moved out likewise; the swap-AB and sampled rows of moe-traincold stay, their kernels
# unchanged). The same driver, watch and resume scheme as device_moe_cold.sh.
#
#   benchmarks/device_moe_spec.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/moespec
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-*spec*.jsonl.gz
    decode_problems "$run/decode.csv" || exit 1
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite gate --dtype bf16 fp8 --mode variant:gemv --name gate-moespec-h100 || exit 1
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --suite eval --dtype $dt --mode all --only $run/decode.csv --name moe-evalspec$sfx-h100 &&
            bench --suite vllm --dtype $dt --mode all --only $run/decode.csv --name moe-vllmspec$sfx-h100 || exit 1
        done
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --suite train --dtype $dt --mode variant:gemv --only $run/decode.csv --name moe-trainspec$sfx-h100 || exit 1
        done
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
