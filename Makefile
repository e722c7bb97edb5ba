# tether — two commands matter: `make demo` (the main job) and `make test` (all tests).
# `make fuzz` runs the fuzz targets of the sidecar's parsers for a while (CI runs it as a smoke).
# Both first check the system packages the build needs (pingora builds zlib-ng with CMake and
# zstd with a C compiler; the tests' Python SDK fixture also needs python3 and its venv module)
# and install missing ones with apt-get when run as root.

SHELL := /bin/bash
CARGO ?= cargo
# command -> Debian/Ubuntu package providing it
SYSTEM_DEPS := cmake:cmake cc:gcc c++:g++ pkg-config:pkg-config
# The Python of the Python SDK fixture's virtualenv (`make python-sdk`): when it is missing, or
# lacks the venv module and ensurepip, python-deps installs these packages.
PYTHON3 ?= python3
PYTHON_DEPS := python3 python3-venv
# npm (and the Node.js it runs on), which installs the conformance suite: `make conformance`.
NODE_DEPS := nodejs npm

.PHONY: all deps python-deps node-deps build test lint cargo-test python-sdk conformance fuzz demo demo-fault soak bench bench-proxy crds references images e2e cluster-deps cluster-root cluster-tools cluster-up cluster-down e2e-local clean

all: test

# Installs the Debian/Ubuntu packages named in the shell variable `missing` with apt-get when
# run as root, else says how and fails; nothing when `missing` is empty.
define install_missing
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "error: missing system packages:$$missing" >&2; \
	    echo "install them with: sudo apt-get install -y$$missing" >&2; \
	    exit 1; \
	  fi; \
	fi
endef

