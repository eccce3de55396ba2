# The two commands of the README are `make run` and `make test`.
CARGO ?= cargo
# Arguments for `make run`, e.g. make run ARGS="--mode async".
ARGS ?=
# Where `make run` mounts the file system.
MOUNT ?= $(HOME)/tablix

.PHONY: deps run test lint build install bench bench-insert bench-tps bench-pcache bench-log bench-fs bench-pipe bench-hostile soak jepsen conformance fsx xfstests pcache-c-test rqlite-clients-test

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --release --locked -p tablix

## Start the daemon in the foreground with the default data directory,
## the file system mounted at $(MOUNT).
run: build
	mkdir -p $(MOUNT)
	./target/release/tablix up $(ARGS) $(MOUNT)

## Install the binary and the mount helper, so that
## `mount -t fuse.tablix DATA_DIR MOUNTPOINT -o mode=async` and fstab work.
PREFIX ?= /usr/local
install: build
	install -D -m 755 target/release/tablix $(DESTDIR)$(PREFIX)/bin/tablix
	install -d $(DESTDIR)/sbin
	ln -sf $(PREFIX)/bin/tablix $(DESTDIR)/sbin/mount.fuse.tablix

## Every test: formatting, lints, unit, property, integration and crash
## tests, and the page cache used from a C program. Tests that mount
## (FUSE, tmpfs) or need the kernel's process events are #[ignore]d and
## run here as root; under CI=true not being root is a failure.
test: deps lint
	$(CARGO) test --workspace --locked
	@if [ "$$(id -u)" = 0 ]; then \
		$(CARGO) test --workspace --locked -- --ignored; \
	elif [ "$$CI" = true ]; then \
		echo "make test: the root-only tests must run under CI, but this is not root" >&2; exit 1; \
	else \
		echo "make test: not root, so the root-only (#[ignore]d) tests did not run" >&2; \
	fi
	$(MAKE) pcache-c-test
	$(MAKE) rqlite-clients-test

## The Jepsen-style tests for a minute each (make test runs them for
## 3 s and 10 s): register operations checked for linearizability and
## bank transfers on three nodes, in one process while partitions and a
## lossy network come and go, then on three daemons through their HTTP
## APIs while daemons are killed with SIGKILL and paused (root, FUSE).
## JEPSEN_ROUNDS=N runs both N times, the first with the tests' own seeds
## and each later one with a seed of its own (printed); JEPSEN_SECONDS
## sets the length (the check's memoized search took 86 ms for the
## in-process test's 180 s history: 3,996 operations, 58 in flight).
JEPSEN_SECONDS ?= 60
JEPSEN_ROUNDS ?= 1
jepsen: deps
	set -e; for round in $$(seq 1 $(JEPSEN_ROUNDS)); do \
	  if [ $$round -gt 1 ]; then export TABLIX_JEPSEN_SEED=$$((0x5EED0000 + round)); fi; \
	  TABLIX_JEPSEN_SECONDS=$(JEPSEN_SECONDS) $(CARGO) test --release --locked -p tablix-raft --test raft jepsen -- --nocapture; \
	  TABLIX_JEPSEN_SECONDS=$(JEPSEN_SECONDS) $(CARGO) test --release --locked -p tablix --test daemon jepsen -- --include-ignored --nocapture; \
	done

## pjdfstest, the POSIX file-system conformance suite, on a plain
## daemon's mount and on a follower's of three nodes (root, FUSE; clones
## the suite, pinned, from PJDFSTEST_REPO: a local mirror works).
conformance: build
	./scripts/pjdfstest.sh target/release/tablix

## fsx, xfstests' file-system exerciser (random I/O checked byte for
## byte), on a plain daemon's mount in sync and async mode and on a
## follower's of three nodes (root, FUSE; clones xfstests, pinned, from
## FSX_REPO and builds only fsx).
fsx: build
	./scripts/fsx.sh target/release/tablix

## xfstests' generic tests (the quick group by default, XFSTESTS_TESTS
## to choose) on plain daemons' mounts, XFSTESTS_MODE sync or async (root,
## FUSE; installs the Debian packages it builds with, clones xfstests,
## pinned, from XFSTESTS_REPO, and installs /sbin/mount.fuse.tablix while
## it runs; expected failures, with reasons, in scripts/xfstests.exclude).
xfstests: build
	./scripts/xfstests.sh target/release/tablix

## Existing rqlite client libraries (pinned, in a venv) against the daemon.
RQ_VENV = target/rqlite-clients-venv
rqlite-clients-test:
	$(CARGO) build --locked -p tablix
	test -x $(RQ_VENV)/bin/python || python3 -m venv $(RQ_VENV)
	$(RQ_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/rqlite-clients/requirements.txt
	$(RQ_VENV)/bin/python tests/rqlite-clients/test_clients.py target/debug/tablix

## The page cache as a static library, used by a C program linked against
## the system SQLite, under every policy.
PCACHE_LIB = target/pcache-c/release/libtablix_pcache.a
pcache-c-test:
	$(CARGO) build --locked --release -p tablix-pcache --target-dir target/pcache-c
	cc -O2 -Wall -Wextra -Werror -Icrates/tablix-pcache/include crates/tablix-pcache/c/install_test.c \
		$(PCACHE_LIB) -lsqlite3 -lpthread -ldl -lm -o target/pcache-c/install_test
	for p in lru lfu-hist s3-fifo s3-lru w-tinylfu; do ./target/pcache-c/install_test $$p || exit 1; done

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## Benchmarks (not part of `make test`).
bench: bench-insert bench-tps bench-log bench-pcache bench-fs bench-pipe bench-hostile

bench-pcache: build
	$(CARGO) build --locked --release -p tablix-pcache --target-dir target/pcache-c
	./target/release/tablix bench pcache --instructions --pcache-lib $(PCACHE_LIB) $(BENCH_ARGS)

bench-insert: build
	./target/release/tablix bench insert $(BENCH_ARGS)

## The seed's TPS benchmark: interactive transactions against stock SQLite.
bench-tps: build
	./target/release/tablix bench tps $(BENCH_ARGS)

## Where a command log should live, against the state's commit alone.
bench-log: build
	./target/release/tablix bench log $(BENCH_ARGS)

## The file system against ext4 on the same disk (needs root).
bench-fs: build
	./target/release/tablix bench fs $(BENCH_ARGS)

## Database pipes against kernel pipes (needs root: it mounts).
bench-pipe: build
	./target/release/tablix bench pipe $(BENCH_ARGS)

## The mount's latency and the daemon's memory under hostile SQL clients
## (needs root: it mounts).
bench-hostile: build
	./target/release/tablix bench hostile $(BENCH_ARGS)

## The soak: the hostile benchmark over more files and longer phases.
soak: build
	./target/release/tablix bench hostile --files 20000 --seconds 60 $(BENCH_ARGS)
