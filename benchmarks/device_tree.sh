#!/usr/bin/env bash
# Keep the work tree under the device tool's 64 MiB limit around a device call (docs/decisions/005-the-device-tool-s-64-mib-working.md):
# `stash` moves every tracked file larger than COSTMODEL_STASH_MIN_BYTES (default 100000) out of
# the tree, except the shipped ONNX models and any path matching a KEEP pattern (an extended
# regular expression on the path, e.g. 'datasets/raw/moe-' to let a sweep resume its shards);
# `restore` puts them back. The files go to COSTMODEL_STASH_DIR (default: a folder beside the
# repository), with the list of what moved, so a restore after an interrupted session still
# finds them. A non-empty stash refuses a second stash: restore first.
#
#   benchmarks/device_tree.sh stash [KEEP ...]      # then the device call
#   benchmarks/device_tree.sh restore
#   benchmarks/device_tree.sh size                  # bytes the device call would carry now
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
stash="${COSTMODEL_STASH_DIR:-$(dirname "$root")/.$(basename "$root")-stash}"
min="${COSTMODEL_STASH_MIN_BYTES:-100000}"
list="$stash/moved.list"
action="${1:-}"
shift || true
case "$action" in
    stash)
        if [ -s "$list" ]; then
            echo "device_tree: $stash already holds $(wc -l <"$list") files; run restore first" >&2
            exit 1
        fi
        mkdir -p "$stash"
        keep='^models/[^/]*\.onnx$'
        for k in "$@"; do keep="$keep|$k"; done
        git ls-files -z | xargs -0 -r stat -c '%s %n' -- 2>/dev/null |
            awk -v min="$min" '$1 > min { sub(/^[0-9]+ /, ""); print }' | grep -v -E "$keep" >"$list.tmp" || true
        while IFS= read -r f; do
            mkdir -p "$stash/$(dirname "$f")"
            mv -- "$f" "$stash/$f"
        done <"$list.tmp"
        mv "$list.tmp" "$list"
        echo "device_tree: moved $(wc -l <"$list") files to $stash"
        ;;
    restore)
        if [ ! -f "$list" ]; then
            echo "device_tree: nothing stashed in $stash" >&2
            exit 0
        fi
        missing=0
        while IFS= read -r f; do
            if [ -e "$stash/$f" ]; then
                mkdir -p "$(dirname "$f")"
                mv -- "$stash/$f" "$f"
            else
                echo "device_tree: $f is not in the stash" >&2
                missing=$((missing + 1))
            fi
        done <"$list"
        n=$(wc -l <"$list")
        rm -f "$list"
        echo "device_tree: restored $((n - missing)) of $n files"
        [ "$missing" = 0 ]
        ;;
    size)
        # Tracked files present, plus untracked files git does not ignore: what a device call copies.
        { git ls-files -z; git ls-files -z --others --exclude-standard; } |
            xargs -0 -r stat -c '%s' -- 2>/dev/null | awk '{ s += $1 } END { printf "%d\n", s }' || true
        ;;
    *)
        echo "usage: benchmarks/device_tree.sh stash [KEEP ...] | restore | size" >&2
        exit 2
        ;;
esac