deps:
	@missing=""; \
	for pair in $(SYSTEM_DEPS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if ! command -v $(CARGO) >/dev/null 2>&1; then \
	  echo "error: cargo not found; install Rust (https://rustup.rs) first" >&2; exit 1; \
	fi; \
	$(install_missing)

## python-deps: python3 with its venv module and ensurepip, which the Python SDK fixture's
## virtualenv needs (Debian ships them apart, in python3-venv); only the tests need them.
python-deps:
	@missing=""; \
	$(PYTHON3) -c 'import venv, ensurepip' >/dev/null 2>&1 || missing=" $(PYTHON_DEPS)"; \
	$(install_missing)

build: deps
	$(CARGO) build --workspace --bins

## test: formatting, clippy (warnings are errors), every test of the workspace, then the
## real-cluster tests on a local cluster (e2e-local: root, Go, docs/dev/cluster.md).
test: deps lint cargo-test e2e-local

lint: deps
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## cargo-test: every test of the workspace (each crate's unit tests, the multi-process `it`
## binary, the static `repo` checks; docs/dev/testing.md), after building the binaries, the
## Python SDK fixture's virtualenv and the conformance suite the multi-process tests start.
cargo-test: build python-sdk conformance
	$(CARGO) test --workspace --no-fail-fast

## python-sdk: the virtualenv of the Python SDK fixture (tests/fixtures/python-sdk-server/) in
## target/python-sdk-venv, with its pinned requirements; made again when requirements.txt
## changes (a stamp file), removed by `cargo clean`.
PYTHON_SDK_REQUIREMENTS := tests/fixtures/python-sdk-server/requirements.txt
PYTHON_SDK_VENV := target/python-sdk-venv
PYTHON_SDK_STAMP := $(PYTHON_SDK_VENV)/.installed

python-sdk: $(PYTHON_SDK_STAMP)

$(PYTHON_SDK_STAMP): $(PYTHON_SDK_REQUIREMENTS) | python-deps
	rm -rf $(PYTHON_SDK_VENV)
	$(PYTHON3) -m venv $(PYTHON_SDK_VENV)
	$(PYTHON_SDK_VENV)/bin/pip install --quiet --disable-pip-version-check -r $(PYTHON_SDK_REQUIREMENTS)
	touch $@

## node-deps: npm, which installs the conformance suite (from Debian's packages, with the
## distribution's Node.js it runs on; the suite itself runs on the Node.js 22 it pins).
node-deps:
	@missing=""; \
	command -v npm >/dev/null 2>&1 || missing=" $(NODE_DEPS)"; \
	$(install_missing)

## conformance: the official MCP conformance suite and the Node.js 22 it needs, both pinned in
## tests/fixtures/conformance/ (package-lock.json) and installed from the npm registry into
## target/conformance; made again when the lock file changes, removed by `cargo clean`.
CONFORMANCE_FIXTURE := tests/fixtures/conformance
CONFORMANCE_DIR := target/conformance
CONFORMANCE_STAMP := $(CONFORMANCE_DIR)/.installed

conformance: $(CONFORMANCE_STAMP)

$(CONFORMANCE_STAMP): $(CONFORMANCE_FIXTURE)/package.json $(CONFORMANCE_FIXTURE)/package-lock.json | node-deps
	rm -rf $(CONFORMANCE_DIR)
	mkdir -p $(CONFORMANCE_DIR)
	cp $^ $(CONFORMANCE_DIR)/
	cd $(CONFORMANCE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

## fuzz: the fuzz targets of the sidecar's parsers (fuzz/, docs/dev/testing.md#fuzzing), built
## with cargo-fuzz (installed when missing) on the stable toolchain (RUSTC_BOOTSTRAP=1), each run
## for FUZZ_SECONDS with its seeds (fuzz/seeds/) and its corpus (fuzz/corpus/, not committed).
## A crash fails, leaving its input in fuzz/artifacts/<target>/. Some targets, longer:
## `make fuzz FUZZ_TARGETS="envelope sse" FUZZ_SECONDS=600`.
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_SECONDS ?= 20
# target:max_len (bytes of one input)
FUZZ_TARGET_LENS := cursor:128 session_id:256 task_id:2048 envelope:4096 sse:4096 handoff:16384 \
  peers_file:2048 manifest:4096
FUZZ_TARGETS ?= $(foreach t,$(FUZZ_TARGET_LENS),$(firstword $(subst :, ,$(t))))
# No sanitizer: the sidecar has no unsafe code (`unsafe_code = "forbid"`), so AddressSanitizer
# would only slow the runs; debug assertions and overflow checks stay on.
# FUZZ_PROFILE=dev builds the targets unoptimized: half the cold build time (3.5 instead of 7.5
# minutes on 2 cores) for a tenth of the executions per second; CI's smoke run uses it.
FUZZ_PROFILE ?= release
FUZZ_BUILD_FLAGS := --sanitizer none --codegen-units 16 $(if $(filter dev,$(FUZZ_PROFILE)),--dev)
FUZZ_FLAGS ?=

fuzz: deps
	@if ! $(CARGO) fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $(CARGO_FUZZ_VERSION)"; then \
	  echo "installing cargo-fuzz $(CARGO_FUZZ_VERSION)"; \
	  $(CARGO) install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked; \
	fi
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz build $(FUZZ_BUILD_FLAGS)
	@set -e; cd fuzz; n=0; for t in $(FUZZ_TARGETS); do \
	  len=$$(for p in $(FUZZ_TARGET_LENS); do [ "$${p%%:*}" = "$$t" ] && echo $${p##*:}; done; true); \
	  if [ -z "$$len" ]; then echo "error: no fuzz target $$t" >&2; exit 1; fi; \
	  mkdir -p corpus/$$t; \
	  echo "== fuzz $$t: $(FUZZ_SECONDS)s, inputs up to $$len bytes"; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $(FUZZ_BUILD_FLAGS) $$t corpus/$$t seeds/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -max_len=$$len -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 $(FUZZ_FLAGS); \
	  n=$$((n + 1)); \
	done; \
	echo "fuzz: $$n passed, 0 failed"

## demo: the rolling-upgrade demo on real MCP traffic, with handoff and the baseline (release build).
demo: deps
	$(CARGO) build --release --bins
	./target/release/tether-demo $(DEMO_ARGS)

## demo-fault: the demo's load without a rollout, one pod lost without warning instead — its
## sidecar crashed and restarted, then the whole pod lost and replaced — each with replication
## (spec.session.replication: Sessions) and without (None), side by side; fails when a column
## with replication shows a client-visible 404, a lost session, a tool run twice or an event
## lost silently (docs/guide/demo.md#the-fault-mode; about 4 minutes on 2 cores).
demo-fault: deps
	$(CARGO) build --release --bins
	./target/release/tether-demo --fault all $(DEMO_ARGS)

## soak: the 5,000-session rolling upgrade SOAK_RUNS times (default 20), one row per run and
## the totals; fails on any foreign or lost event, client-visible 404, tool run twice or request
## answered after 10 s or more, and explains each from the sidecars' logs (release build; about
## a minute a run on 2 cores, 21 minutes for 20; docs/dev/testing.md#soak).
SOAK_RUNS ?= 20
SOAK_ARGS ?= --sessions 5000 --pods 3 --calls 2 --count 5 --interval-ms 1000 --baseline false \
  --drain-timeout-ms 20000 --ramp-up-ms 10000
soak: deps
	$(CARGO) build --release --bins
	./target/release/tether-demo $(SOAK_ARGS) --runs $(SOAK_RUNS)

## bench: ring lookup (criterion), forward-hop latency, what hostile input costs, and bounded
## memory and backpressure (release build).
bench: deps
	$(CARGO) build --release --bins
	$(CARGO) bench -p tether-sidecar --bench ring
	./target/release/tether-bench-routing
	./target/release/tether-bench-hostile
# memory per session and request, streams at full speed and read slowly, churn, reaped
# sessions (about seven minutes; --quick for a smoke, --baseline-bin-dir DIR beside another
# build's sidecar)
	./target/release/tether-bench-memory

## bench-proxy: CPU per request and per event of tether (replication None, Sessions, Events) beside nginx and a direct origin, in
## one table (about five and a half minutes once built; docs/dev/testing.md#proxy-cost). Installs nginx with apt-get
## when run as root and missing; otherwise its column is skipped. BENCH_PROXY_ARGS=--quick: a smoke.
bench-proxy: deps
	$(CARGO) build --release --bins
	@if ! command -v nginx >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light >/dev/null \
	    || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx >/dev/null; \
	  else echo "nginx is missing: sudo apt-get install -y nginx-light (its column is skipped)"; fi; \
	fi
	./target/release/tether-bench-proxy $(BENCH_PROXY_ARGS)

## crds: regenerate what the McpEndpoint types generate (a test fails while one is stale):
## crds/, the chart's CRD template and docs/reference/crd.md.
crds: deps
	$(CARGO) run -q -p tether-operator -- crd > crds/mcpendpoints.mcp.tether.dev.yaml
	TETHER_BLESS=1 $(CARGO) test -q -p tether-crds --test crd the_charts_crd_template_matches_the_types
	TETHER_BLESS=1 $(CARGO) test -q -p tether-crds --test reference

## references: regenerate every generated reference (a test fails while one is stale): what
## `crds` writes, docs/reference/sidecar-flags.md and status-codes.md from the sidecar's
## command line and rejection catalogue, and the RBAC tables of docs/design/security-model.md
## from the operator's rules.
references: crds
	TETHER_BLESS=1 $(CARGO) test -q -p tether-sidecar --lib -- the_flags_reference the_status_codes_reference
	TETHER_BLESS=1 $(CARGO) test -q -p tether-operator --lib -- the_security_models_rbac_tables

## images: the container images of the operator, the sidecar and the example server (needs a
## Docker engine with BuildKit; docs/dev/images.md). Tags: $(IMAGE_REPO)/<name>:$(IMAGE_TAG);
## `make images IMAGE_REPO= IMAGE_TAG=e2e` tags them <name>:e2e.
DOCKER ?= docker
IMAGE_REPO ?= ghcr.io/tether-dev
# the workspace version ([workspace.package] version in Cargo.toml)
IMAGE_TAG ?= $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)".*/\1/p' Cargo.toml)
IMAGE_PREFIX = $(if $(IMAGE_REPO),$(IMAGE_REPO)/)
# Dockerfile in images/ -> image name
IMAGES := operator:tether-operator sidecar:tether-sidecar example-server:tether-example-server

images:
	@if ! command -v $(DOCKER) >/dev/null 2>&1; then \
	  echo "error: make images needs the docker command ($(DOCKER)), which is not installed" >&2; exit 1; \
	fi; \
	if ! $(DOCKER) info >/dev/null 2>&1; then \
	  echo "error: make images needs a Docker engine, but '$(DOCKER) info' fails: no daemon is running or reachable (DOCKER_HOST), or this user may not use it" >&2; exit 1; \
	fi; \
	if [ -z "$(IMAGE_TAG)" ]; then \
	  echo "error: IMAGE_TAG is empty (no version in Cargo.toml's [workspace.package]?); set IMAGE_TAG=..." >&2; exit 1; \
	fi
	@set -e; for pair in $(IMAGES); do \
	  file=images/$${pair%%:*}.Dockerfile; image=$(IMAGE_PREFIX)$${pair##*:}:$(IMAGE_TAG); \
	  echo "docker build -f $$file -t $$image ."; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build -f $$file -t $$image .; \
	done

## e2e: the real-cluster tests (docs/dev/e2e.md) on one kind cluster per node image of
## E2E_NODE_IMAGES, each created, given the images of `make images IMAGE_REPO= IMAGE_TAG=e2e`
## (`kind load`), tested and deleted; needs docker, kind, kubectl and helm. One version:
## `make e2e E2E_NODE_IMAGES=kindest/node:v1.34.0@sha256:…`; E2E_KEEP=1 keeps the clusters.
KIND ?= kind
# Kubernetes 1.29, 1.31, 1.33, 1.34: the images of kind's v0.27.0 (1.29) and v0.30.0 release notes.
E2E_NODE_IMAGES ?= \
  kindest/node:v1.29.14@sha256:8703bd94ee24e51b778d5556ae310c6c0fa67d761fae6379c8e0bb480e6fea29 \
  kindest/node:v1.31.12@sha256:0f5cc49c5e73c0c2bb6e2df56e7df189240d83cf94edfa30946482eb08ec57d2 \
  kindest/node:v1.33.4@sha256:25a6018e48dfcaee478f4a59af81157a437f15e6e140bf103f85a2e7cd0cbbf2 \
  kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a
E2E_TEST_THREADS ?= 3
E2E_IMAGES := tether-operator:e2e tether-sidecar:e2e tether-example-server:e2e

e2e: deps
	@for tool in $(DOCKER) $(KIND) kubectl helm; do \
	  command -v $$tool >/dev/null 2>&1 || { echo "error: make e2e needs $$tool, which is not installed" >&2; exit 1; }; \
	done
	$(MAKE) images IMAGE_REPO= IMAGE_TAG=e2e
	$(CARGO) test -p tether-operator --test e2e --no-run
	@failed=""; for node in $(E2E_NODE_IMAGES); do \
	  version=$${node#*:}; version=$${version%%@*}; \
	  cluster=tether-e2e-$$(echo $$version | tr . -); kubeconfig=$$(mktemp); \
	  echo "== $$node: kind cluster $$cluster"; \
	  if $(KIND) create cluster --name $$cluster --image $$node --kubeconfig $$kubeconfig --wait 180s && \
	     $(KIND) load docker-image --name $$cluster $(E2E_IMAGES) && \
	     TETHER_E2E_KUBECONFIG=$$kubeconfig \
	     TETHER_E2E_OPERATOR_IMAGE=tether-operator:e2e TETHER_E2E_SIDECAR_IMAGE=tether-sidecar:e2e \
	     TETHER_E2E_SERVER_IMAGE=tether-example-server:e2e \
	     $(CARGO) test -p tether-operator --test e2e -- --test-threads=$(E2E_TEST_THREADS); \
	  then echo "== $$version: passed"; else echo "== $$version: FAILED"; failed="$$failed $$version"; fi; \
	  if [ -z "$(E2E_KEEP)" ]; then $(KIND) delete cluster --name $$cluster; rm -f $$kubeconfig; \
	  else echo "kept: kind cluster $$cluster, kubeconfig $$kubeconfig"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "make e2e: failed on$$failed" >&2; exit 1; fi; \
	echo "make e2e: passed on every node image"

## The local cluster (docs/dev/cluster.md): a real single-node Kubernetes built from source and
## run as local processes in a network namespace (tests/cluster/). CLUSTER_KUBERNETES picks the
## release (tests/cluster/versions.sh: the newest the Go module proxy serves by default; the
## oldest the chart supports is `make e2e-local CLUSTER_KUBERNETES=v1.29.15`).
# command -> Debian package; the cluster scripts and runc's build need them (and root)
CLUSTER_DEPS := nsenter:util-linux ip:iproute2 nft:nftables openssl:openssl curl:curl \
  objcopy:binutils ldd:libc-bin pgrep:procps
CLUSTER_GO_VERSION := go1.26

## cluster-deps: Go, and the system packages the cluster's scripts use; libseccomp-dev is the
## header runc's seccomp support builds against.
cluster-deps: deps
	@if ! go version 2>/dev/null | grep -q "$(CLUSTER_GO_VERSION)"; then \
	  echo "error: the local cluster's tools build with Go $(CLUSTER_GO_VERSION) (go version: $$(go version 2>&1))" >&2; exit 1; \
	fi
	@missing=""; \
	for pair in $(CLUSTER_DEPS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	[ -e /usr/include/seccomp.h ] || missing="$$missing libseccomp-dev"; \
	$(install_missing)

## cluster-tools: builds Kubernetes, etcd, helm, containerd, runc and the CNI plugins from source
## at the pinned versions into ~/.cache/tether-cluster (TETHER_CLUSTER_CACHE); about ten
## minutes cold on 2 cores, nothing once built.
cluster-tools: cluster-deps
	tests/cluster/tools.sh $(CLUSTER_KUBERNETES)

## cluster-up: the local cluster, with the images of the workspace's binaries (CLUSTER_PROFILE,
## debug by default); `. target/cluster/env` then `nsenter --net=/run/netns/tether-cluster kubectl …`.
CLUSTER_PROFILE ?= debug
CLUSTER_BUILD := $(if $(filter release,$(CLUSTER_PROFILE)),--release)
cluster-up: cluster-root cluster-tools
	$(CARGO) build $(CLUSTER_BUILD) --bins
	CLUSTER_PROFILE=$(CLUSTER_PROFILE) tests/cluster/up.sh $(CLUSTER_KUBERNETES)

## cluster-down: stops the local cluster and removes its state (its logs stay in target/cluster/logs).
cluster-down:
	tests/cluster/down.sh

## e2e-local: the real-cluster tests (docs/dev/e2e.md) on a local cluster made for them and taken
## down afterwards; E2E_TEST_THREADS at a time; TETHER_CLUSTER_KEEP=1 keeps the cluster. The
## test binary is built with --workspace, as cargo-test builds it: `-p tether-operator` would
## unify the dependencies' features differently and compile them again (3 minutes cold).
e2e-local: cluster-root cluster-tools
	$(CARGO) build $(CLUSTER_BUILD) --bins
	$(CARGO) test --workspace --test e2e --no-run
	CLUSTER_KUBERNETES=$(CLUSTER_KUBERNETES) CLUSTER_PROFILE=$(CLUSTER_PROFILE) \
	  E2E_TEST_THREADS=$(E2E_TEST_THREADS) tests/cluster/e2e.sh

## cluster-root: the local cluster runs a kubelet and containerd, which need root: say so before
## anything is built.
cluster-root:
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "error: the local cluster runs a kubelet and containerd, which need root; run make as root (make cargo-test runs every other test)" >&2; exit 1; \
	fi

clean:
	$(CARGO) clean
