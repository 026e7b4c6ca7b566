#!/usr/bin/env bash
# Second complete measurements of evaluation shapes whose first run left unstable rows, then
# more MoE training shards, on a GPU machine whose calls last at most 10 minutes. One driver
# process in its own session runs, in order:
#   1. fp8_blockscale: the evaluation shapes of benchmarks/results/fp8_blockscale/redo_eval_shapes.csv
#      (every candidate, one run per shape: name fp8bs-redo-eval-h100);
#   2. moe bf16: the evaluation and vLLM-tuned shapes of benchmarks/results/moe/redo_{eval,vllm}_shapes.csv
#      (moe-redo-eval-h100, moe-redo-vllm-h100);
#   3. moe bf16 training shards TRAIN_SHARDS (default "1/8 2/8"), as benchmarks/device_moe.sh sweeps them.
# It outlives the call that started it; each call watches it for up to WAIT seconds and copies
# the gzipped shards to OUT. A fresh machine resumes from the shards committed under datasets/raw/.
# The loader merges a key measured twice (the median of its stable rows), so a transient spike in
# one run (an unstable row 10x its neighbours) no longer decides an evaluation shape's metrics.
#
#   benchmarks/device_redo.sh OUT WAIT [TRAIN_SHARDS]
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-1/8 2/8}"
run=/tmp/redo
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/fp8bs-redo-*.jsonl.gz datasets/raw/moe-redo-*.jsonl.gz datasets/raw/moe-train-h100-*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --out $run --quiet "$@"; }
        bench --op fp8_blockscale --suite eval --dtype fp8 --mode all --only benchmarks/results/fp8_blockscale/redo_eval_shapes.csv --name fp8bs-redo-eval-h100 &&
        bench --op moe --suite eval --dtype bf16 --mode all --only benchmarks/results/moe/redo_eval_shapes.csv --name moe-redo-eval-h100 &&
        bench --op moe --suite vllm --dtype bf16 --mode all --only benchmarks/results/moe/redo_vllm_shapes.csv --name moe-redo-vllm-h100 &&
        for s in '"$train_shards"'; do bench --op moe --suite train --dtype bf16 --mode sample:24 --shard $s --name moe-train-h100 || exit 1; done &&
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new
exit 0
