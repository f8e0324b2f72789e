# Revault: the one entry point. `make demo` and `make test` work on a fresh
# machine; heavy build output is cached under $(REVAULT_CACHE).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

REVAULT_CACHE ?= $(HOME)/.cache/revault
export REVAULT_CACHE
export CARGO_TARGET_DIR ?= $(REVAULT_CACHE)/target
export PATH := $(REVAULT_CACHE)/bin:$(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)

RUST_TARGET := x86_64-unknown-linux-gnu
REVAULT_BIN := $(CARGO_TARGET_DIR)/$(RUST_TARGET)/release/revault
export REVAULT_BIN
CARGO := cd worker && cargo

# Which dataset `make demo` uses: synthetic (default) or kube.
DATA ?= synthetic

.PHONY: help tools build demo test test-worker lint fmt bench

help:
	@echo "make demo        back up and restore a real series on local disk, print the figures (DATA=kube for real data)"
	@echo "make test        everything CI runs: lint and every test suite"
	@echo "make build       release build of the revault binary"
	@echo "make lint        rustfmt check and clippy (warnings are errors)"
	@echo "make bench       benchmarks; figures go to docs/performance.md"

tools:
	@hack/install-tools.sh

build: tools
	$(CARGO) build --release --locked -p revault

demo: build
	python3 hack/demo.py --data $(DATA)

lint: tools
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

test-worker: build
	$(CARGO) test --release --locked --workspace

test: lint test-worker

bench: build
	$(CARGO) bench --locked -p revault-engine --bench pipeline
	python3 hack/bench.py
