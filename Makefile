# tether — two commands matter: `make demo` (the main job) and `make test` (all tests).
# Both first check the system packages the build needs (pingora builds zlib-ng with CMake and
# zstd with a C compiler) and install missing ones with apt-get when run as root.

SHELL := /bin/bash
CARGO ?= cargo
# command -> Debian/Ubuntu package providing it
SYSTEM_DEPS := cmake:cmake cc:gcc c++:g++ pkg-config:pkg-config

.PHONY: all deps build test lint unit demo bench crds clean

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
test: deps lint unit

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: build
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

## crds: regenerate crds/ from the McpEndpoint types (a test fails while it is stale).
crds: deps
	$(CARGO) run -q -p tether-operator -- crd > crds/mcpendpoints.mcp.tether.dev.yaml

clean:
	$(CARGO) clean
