# Daemons for the scripts that run outside suites against tablix mounts
# (pjdfstest.sh, fsx.sh), sourced after they set `bin` (the tablix binary)
# and `tool` (their name, for messages). Makes `work`, a scratch directory
# removed at exit with every daemon started here stopped and its mount
# gone, and defines `start` and `ready_field`.

work=$(mktemp -d "${TMPDIR:-/tmp}/tablix-$tool.XXXXXX")
pids=()
mounts=()
cleanup() {
    # Each daemon unmounts its file system as it stops.
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Starts a daemon: start NAME MOUNTPOINT-OR-"" ARGS...; waits for its
# ready line, which is left in $work/NAME.out.
start() {
    local name=$1 mnt=$2
    shift 2
    local args=(up --data "$work/$name.data" --http 127.0.0.1:0 --exit-with-parent "$@")
    if [[ -n $mnt ]]; then
        mkdir -p "$mnt"
        args+=("$mnt")
        mounts+=("$mnt")
    fi
    "$bin" "${args[@]}" >"$work/$name.out" 2>"$work/$name.log" &
    pids+=($!)
    for _ in $(seq 1 600); do
        if grep -q '^tablix ready' "$work/$name.out"; then
            return 0
        fi
        if ! kill -0 "${pids[-1]}" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "$tool: daemon $name did not start:" >&2
    cat "$work/$name.log" >&2
    exit 1
}

# A field of daemon NAME's ready line: ready_field NAME FIELD.
ready_field() {
    sed -n "s/.* $2=\([^ ]*\).*/\1/p" "$work/$1.out"
}
