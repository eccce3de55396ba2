# The two commands of the README are `make run` and `make test`.
CARGO ?= cargo
# Arguments for `make run`, e.g. make run ARGS="--mode async".
ARGS ?=

.PHONY: deps run test lint build bench bench-insert

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --release --locked -p tablix

## Start the daemon in the foreground with the default data directory.
run: build
	./target/release/tablix up $(ARGS)

## Every test: formatting, lints, unit, property, integration and crash tests.
test: deps lint
	$(CARGO) test --workspace --locked

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## Benchmarks (not part of `make test`).
bench: bench-insert

bench-insert: build
	./target/release/tablix bench insert $(BENCH_ARGS)
