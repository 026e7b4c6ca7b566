#!/usr/bin/env bash
# MoE data on a GPU machine whose calls last at most 10 minutes (issue 17): one driver process in
# its own session runs, in order, the vendor probe, the correctness gate on odd shapes (bf16 and
# fp8), the vLLM-tuned shapes and the held-out evaluation shapes (every candidate), then training
# shards (a sample of candidates per shape); it outlives the call that started it, and each call
# watches it for up to WAIT seconds and copies the gzipped shards it wrote to OUT (a call returns at most 8 files). A fresh machine resumes
# from the shards committed under datasets/raw/ and benchmarks/results/moe/.
#
#   benchmarks/device_moe.sh OUT WAIT [TRAIN_SHARDS] [DTYPE] [TRAIN_SUITE]
# DTYPE (default bf16) names the sweeps' dtype: fp8 writes moe-*-fp8-h100 shards (w8a8, per-tensor
# scales; the gate covers both dtypes either way). TRAIN_SUITE (default train) is the sampled
# suite of the shards; any other (train_skewed) runs alone, without the gate, vLLM and evaluation
# sweeps before it, for each dtype of DTYPE in turn ("bf16 fp8": both), and writes
# moe-<suite without _>[-fp8]-h100 shards.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; train_shards="${3:-0/8}"; dtype="${4:-bf16}"; suite="${5:-train}"
sfx=""; [ "$dtype" = bf16 ] || sfx="-${dtype// /-}"
# The fixed sweeps run before the train suite only.
fixed=1; [ "$suite" = train ] || fixed=0
[ "$fixed" = 1 ] || sfx="-${suite//_/}$sfx"
run=/tmp/moe
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done$sfx"; then
    resume_shards "$run" datasets/raw/moe-*.jsonl.gz benchmarks/results/moe/*-shard*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        [ -s $run/probe.jsonl ] || [ -s benchmarks/results/moe/vendor_probe.jsonl ] || python3 benchmarks/explore/moe_vendor_probe.py >$run/probe.jsonl 2>$run/probe.err
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        # "done" only when every sweep finished: a failed one is resumed by the next call.
        if [ '"$fixed"' = 1 ]; then
            bench --suite gate --dtype bf16 fp8 --mode sample:40 --name gate-moe-h100 &&
            bench --suite vllm --dtype '"$dtype"' --mode all --name moe-vllm'"$sfx"'-h100 &&
            bench --suite eval --dtype '"$dtype"' --mode all --name moe-eval'"$sfx"'-h100 || exit 1
        fi &&
        for dt in '"$dtype"'; do
            name=moe-train'"$sfx"'-h100
            [ '"$fixed"' = 1 ] || { name=moe-'"${suite//_/}"'-h100; [ $dt = bf16 ] || name=moe-'"${suite//_/}"'-$dt-h100; }
            for s in '"$train_shards"'; do bench --suite '"$suite"' --dtype $dt --mode sample:24 --shard $s --name $name || exit 1; done
        done &&
        touch $run/done'"$sfx"'' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new
cp "$run/probe.jsonl" "$out/vendor_probe.jsonl" 2>/dev/null
exit 0
