#!/usr/bin/env bash
# Model-guided MoE training rows (issue 17): on a seeded sample of training problems with M >= 16,
# the configs a model trained on the training families alone ranks best and no committed row of
# the problem holds yet (benchmarks/explore/active_picks.py wrote the lists under
# benchmarks/results/moe/active/), plus the vendor as the run's anchor. ROUND "" (the first,
# picks.csv -> moe-trainactive-*) or 2 (picks2.csv -> moe-trainactive2-*). The same driver, watch
# and resume scheme as device_moe_recip.sh.
#
#   benchmarks/device_moe_active.sh OUT WAIT [ROUND]
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
out="$1"; wait_s="$2"; round="${3:-}"
run=/tmp/moeactive$round
picks=benchmarks/results/moe/active/picks$round.csv
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/moe-trainactive$round-*.jsonl.gz
    setsid nohup bash -c '
        run='"$run"'
        bench() { python3 -m gemm_costmodel.cli bench --op moe --out $run --quiet "$@"; }
        bench --suite train --dtype bf16 --mode pick:'"$picks"' --name moe-trainactive'"$round"'-h100 &&
        bench --suite train --dtype fp8 --mode pick:'"$picks"' --name moe-trainactive'"$round"'-fp8-h100 || exit 1
        touch $run/done' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
exit 0
