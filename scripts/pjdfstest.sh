#!/usr/bin/env bash
# Runs pjdfstest, the POSIX file-system conformance suite, on two tablix
# mounts: a daemon without cluster flags, and a follower of a three-node
# cluster (whose every change goes through the leader and comes back as an
# applied log entry). Needs root, /dev/fuse, and the suite's source: it is
# cloned from $PJDFSTEST_REPO at $PJDFSTEST_REV (a local clone or mirror
# works as well), then built with autotools. Each run prints prove's
# summary; the script fails if either run does.
#
#   scripts/pjdfstest.sh [TABLIX_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-target/release/tablix}
repo=${PJDFSTEST_REPO:-https://github.com/pjd/pjdfstest}
rev=${PJDFSTEST_REV:-85a8aea9e685999ef0540392fd80535f873d7ff7}
src=target/pjdfstest/src

tool=pjdfstest
source scripts/preflight.sh
need_mounting "the suite changes owners and mounts"
need_packages git autoconf automake gcc make perl

if [[ ! -x $src/pjdfstest ]] || ! at_rev "$src" "$rev"; then
    fresh_clone "$src" "$repo" "$rev"
    (cd "$src" && autoreconf -ifs >/dev/null 2>&1 && ./configure >/dev/null && make -s pjdfstest)
fi
suite=$(cd "$src" && pwd)

source scripts/daemons.sh

failed=0
suite_on() {
    local what=$1 mnt=$2
    mkdir -p "$mnt/pjdfstest"
    echo "pjdfstest: $what ($mnt)"
    local started=$SECONDS
    if (cd "$mnt/pjdfstest" && prove -r "$suite/tests") >"$work/prove.out" 2>&1; then
        tail -n 2 "$work/prove.out"
    else
        grep -v ' ok$' "$work/prove.out" | tail -n 40
        failed=1
    fi
    echo "pjdfstest: $what took $((SECONDS - started)) s"
}

start plain "$work/plain.mnt"
suite_on "a daemon without cluster flags" "$work/plain.mnt"

start node1 "$work/node1.mnt" --node-id 1 --raft 127.0.0.1:0 --bootstrap
leader=$(ready_field node1 raft)
start node2 "$work/node2.mnt" --node-id 2 --raft 127.0.0.1:0 --join "$leader"
start node3 "" --node-id 3 --raft 127.0.0.1:0 --join "$leader"
suite_on "a follower of three nodes" "$work/node2.mnt"
# Node 2 stood no election: its writes all went through node 1.
role=$(curl -s "$(ready_field node2 http)/status" |
    python3 -c 'import json, sys; c = json.load(sys.stdin)["cluster"]; print(c["state"], c["term"])')
echo "pjdfstest: node 2 ended as: $role (term 1 means no leader changed)"

exit "$failed"
