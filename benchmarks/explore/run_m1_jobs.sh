#!/bin/bash
# Exploration driver (device host CPUs): runs fp8bs_m1_loop.py once per "name seed" job given as
# arguments NAME:SEED, with the variant JSON in $VARIANTS, P jobs at a time, NT xgboost threads each (1),
# writing NAME_sSEED.csv and a log line each under $OUT (skips jobs already done, so a rerun resumes).
set -u
P=${P:-16}
EXTRA=${EXTRA:-}
for job in "$@"; do
  name=${job%%:*}; seed=${job##*:}
  [ -f "$OUT/${name}_s${seed}.csv" ] && continue
  echo "$name $seed"
done | xargs -P "$P" -n 2 sh -c 'python3 benchmarks/explore/fp8bs_m1_loop.py --variants "$(python3 -c "import json,os,sys; v=json.loads(os.environ[\"VARIANTS\"])[sys.argv[1]]; v[\"nthread\"]=int(os.environ.get(\"NT\", \"1\")); print(json.dumps({sys.argv[1]: v}))" "$0")" --seeds "$1" $EXTRA --out "$OUT" >> "$OUT/log_$0_$1.txt" 2>&1'
