#!/usr/bin/env bash
# Model-guided MoE training rows (issue 17): on a seeded sample of training problems with M >= 16,
# the configs a model trained on the training families alone ranks best and no committed row of
# the problem holds yet (benchmarks/explore/moe_active_picks.py wrote the list,
# benchmarks/results/moe/active/picks.csv), plus the vendor as the run's anchor. The same driver,
# watch and resume scheme as device_moe_recip.sh.
#
#   benchmarks/device_moe_active.sh OUT WAIT
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"
run=/tmp/moeactive
picks=benchmarks/results/moe/active/picks.csv
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-*active*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite train --dtype bf16 --mode pick:'"$picks"' --name moe-trainactive-h100 &&
        bench --suite train --dtype fp8 --mode pick:'"$picks"' --name moe-trainactive-fp8-h100 || exit 1
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
