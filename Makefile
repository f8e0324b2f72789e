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
# Benchmarks, synthetic series and plots: a tool of its own, not in the worker image.
REVAULT_BENCH_BIN := $(CARGO_TARGET_DIR)/$(RUST_TARGET)/release/revault-bench
export REVAULT_BENCH_BIN
CARGO := cd worker && cargo

# Go (the operator): module and build caches under $(REVAULT_CACHE) (the ~1 GB of Kubernetes
# modules is fetched once), and never a downloaded toolchain.
export GOMODCACHE ?= $(REVAULT_CACHE)/go/mod
export GOCACHE ?= $(REVAULT_CACHE)/go/build
export GOTOOLCHAIN ?= local

# Which dataset `make demo` uses: synthetic (default) or kube.
DATA ?= synthetic

.PHONY: help tools build build-bench demo test test-worker test-api test-fuzz fuzz lint fmt bench s3-server
.PHONY: k8s-tools manifests generate generate-client build-operator lint-operator test-operator
.PHONY: images e2e test-e2e lint-e2e

help:
	@echo "make demo        back up and restore a real series on local disk, print the figures (DATA=kube for real data)"
	@echo "make test        everything CI runs: lint and every test suite"
	@echo "make build       release build of the revault binary"
	@echo "make build-bench release build of revault-bench (benchmarks, synthetic series, plots)"
	@echo "make lint        gofmt, go vet and golangci-lint of the Go modules; rustfmt check and clippy (warnings are errors)"
	@echo "make bench       benchmarks; figures go to docs/performance.md"
	@echo "make fuzz        fuzz the engine's decoders, 600 s per target (FUZZ_SECONDS=...; docs/fuzzing.md)"
	@echo "make test-operator  the operator's envtest suite, chart lint and dry-run, generated-file check"
	@echo "make manifests generate  regenerate CRDs/RBAC (config/, charts/revault), deepcopy code and the worker API's Go client"
	@echo "make generate-client     regenerate the worker API's Go client from worker/api/openapi.yaml (operator/pkg/workerclient)"
	@echo "make build-operator      build the operator binary (operator/bin/manager)"
	@echo "make images      worker and operator images as archives, no registry (\$$REVAULT_CACHE/images)"
	@echo "make e2e         the e2e suite on a 3-node kind cluster (KEEP=1 keeps the cluster; docs/e2e.md)"
	@echo "make test-velero the Velero plugin's tests; make velero-plugin-image its image (docs/velero.md)"

tools:
	@hack/install-tools.sh

build: tools
	$(CARGO) build --release --locked -p revault

# A cargo run of its own: one run with both -p revault and -p revault-bench unifies their
# dependencies' features, which compiles the engine once more.
build-bench: tools
	$(CARGO) build --release --locked -p revault-bench

demo: build build-bench
	python3 hack/demo.py --data $(DATA)

lint: tools lint-operator lint-e2e lint-velero
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# The remote tier's tests run against a real S3 server (versitygw, hack/s3-server.sh).
s3-server:
	@hack/s3-server.sh install >/dev/null

test-worker: build s3-server
	$(CARGO) test --release --locked --workspace

# The worker API fuzzed with schemathesis (installed into $(REVAULT_CACHE)/venv).
test-api: build
	hack/api-fuzz.sh

# The engine's decoders fuzzed with cargo-fuzz on stable Rust, FUZZ_SECONDS (default 15) per
# target; `make fuzz` is the long run (docs/fuzzing.md).
test-fuzz: tools
	hack/fuzz.sh

fuzz: tools
	FUZZ_SECONDS=$${FUZZ_SECONDS:-600} hack/fuzz.sh

test: lint test-worker test-fuzz test-api test-operator test-velero test-e2e

# ---- operator (Go) ----------------------------------------------------------------------
k8s-tools:
	@hack/k8s-tools.sh

manifests: k8s-tools
	hack/operator-gen.sh manifests

generate: k8s-tools generate-client
	hack/operator-gen.sh generate

# The Go client of the worker API (oapi-codegen, pinned in hack/lib.sh), shared by the operator
# and the Velero plugin.
generate-client:
	hack/worker-client.sh generate

build-operator:
	cd operator && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/manager ./cmd

# gofmt, go vet and golangci-lint (.golangci.yml; installed by the script on first use), and the
# generated worker client is current.
lint-operator:
	hack/worker-client.sh verify
	hack/go-lint.sh operator

test-operator: build k8s-tools
	hack/operator-test.sh

bench: build build-bench
	python3 hack/bench.py

# ---- images and e2e -----------------------------------------------------------------------
# Images from the static binaries, written as archives without any registry (hack/images.sh;
# REVAULT_IMAGE_BUILDER=docker uses `docker build` of worker/Dockerfile and operator/Dockerfile).
images: build build-operator
	hack/images.sh

# The Ginkgo suite in e2e/ on a 3-node kind cluster (docs/e2e.md). KEEP=1 keeps the cluster.
e2e: images k8s-tools
	hack/e2e.sh

# The e2e module compiles against ../operator (a replace): `go vet` here catches an API change
# that breaks the suite, or a go.mod that needs `cd e2e && go mod tidy` after the operator's changed.
lint-e2e:
	hack/go-lint.sh e2e

# Part of `make test`: runs e2e where the machine can (root, Linux, Docker or apt, disk space),
# otherwise says why it skips. REVAULT_E2E=0 skips it; REVAULT_E2E=1 makes a skip an error.
test-e2e:
	@rc=0; hack/e2e.sh check || rc=$$?; \
	case $$rc in 0) $(MAKE) --no-print-directory e2e ;; 1) ;; *) exit $$rc ;; esac

# ---- Velero plugin (velero-plugin/, its own Go module; docs/velero.md) ---------------------
.PHONY: test-velero velero-plugin-image lint-velero
# gofmt, go vet and golangci-lint of the plugin (part of `make lint`).
lint-velero:
	hack/go-lint.sh velero-plugin

# gofmt, go vet and the plugin's tests: against a real `revault serve` and envtest, and through
# Velero's own plugin manager (gRPC).
test-velero: build k8s-tools
	hack/velero-plugin.sh test

# The plugin image as an archive, no registry ($$REVAULT_CACHE/images/velero-plugin.env).
velero-plugin-image:
	hack/velero-plugin.sh image
