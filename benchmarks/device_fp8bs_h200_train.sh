#!/usr/bin/env bash
# fp8_blockscale training shards on H200s (issue 16): the H100's training sweep (sample:40 per
# shape, the same seed and 24-way shard split, so each shape gets the configs the H100 measured)
# as fp8bs-train-h200. Why: the runtime serves an H200 with the H100-trained model, which picks
# within 2% on 85% of that card's held-out M > 1 shapes against 91-94% on the H100's own; the
# H200's M = 1 training rows and every evaluation shape were measured earlier, its M > 1 training
# rows were not. One sweep process per GPU, each on its own shards in turn (GPU g of n takes the
# g-th, (g+n)-th, ... of SHARDS), all under one driver (device_watch.sh's sweep_driver), so a
# machine of several GPUs measures that many shards at once; only on H200s.
#
#   benchmarks/device_fp8bs_h200_train.sh OUT WAIT ["0/24 1/24 ..."]
# WAIT plus about 40 s of packing must fit in the call's time limit. SHARDS defaults to the 17
# the shipped H100 data holds (0-16 of 24). The sweep resumes from the committed shards
# (datasets/raw/fp8bs-train-h200-*.jsonl.gz): let them travel (about 14 MB) when the rest of
# datasets/raw/ stays behind. Four H200s measure about four shards in six minutes.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
shards="${3:-$(seq -s ' ' -f '%g/24' 0 16)}"
require_card h200
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "$ngpu GPUs; shards: $shards"
sweep_driver /tmp/fp8bsh200train "$out" "$wait_s" '
    set -- '"$shards"'
    pids=()
    for ((g = 0; g < '"$ngpu"'; g++)); do
        (
            i=0
            for s in "$@"; do
                if [ $((i % '"$ngpu"')) = $g ]; then
                    CUDA_VISIBLE_DEVICES=$g python3 -m gemm_costmodel.cli bench --op fp8_blockscale --suite train \
                        --dtype fp8 --mode sample:40 --shard $s --name fp8bs-train-h200 --out $run --quiet || exit 1
                fi
                i=$((i + 1))
            done
        ) 2>"$run/gpu$g.err" &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait $p || rc=1; done
    tail -n 5 "$run"/gpu*.err >&2
    exit $rc' datasets/raw/fp8bs-train-h200-*.jsonl.gz
exit 0
