#!/usr/bin/env bash
# A second complete run of every MoE evaluation and vLLM-tuned problem with M <= 4 (bf16 and fp8,
# every candidate, expert-rotating copies as in device_moe_spec.sh), so that those problems'
# oracles are the median of two complete runs (dataset.merge_duplicates), as the fp8_blockscale
# M = 1 evaluation shapes got (device_picks.sh, step m1). Why: a decode problem's GEMV configs sit
# a few percent apart and its oracle is the fastest of ~30 of them timed once, so a config that
# read fast in that one run is the oracle; the leave-family-out worst cases of issue 17 are such
# M = 1 problems (gpt-oss-20b gate_up: 1.109 bf16, 1.116 fp8). Then, if the lease lasts, the
# fp8_blockscale training shapes' GEMV rows that device_picks.sh's step m1 did not reach.
# The same driver, watch and resume scheme as device_moe_spec.sh; only on an H100.
#
#   benchmarks/device_moe_redo2.sh OUT WAIT
# WAIT plus about 40 s of packing must fit in the call's time limit.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
require_card h100
run=/tmp/moeredo2
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-redo2-*.jsonl.gz datasets/raw/fp8bs-traingemv2-h100-*.jsonl.gz
    decode_problems "$run/decode.csv" || exit 1
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --out $run --quiet "$@"; }
        for dt in bf16 fp8; do
            sfx=""; [ $dt = bf16 ] || sfx=-$dt
            bench --op moe --suite eval --dtype $dt --mode all --only $run/decode.csv --name moe-redo2-evaldecode$sfx-h100 &&
            bench --op moe --suite vllm --dtype $dt --mode all --only $run/decode.csv --name moe-redo2-vllmdecode$sfx-h100 || exit 1
        done
        bench --op fp8_blockscale --suite train --dtype fp8 --mode variant:gemv \
            --only benchmarks/results/fp8_blockscale/gemv_train_shapes.csv --name fp8bs-traingemv2-h100 || exit 1
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
collect_tar "$run" "$out" "$wait_s" 20
exit 0
