# tether — two commands matter: `make demo` (the main job) and `make test` (all tests).
# Both first check the system packages the build needs (pingora builds zlib-ng with CMake and
# zstd with a C compiler) and install missing ones with apt-get when run as root.

SHELL := /bin/bash
CARGO ?= cargo
# command -> Debian/Ubuntu package providing it
SYSTEM_DEPS := cmake:cmake cc:gcc c++:g++ pkg-config:pkg-config

.PHONY: all deps build test lint cargo-test demo bench crds references images clean

all: test

deps:
	@missing=""; \
	for pair in $(SYSTEM_DEPS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if ! command -v $(CARGO) >/dev/null 2>&1; then \
	  echo "error: cargo not found; install Rust (https://rustup.rs) first" >&2; exit 1; \
	fi; \
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

build: deps
	$(CARGO) build --workspace --bins

## test: formatting, clippy (warnings are errors), then every test of the workspace.
test: deps lint cargo-test

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## cargo-test: every test of the workspace (each crate's unit tests, the multi-process `it`
## binary, the static `repo` checks; docs/dev/testing.md), after building the binaries the
## multi-process tests start.
cargo-test: build
	$(CARGO) test --workspace --no-fail-fast

## demo: the rolling-upgrade demo on real MCP traffic, with handoff and the baseline (release build).
demo: deps
	$(CARGO) build --release --bins
	./target/release/tether-demo $(DEMO_ARGS)

## bench: ring lookup (criterion) and forward-hop latency (release build).
bench: deps
	$(CARGO) build --release --bins
	$(CARGO) bench -p tether-sidecar --bench ring
	./target/release/tether-bench-routing

## crds: regenerate what the McpEndpoint types generate (a test fails while one is stale):
## crds/, the chart's CRD template and docs/reference/crd.md.
crds: deps
	$(CARGO) run -q -p tether-operator -- crd > crds/mcpendpoints.mcp.tether.dev.yaml
	TETHER_BLESS=1 $(CARGO) test -q -p tether-crds --test crd the_charts_crd_template_matches_the_types
	TETHER_BLESS=1 $(CARGO) test -q -p tether-crds --test reference

## references: regenerate every generated reference (a test fails while one is stale): what
## `crds` writes, and docs/reference/sidecar-flags.md and status-codes.md from the sidecar's
## command line and rejection catalogue.
references: crds
	TETHER_BLESS=1 $(CARGO) test -q -p tether-sidecar --lib -- the_flags_reference the_status_codes_reference

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

clean:
	$(CARGO) clean
