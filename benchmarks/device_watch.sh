# Sourced by benchmarks/device_campaign.sh (and any one-off driver): what every device call shares
# (start or resume the driver, then watch it and collect its shards). The one-off campaign
# drivers that used to live beside it are in git history (issue 56); a campaign is now a file
# under benchmarks/campaigns/.

# pid_alive PID: true while PID runs. A driver that exited but that its new parent (the driver is
# detached, so a subreaper inherits it) has not reaped yet is a zombie, which kill -0 still finds:
# taken for alive, it kept a resumed campaign from starting (tests/test_device_scripts.py).
pid_alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 0  # no ps here: trust kill -0
    case "$st" in Z*) return 1 ;; esac
}

# driver_needed RUN DONE: true when no driver of RUN is alive (pid in RUN/pid) and its "finished"
# marker DONE is absent, i.e. this call must start one.
driver_needed() {
    ! pid_alive "$(cat "$1/pid" 2>/dev/null)" && [ ! -f "$2" ]
}

# resume_shards RUN FILE...: each committed shard FILE (.jsonl.gz) unzipped into RUN unless it is
# there already, so a sweep on a fresh machine skips the shapes measured before.
resume_shards() {
    local run="$1" f b
    shift
    for f in "$@"; do
        [ -f "$f" ] || continue
        b=$(basename "${f%.gz}")
        [ -f "$run/$b" ] || gunzip -c "$f" >"$run/$b"
    done
}

# watch_and_collect RUN OUT WAIT [new] [INTERVAL]
# Prints the row count of every shard under RUN every INTERVAL s (default 20) until the driver whose pid is in
# RUN/pid exits or WAIT seconds pass, then gzips the shards into OUT ("new": only those written
# since the driver started, as a call returns at most 8 files), packs the per-shape logs and the
# driver's output into OUT/logs.tar.gz, and prints the driver's last lines of stderr.
watch_and_collect() {
    local run="$1" out="$2" wait_s="$3" only_new="${4:-}" interval="${5:-20}" start alive counts f
    start=$(date +%s)
    while :; do
        alive=0; pid_alive "$(cat "$run/pid")" && alive=1
        counts=$(for f in "$run"/*.jsonl; do [ -f "$f" ] && printf "%s=%s " "$(basename "$f" .jsonl)" "$(wc -l <"$f")"; done)
        echo "$(date +%T) alive=$alive $counts"
        [ "$alive" = 0 ] && break
        [ $(( $(date +%s) - start )) -ge "$wait_s" ] && break
        sleep "$interval"
    done
    if [ "$only_new" = new ]; then
        for f in $(find "$run" -name '*-shard*.jsonl' -newer "$run/pid"); do gzip -c "$f" >"$out/$(basename "$f").gz"; done
    else
        for f in "$run"/*-shard*.jsonl; do [ -f "$f" ] && gzip -c "$f" >"$out/$(basename "$f").gz"; done
    fi
    tar czf "$out/logs.tar.gz" -C "$run" $(cd "$run" && ls *.shapes.log driver.out driver.err probe.err 2>/dev/null) 2>/dev/null
    tail -n 30 "$run/driver.err"
}

# card_tag: this machine's GPU model in lower case ("h100", "h200"), or "gpu" if none is named
# (a call for H100s may be given H200s: an H100-only campaign checks it before measuring).
card_tag() {
    local t
    t=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]00' | tr A-Z a-z)
    echo "${t:-gpu}"
}

# require_card WANT: exit 2, measuring nothing, unless WANT is "any" or this machine's card_tag.
require_card() {
    local have
    have=$(card_tag)
    if [ "$1" != any ] && [ "$have" != "$1" ]; then
        echo "this machine's GPUs are $have, not $1: nothing measured" >&2
        exit 2
    fi
}

# collect_tar RUN OUT WAIT INTERVAL: watch_and_collect the shards written since the driver started
# into OUT/shards.tar (a call returns at most 8 files; several GPUs write a shard each), beside
# OUT/logs.tar.gz. A tar over 15 MiB is split into OUT/shards.tar.part-aa, -ab, ... (`cat` them
# back together), because a file over 16 MiB does not come back at all: a four-GPU sweep's 17
# training shards (about 20 MB) were lost that way. WAIT plus about 40 s of packing must fit in
# the call's time limit.
collect_tar() {
    local run="$1" out="$2"
    rm -rf "$run/collect"; mkdir -p "$run/collect"
    watch_and_collect "$run" "$run/collect" "$3" new "$4"
    mv "$run/collect/logs.tar.gz" "$out/" 2>/dev/null
    tar cf "$out/shards.tar" -C "$run/collect" .
    if [ "$(stat -c %s "$out/shards.tar")" -gt $((15 * 1024 * 1024)) ]; then
        split -b 15M "$out/shards.tar" "$out/shards.tar.part-" && rm "$out/shards.tar"
        ls "$out"/shards.tar.part-* | wc -l | xargs echo "shards.tar split into parts:"
    fi
}

# sweep_driver RUN OUT WAIT SCRIPT [SHARD...]: the one-driver scheme of a single-sweep driver.
# Unless a driver of RUN is alive or RUN/done exists, resume the committed SHARDs into RUN and start
# SCRIPT (bash, with $run set to RUN; a failing step must exit non-zero) in its own session, so it
# outlives this call, touching RUN/done only when SCRIPT succeeds; then collect_tar every 20 s.
sweep_driver() {
    local run="$1" out="$2" wait_s="$3" script="$4"
    shift 4
    mkdir -p "$out" "$run"
    if driver_needed "$run" "$run/done"; then
        resume_shards "$run" "$@"
        setsid nohup bash -c "run='$run'; ( $script ) && touch \"\$run/done\"" \
            >"$run/driver.out" 2>"$run/driver.err" &
        echo $! >"$run/pid"
    fi
    collect_tar "$run" "$out" "$wait_s" 20
}
