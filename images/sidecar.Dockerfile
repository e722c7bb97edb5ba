# syntax=docker/dockerfile:1
#
# tether-sidecar: the per-pod data plane (pingora) that the operator injects into an MCP
# server's pods. Build context: the repository root (`make images` builds all three images):
#
#   docker build -f images/sidecar.Dockerfile -t ghcr.io/tether-dev/tether-sidecar:0.1.0 .
#
# Base images are pinned by tag. A digest (`image:tag@sha256:...`) would pin them exactly; the
# digests could not be looked up where this file was written (no registry access), so add them
# when publishing. tests/tests/repo/images.rs checks this file against the code (binary, user,
# ports, pinning); docs/dev/images.md describes the images.

# Builder: the Rust release the workspace is built and tested with (Cargo.toml's rust-version
# is the minimum). Debian 12 (bookworm), so the binary needs no newer glibc than the runtime's.
FROM rust:1.95.0-bookworm AS builder
# pingora builds zlib-ng with CMake and zstd with a C compiler; pkg-config for the -sys crates.
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
    cargo build --release --locked -p tether-sidecar --bin tether-sidecar \
 && install -D -m 0755 target/release/tether-sidecar /out/tether-sidecar \
 && strip --strip-debug /out/tether-sidecar

# Runtime: glibc, libgcc and CA certificates; no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="tether-sidecar" \
      org.opencontainers.image.description="tether's per-pod sidecar: sticky MCP sessions, resumable SSE streams, session handoff on drain" \
      org.opencontainers.image.source="https://github.com/tether-dev/tether" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/tether-sidecar /usr/local/bin/tether-sidecar
# The UID/GID the operator's injected container runs as (runAsUser/runAsGroup 65532, distroless
# `nonroot`); the binary writes nothing, so a read-only root file system works.
USER 65532:65532
# The McpEndpoint defaults: listen.port (MCP), admin.port (/healthz /readyz /metrics /drain),
# peer.port (session handoff). The listeners bind to POD_IP; the ports follow the endpoint spec.
EXPOSE 8080 9901 9902
# Configured by flags or environment variables (TETHER_ENDPOINT, POD_IP, POD_UID,
# TETHER_SECRET_DIR, ...): the operator passes environment variables only.
ENTRYPOINT ["/usr/local/bin/tether-sidecar"]
