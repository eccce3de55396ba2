#!/usr/bin/env bash
# Installs what building and testing tablix needs on a fresh Debian machine,
# skipping whatever is already there. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=install-deps
source scripts/preflight.sh

# Debian packages: a C compiler and headers for the bundled SQLite; the
# system SQLite the C page-cache test links against; the tools the
# benchmarks and tests call (script(1) gives the shell test a terminal,
# valgrind counts the benchmarks' instructions, python3 runs the rqlite
# client libraries against the daemon; fuse3 gives fusermount3 for
# unprivileged mounts and mount.fuse3; util-linux's setpriv runs the POSIX
# suite as another user; bonnie++ and postmark are the file-system
# benchmarks).
packages=(gcc libc6-dev make pkg-config procps bsdutils util-linux libsqlite3-dev valgrind curl python3 python3-venv fuse3 bonnie++ postmark tar findutils coreutils gzip bash)
need_packages "${packages[@]}"

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is missing; install Rust $(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml) with rustup" >&2
    exit 1
fi
# The toolchain pinned in rust-toolchain.toml, with rustfmt and clippy.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi
