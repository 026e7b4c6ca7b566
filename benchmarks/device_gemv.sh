#!/usr/bin/env bash
# GEMV data on a GPU machine whose calls last at most 10 minutes (issue 18): one driver process in
# its own session runs, in order, the GEMV correctness gate on odd shapes (bf16, fp16, fp8), the
# evaluation shapes with M <= 2 measured again with every candidate (the space grew, so their
# earlier runs are incomplete), then the GEMV configs of the training shapes with M <= 2 (cuBLAS
# timed again in the same run as an anchor), then the foundation benchmark's M <= 2 shapes in full
# (evaluation shapes too), then more M = 1 training shapes (all bf16 ones of the training families,
# 60 fp16, 60 fp8) with the GEMV and TMA swap-AB configs, the two that compete at M = 1. The first GEMV space (gemv-* shards: M <= 4, no
# evict-first) was measured by the same script with the full lists (eval_shapes.csv,
# train_shapes.csv). It outlives the call that started it; each call
# watches it for up to WAIT seconds and copies the gzipped shards to OUT. A fresh machine resumes
# from the shards committed under datasets/raw/ and benchmarks/results/gemv/.
#
# The gemv2-* shards were measured by this script's previous version (`git log` it), with the
# kernel taking N and K at run time. Since the GEMV is compiled per weight shape (N, K and strides
# constant, kernels/gemm/gemv.py) its rows were measured again under gemv3-* names: the same
# lists and sweeps, except that the extra M = 1 training shapes get the GEMV configs only (their
# TMA swap-AB rows from gemv2-train-m1 stand: that kernel did not change).
#
#   benchmarks/device_gemv.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/gemv3
lists=benchmarks/results/gemv
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/gemv3-*.jsonl.gz $lists/gate-gemv3-*-shard*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'; lists='"$lists"'
        bench() { python3 -m gemm_costmodel.cli bench --out $run --quiet --dtype bf16 fp16 fp8 "$@"; }
        # "done" only when every sweep finished: a failed one is resumed by the next call.
        bench --shapes $lists/gate_shapes.csv --mode variant:gemv --name gate-gemv3-h100 &&
        bench --suite train --only $lists/eval_shapes_m2.csv --mode all --name gemv3-eval-h100 &&
        bench --suite train --only $lists/train_shapes_m2.csv --mode variant:gemv --name gemv3-train-h100 &&
        bench --suite foundation --dtype bf16 --only $lists/foundation_shapes_m2.csv --mode all --name gemv3-foundation-bf16-h100 &&
        bench --suite train --only $lists/train_shapes_m1_more.csv --mode variant:gemv --name gemv3-train-m1-h100 &&
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new
exit 0
