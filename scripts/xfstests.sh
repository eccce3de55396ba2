#!/usr/bin/env bash
# Runs xfstests' generic tests on tablix mounts of daemons without cluster
# flags, as xfstests runs any FUSE file system (its README.fuse): FSTYP
# fuse, tablix's own mount helper (the binary as /sbin/mount.fuse.tablix)
# starting a daemon on the "device" (a data directory) and returning once
# it is mounted, and the daemon exiting when its file system is unmounted. xfstests mounts and
# unmounts the scratch file system around most tests, so every test gets
# daemons started afresh, and `mkfs` (which it cannot do for FUSE) is its
# removal of every file on the scratch mount.
#
# Needs root and /dev/fuse; installs the Debian packages xfstests builds
# with, clones it from $XFSTESTS_REPO at $XFSTESTS_REV (a local clone or
# mirror works as well) and builds it. Tests listed in
# scripts/xfstests.exclude (each with the reason) are skipped; the script
# fails if any other test fails, and keeps xfstests' results in
# target/xfstests/results.
#
#   scripts/xfstests.sh [TABLIX_BINARY]
#   XFSTESTS_MODE=sync|async   the daemons' --mode (default sync)
#   XFSTESTS_TESTS="..."       what to run, as ./check takes it (default: -g quick)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(realpath -m "${1:-target/release/tablix}")
repo=${XFSTESTS_REPO:-https://github.com/kdave/xfstests}
rev=${XFSTESTS_REV:-63a29724a85f1999e49bf0a9bf0d22643b6116e5}
mode=${XFSTESTS_MODE:-sync}
read -r -a tests <<<"${XFSTESTS_TESTS:--g quick}"
src=target/xfstests/src
helper=/sbin/mount.fuse.tablix

tool=xfstests
source scripts/preflight.sh
need_mounting "it mounts"
if [[ $mode != sync && $mode != async ]]; then
    echo "xfstests: XFSTESTS_MODE must be sync or async, not '$mode'" >&2
    exit 1
fi

# What xfstests' README lists for Debian, less what only other file
# systems' tests use.
packages=(git gcc make automake libtool-bin gawk bc psmisc attr acl quota fio uuid-runtime
    xfsprogs xfslibs-dev uuid-dev libacl1-dev libattr1-dev libaio-dev liburing-dev
    libgdbm-dev libcap-dev e2fsprogs)
need_packages "${packages[@]}"

if [[ ! -x $src/src/fsstress ]] || ! at_rev "$src" "$rev"; then
    fresh_clone "$src" "$repo" "$rev"
    echo "xfstests: building it (a few minutes)" >&2
    make -C "$src" -j"$(nproc)" >"$src/build.log" 2>&1 || {
        tail -n 30 "$src/build.log" >&2
        exit 1
    }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tablix-xfstests.XXXXXX")
cleanup() {
    for m in "$work/test" "$work/scratch"; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    # A daemon exits once its file system is unmounted; wait for it, so
    # nothing it still writes is removed under it.
    for _ in $(seq 1 300); do
        pgrep -f -- "up --data $work/" >/dev/null || break
        sleep 0.1
    done
    pkill -f -- "up --data $work/" 2>/dev/null || true
    rm -f "$helper"
    if [[ -e $work/helper.saved || -L $work/helper.saved ]]; then
        mv "$work/helper.saved" "$helper"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/test" "$work/scratch" "$work/bin"

# mount(8) runs /sbin/mount.fuse.tablix DEVICE MOUNTPOINT -o OPTIONS: the
# tablix binary under that name is its mount helper (`make install` links
# it the same way). One installed already is put back at exit.
if [[ -e $helper || -L $helper ]]; then
    mv "$helper" "$work/helper.saved"
fi
ln -s "$bin" "$helper"

# xfstests unmounts by device; the device is a data directory, which
# umount(8) takes for a mountpoint. This umount, first on xfstests' PATH,
# turns a mounted data directory into its mountpoint.
cat >"$work/bin/umount" <<'EOF'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    if [[ $a != -* ]]; then
        t=$(findmnt -n -S "$a" -o TARGET 2>/dev/null | head -n 1)
        [[ -n $t ]] && a=$t
    fi
    args+=("$a")
done
exec /usr/bin/umount "${args[@]}"
EOF
chmod +x "$work/bin/umount"

cat >"$src/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.tablix
export TEST_DEV=$work/test.data
export TEST_DIR=$work/test
export SCRATCH_DEV=$work/scratch.data
export SCRATCH_MNT=$work/scratch
export MOUNT_OPTIONS="-o mode=$mode"
export TEST_FS_MOUNT_OPTS="-o mode=$mode"
EOF

exclude=$(realpath scripts/xfstests.exclude)
rm -rf "$src/results"
echo "xfstests: ${tests[*]} on tablix in $mode mode" >&2
status=0
(cd "$src" && PATH="$work/bin:$PATH" ./check -E "$exclude" "${tests[@]}") || status=$?
rm -rf target/xfstests/results
cp -r "$src/results" target/xfstests/results 2>/dev/null || true
for d in test scratch; do
    cp "$work/$d.data/daemon.log" "target/xfstests/results/$d-daemon.log" 2>/dev/null || true
done
if ((status != 0)); then
    echo "xfstests: failures above; xfstests' results and the daemons' logs are in target/xfstests/results" >&2
fi
exit $status
