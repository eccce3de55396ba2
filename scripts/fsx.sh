#!/usr/bin/env bash
# Runs fsx, the file-system exerciser of xfstests, on tablix mounts: a
# daemon without cluster flags in sync mode and in async mode (where the
# kernel's writeback cache holds writes the daemon has not seen yet), and
# a follower of a three-node cluster. fsx applies random reads, writes,
# mapped reads and writes, truncations, fallocate, hole punching, zeroing
# and copies to one file, checks every read against the bytes it expects,
# and stops at the first difference. Needs root, /dev/fuse, and the
# xfstests source: cloned from $FSX_REPO at $FSX_REV (a local clone or
# mirror works as well); only ltp/fsx.c is built. Seeds are fixed, so a
# failure repeats; the script fails if any run does.
#
#   scripts/fsx.sh [TABLIX_BINARY]
#   FSX_OPS=N (operations per run, default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-target/release/tablix}
repo=${FSX_REPO:-https://github.com/kdave/xfstests}
rev=${FSX_REV:-63a29724a85f1999e49bf0a9bf0d22643b6116e5}
ops=${FSX_OPS:-20000}
src=target/fsx/src

tool=fsx
source scripts/preflight.sh
need_mounting "it mounts"
need_packages git gcc

if [[ ! -x $src/fsx ]] || ! at_rev "$src" "$rev"; then
    fresh_clone "$src" "$repo" "$rev"
    # What xfstests' configure would find on Linux with glibc, for the
    # headers fsx.c includes (src/global.h); no AIO, no io_uring.
    cat >"$src/src/config.h" <<'EOF'
#define HAVE_SYS_TYPES_H 1
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_STATVFS_H 1
#define HAVE_SYS_TIME_H 1
#define HAVE_SYS_IOCTL_H 1
#define HAVE_SYS_WAIT_H 1
#define HAVE_MALLOC_H 1
#define HAVE_DIRENT_H 1
#define HAVE_STDLIB_H 1
#define HAVE_UNISTD_H 1
#define HAVE_ERRNO_H 1
#define HAVE_STRING_H 1
#define HAVE_SYS_FCNTL_H 1
#define HAVE_SYS_PARAM_H 1
#define HAVE_LIBGEN_H 1
#define HAVE_ASSERT_H 1
#define HAVE_STRINGS_H 1
#include <getopt.h>
#include <linux/falloc.h>
#include <linux/fs.h>
EOF
    gcc -O2 -D_GNU_SOURCE -I"$src/src" -o "$src/fsx" "$src/ltp/fsx.c"
fi
fsx=$(cd "$src" && pwd)/fsx

source scripts/daemons.sh

failed=0
# fsx_on WHAT MOUNT SEED FSX-FLAGS...: one run, its log kept on failure.
fsx_on() {
    local what=$1 mnt=$2 seed=$3
    shift 3
    local logs="$work/logs-$seed" flags=${*:-"fsx's defaults"}
    mkdir -p "$logs"
    local started=$SECONDS
    if "$fsx" -q -N "$ops" -S "$seed" -P "$logs" "$@" "$mnt/fsx-$seed" >"$logs/out" 2>&1; then
        echo "fsx: $what, seed $seed ($flags): $(tail -n 1 "$logs/out") in $((SECONDS - started)) s"
    else
        echo "fsx: $what, seed $seed ($flags) FAILED after $((SECONDS - started)) s:"
        tail -n 40 "$logs/out"
        mkdir -p target/fsx/failed
        cp -r "$logs" "target/fsx/failed/seed-$seed"
        echo "fsx: its logs are in target/fsx/failed/seed-$seed"
        failed=1
    fi
}

start sync "$work/sync.mnt"
fsx_on "a daemon without cluster flags, sync mode" "$work/sync.mnt" 1
fsx_on "a daemon without cluster flags, sync mode" "$work/sync.mnt" 2 -c 20 -l 4194304 -o 262144

start async "$work/async.mnt" --mode async
fsx_on "a daemon without cluster flags, async mode" "$work/async.mnt" 3
fsx_on "a daemon without cluster flags, async mode" "$work/async.mnt" 4 -c 20 -l 4194304 -o 262144
fsx_on "a daemon without cluster flags, async mode" "$work/async.mnt" 5 -X

start node1 "$work/node1.mnt" --node-id 1 --raft 127.0.0.1:0 --bootstrap
leader=$(ready_field node1 raft)
start node2 "$work/node2.mnt" --node-id 2 --raft 127.0.0.1:0 --join "$leader"
start node3 "$work/node3.mnt" --node-id 3 --raft 127.0.0.1:0 --join "$leader"
fsx_on "a follower of three nodes" "$work/node2.mnt" 6 -c 20
# The file fsx left reads the same through every node's mount, once the
# others applied what the follower's last write committed (the mounts
# read at level none, what each node has applied).
sums=0
for _ in $(seq 1 50); do
    sums=$(for n in 1 2 3; do md5sum <"$work/node$n.mnt/fsx-6"; done | sort -u | wc -l)
    [[ $sums -eq 1 ]] && break
    sleep 0.1
done
if [[ $sums -ne 1 ]]; then
    echo "fsx: the file fsx left on the follower differs between the nodes' mounts"
    failed=1
else
    echo "fsx: the file fsx left on the follower reads the same through all three mounts"
fi
exit $failed
