#!/usr/bin/env bash
# One generic device driver: runs the `costmodel bench` sweeps a campaign file lists, in order, in
# one process session that outlives the device call which started it; each call (this script
# again, same arguments) watches it for up to WAIT seconds and copies the shards written since the
# driver started to OUT. A sweep that finished leaves RUN/NAME.<hash of its line>.done and is skipped by a resumed
# driver; a fresh machine resumes from shards committed under datasets/raw/.
#
#   benchmarks/device_campaign.sh CAMPAIGN OUT WAIT
#
# CAMPAIGN: a text file, one sweep per line: `NAME BENCH-ARGS...` (NAME is the shard prefix, the
# rest goes to `costmodel bench` as is); blank lines and lines starting with # are skipped. A line
# `!NAME COMMAND...` runs COMMAND with bash instead, with $EXTRA set to a folder of its own
# (RUN/extra/NAME) for what it writes; each call packs RUN/extra into OUT/extra.tar.gz.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/device_watch.sh"
campaign="$1"; out="$2"; wait_s="$3"
run=/tmp/campaign-$(basename "$campaign" .txt)
mkdir -p "$out" "$run"
if driver_needed "$run" "$run/done"; then
    resume_shards "$run" datasets/raw/*.jsonl.gz
    cp "$campaign" "$run/campaign.txt"
    setsid nohup bash -c '
        run='"$run"'
        while read -r name args; do
            case "$name" in ""|"#"*) continue ;; esac
            raw=; case "$name" in "!"*) raw=1; name="${name#!}" ;; esac
            # Two lines may share a NAME (shards of one sweep: --shard 1/8, --shard 2/8): the done mark
            # carries a hash of the line so the second is not taken for the first.
            mark="$run/$name.$(printf %s "$args" | md5sum | cut -c1-8).done"
            [ -f "$mark" ] && continue
            echo "$(date +%T) start $name" >&2
            case "$raw" in
                1) export EXTRA="$run/extra/$name"; mkdir -p "$EXTRA"
                      bash -c "$args" >"$EXTRA/stdout.log" 2>"$EXTRA/stderr.log" </dev/null || { echo "$(date +%T) FAILED $name" >&2; continue; } ;;
                *) python3 -m gemm_costmodel.cli bench --out "$run" --name "$name" --quiet $args </dev/null || { echo "$(date +%T) FAILED $name" >&2; continue; } ;;
            esac
            touch "$mark"; echo "$(date +%T) done $name" >&2
        done <"$run/campaign.txt"
        touch "$run/done"' >"$run/driver.out" 2>"$run/driver.err" &
    echo $! >"$run/pid"
fi
watch_and_collect "$run" "$out" "$wait_s" new 30
[ -d "$run/extra" ] && tar czf "$out/extra.tar.gz" -C "$run" extra
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null
exit 0
