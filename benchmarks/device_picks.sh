#!/usr/bin/env bash
# Model-guided training rows on a machine of several GPUs (issues 16 and 17): one process per GPU
# (`bench --devices G`, each taking shard i/G of every sweep), one driver in its own session
# running, in order:
#   1. fp8_blockscale: the configs benchmarks/results/fp8_blockscale/active/picks.csv lists per
#      training problem (2 <= M <= 512), plus the vendor as the run's anchor (fp8bs-trainactive-GPU, GPU h100 or h200);
#   2. MoE round 3: the configs benchmarks/results/moe/active/picks3.csv lists (every training
#      problem with M >= 16 that rounds 1-2 did not pick; the train and train_skewed suites), as
#      device_moe_active.sh measured rounds 1-2 (moe-trainactive3[s][-fp8]-GPU);
#   3. fp8_blockscale at M = 1: the evaluation shapes again with every candidate (fp8bs-redo2-eval-GPU:
#      a second complete run per shape, so their oracle is the mean of two) and the training shapes'
#      GEMV configs again (fp8bs-traingemv2-GPU).
# The driver outlives the call that started it; each call watches it for up to WAIT seconds and
# packs the gzipped shards into OUT/shards.tar (a call returns at most 8 files; G GPUs write G
# shards per sweep). A fresh machine resumes from the shards committed under datasets/raw/.
#
#   benchmarks/device_picks.sh OUT WAIT [GPUS] [STEPS] [CARD]
# WAIT plus about 40 s of packing must fit in the call's time limit (a call that runs past it
# returns no file; a call with WAIT 1 then collects what the driver wrote).
# STEPS (default "fp8bs moe m1") picks which of the three to run, in that order. CARD (default h100,
# "any" for none) is the card the rows must come from: picks timed on H200s made the H100 models
# worse (benchmarks/results/picks/README.md), so on another card the script measures nothing.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; gpus="${3:-$(nvidia-smi -L | wc -l)}"; steps="${4:-fp8bs moe m1}"
# The sweeps are named after the card they ran on (a call for H100s may be given H200s).
tag=$(card_tag)
require_card "${5:-h100}"
run=/tmp/picks
res=benchmarks/results/fp8_blockscale
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/fp8bs-trainactive-$tag-*.jsonl.gz datasets/raw/moe-trainactive3*-$tag-*.jsonl.gz \
        datasets/raw/fp8bs-redo2-eval-$tag-*.jsonl.gz datasets/raw/fp8bs-traingemv2-$tag-*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'; res='"$res"'; g='"$gpus"'; t='"$tag"'
        bench() { python3 -m gemm_costmodel.cli bench --out $run --quiet --devices $g "$@"; }
        moe=benchmarks/results/moe/active/picks3.csv
        step() { case " '"$steps"' " in *" $1 "*) return 0;; esac; return 1; }
        if step fp8bs; then
            bench --op fp8_blockscale --suite train --dtype fp8 --mode pick:$res/active/picks.csv --name fp8bs-trainactive-$t || exit 1
        fi
        if step moe; then
            bench --op moe --suite train --dtype bf16 --mode pick:$moe --name moe-trainactive3-$t &&
            bench --op moe --suite train_skewed --dtype bf16 --mode pick:$moe --name moe-trainactive3s-$t &&
            bench --op moe --suite train --dtype fp8 --mode pick:$moe --name moe-trainactive3-fp8-$t &&
            bench --op moe --suite train_skewed --dtype fp8 --mode pick:$moe --name moe-trainactive3s-fp8-$t || exit 1
        fi
        if step m1; then
            bench --op fp8_blockscale --suite eval --dtype fp8 --mode all --only $res/gemv_eval_shapes.csv --name fp8bs-redo2-eval-$t &&
            bench --op fp8_blockscale --suite train --dtype fp8 --mode variant:gemv --only $res/gemv_train_shapes.csv --name fp8bs-traingemv2-$t || exit 1
        fi
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
collect_tar "$run" "$out" "$wait_s" 30
exit 0
