#!/usr/bin/env bash
# The fp8_blockscale GEMV (M = 1) joins the space (issue 16): on a GPU machine whose calls last at
# most 10 minutes, one driver process in its own session runs, in order:
#   1. the correctness gate, the GEMV configs on the gate's odd shapes (gate-fp8bsgemv-h100);
#   2. the evaluation shapes with M = 1 (benchmarks/results/fp8_blockscale/gemv_eval_shapes.csv),
#      every candidate in one run per shape (fp8bs-evalgemv-h100), so their oracle includes it;
#   3. the training shapes with M = 1 (gemv_train_shapes.csv), the GEMV configs (fp8bs-traingemv-h100;
#      the dense op's variant: scheme; the vendor does not run at M = 1, so no row anchors the runs).
# It outlives the call that started it; each call watches it for up to WAIT seconds and copies the
# gzipped shards to OUT. A fresh machine resumes from the shards committed under datasets/raw/.
#
#   benchmarks/device_fp8bs_gemv.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/fp8bsgemv
res=benchmarks/results/fp8_blockscale
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/fp8bs-*gemv-*.jsonl.gz $res/gate-fp8bsgemv-*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'; res='"$res"'
        bench() { python3 -m gemm_costmodel.cli bench --op fp8_blockscale --dtype fp8 --out $run --quiet "$@"; }
        bench --suite gate --mode variant:gemv --name gate-fp8bsgemv-h100 &&
        # A gate row that is not ok stops the driver: the sweeps would record the same failure.
        python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; bad=[x for x in r if x[\"status\"]!=\"ok\"]; print(len(r),\"gate rows,\",len(bad),\"not ok\",file=sys.stderr); sys.exit(bool(bad) or not r)" $run/gate-fp8bsgemv-h100-shard00of01.jsonl &&
        bench --suite eval --mode all --only $res/gemv_eval_shapes.csv --name fp8bs-evalgemv-h100 &&
        bench --suite train --mode variant:gemv --only $res/gemv_train_shapes.csv --name fp8bs-traingemv-h100 &&
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s"
exit 0
