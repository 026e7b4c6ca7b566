#!/usr/bin/env bash
# The MoE decode rows measured again with expert-rotating copies (impl.timing_copies, l2_policy
# rotate_experts; benchmarks/results/moe/README.md, "decode weights hot in L2"): every problem with
# M <= 4 of the gate, evaluation, vLLM-tuned and training suites, bf16 and fp8, with the candidates
# of the earlier sweeps (evaluation and vLLM-tuned shapes: every candidate; training problems: the
# GEMV configs and the vendor, every swap-AB config, then 24 sampled), so that the new rows
# supersede each problem's old ones whole (dataset.supersede_l2_policies). The same driver, watch
# and resume scheme as device_moe.sh: the driver outlives the call; each call watches it for up to
# WAIT seconds and copies the shards it wrote to OUT; a fresh machine resumes from OUT's shards
# copied back under datasets/raw/.
#
#   benchmarks/device_moe_cold.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/moecold
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/*moecold*.jsonl.gz datasets/raw/moe-*cold*.jsonl.gz
    decode_problems "$run/decode.csv" || exit 1
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite gate --dtype bf16 fp8 --mode variant:gemv --name gate-moecold-h100 || exit 1
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --suite eval --dtype $dt --mode all --only $run/decode.csv --name moe-evalcold$sfx-h100 &&
            bench --suite vllm --dtype $dt --mode all --only $run/decode.csv --name moe-vllmcold$sfx-h100 || exit 1
        done
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            for mode in variant:gemv variant:swapab sample:24; do
                bench --suite train --dtype $dt --mode $mode --only $run/decode.csv --name moe-traincold$sfx-h100 || exit 1
            done
        done
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
