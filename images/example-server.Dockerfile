# syntax=docker/dockerfile:1
#
# tether-example-server: the example MCP server (official Rust SDK, rmcp) of examples/k8s/.
# Build context: the repository root (`make images` builds all three images):
#
#   docker build -f images/example-server.Dockerfile -t ghcr.io/tether-dev/tether-example-server:0.1.0 .
#
# Base images are pinned by tag. A digest (`image:tag@sha256:...`) would pin them exactly; the
# digests could not be looked up where this file was written (no registry access), so add them
# when publishing. tests/tests/repo/images.rs checks this file against the code (binary, user,
# ports, pinning); docs/dev/images.md describes the images.

# Builder: the Rust release the workspace is built and tested with (Cargo.toml's rust-version
# is the minimum). Debian 12 (bookworm), so the binary needs no newer glibc than the runtime's.
FROM rust:1.95.0-bookworm AS builder
# This binary needs no C toolchain; the sidecar's packages are installed anyway so this layer is
# the same in all three images (built once, then cached).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake gcc g++ pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The registry and target/ live in BuildKit cache mounts (shared by the three images), so the
# binary is copied out of target/ in the same step. The release profile keeps line tables for
# backtraces (Cargo.toml); the image drops them (about 140 MB -> 25 MB for the sidecar) and keeps
# the symbols, so a backtrace still names its functions.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p tether-examples --bin tether-example-server \
 && install -D -m 0755 target/release/tether-example-server /out/tether-example-server \
 && strip --strip-debug /out/tether-example-server

# Runtime: glibc, libgcc and CA certificates; no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="tether-example-server" \
      org.opencontainers.image.description="The example MCP server behind tether's sidecar (echo, slow, counter, notify tools)" \
      org.opencontainers.image.source="https://github.com/tether-dev/tether" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/tether-example-server /usr/local/bin/tether-example-server
# distroless `nonroot`, numeric so the pod's runAsNonRoot can verify it.
USER 65532:65532
# --listen defaults to 127.0.0.1:3000: the pod's loopback, where the sidecar reaches it. To reach
# it from outside its container, pass `--listen 0.0.0.0:3000`.
EXPOSE 3000
ENTRYPOINT ["/usr/local/bin/tether-example-server"]
