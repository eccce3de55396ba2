#!/usr/bin/env bash
# Installs what building and testing tablix needs on a fresh Debian machine,
# skipping whatever is already there. Safe to run repeatedly.
set -euo pipefail

# Debian packages: a C compiler and headers for the bundled SQLite; the
# system SQLite the C page-cache test links against; the tools the
# benchmarks and tests call (script(1) gives the shell test a terminal,
# valgrind counts the benchmarks' instructions, python3 runs the rqlite
# client libraries against the daemon; fuse3 gives fusermount3 for
# unprivileged mounts and mount.fuse3; util-linux's setpriv runs the POSIX
# suite as another user; bonnie++ and postmark are the file-system
# benchmarks).
packages=(gcc libc6-dev make pkg-config procps bsdutils util-linux libsqlite3-dev valgrind curl python3 python3-venv fuse3 bonnie++ postmark tar findutils coreutils gzip bash)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}" >&2
    if [[ $(id -u) -ne 0 ]]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is missing; install Rust $(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml) with rustup" >&2
    exit 1
fi
# The toolchain pinned in rust-toolchain.toml, with rustfmt and clippy.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi
