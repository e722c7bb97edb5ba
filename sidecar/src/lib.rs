//! `tether-sidecar`: the per-pod data plane of tether, a pingora server in front of one MCP
//! server (the upstream) that owns its clients' sessions, buffers their streams and hands them to
//! a peer when the pod drains (`docs/design/architecture.md`).
//!
//! The floors, from the wire up (each may use the ones below it, never one above):
//!
//! - `mcp/`: the protocol rules, pure: admission, Origin, JSON-RPC envelopes, the rejection
//!   catalogue, session ids, event ids, header rules, SSE framing;
//! - `stream/` and `session/`: the state a pod holds — streams with their replay buffers and
//!   stored replies; sessions with their retry records and journal, and the registry;
//! - `cluster/`: membership, the session ring, routing between sidecars, peer health;
//! - `keys/`: the endpoint's key ring (HMAC keys, the peer TLS material) and its reloads;
//! - `upstream.rs`, `lifecycle.rs`, `reply.rs`: the MCP server client, the pod's
//!   serving/draining state, what a client is answered;
//! - `broker/`: what the sidecar does with a sessionful request (initialize, POST, GET,
//!   DELETE, upstream pumps, rebuilds, sweeps);
//! - `handoff/`: moving sessions between sidecars, and the peer protocol it speaks;
//! - `proxy/`: the pingora callbacks of the MCP listener, with forwarding decisions as plain
//!   functions;
//! - `ops/`: the admin listener, the drain socket, the drain, signals; `config/`: flags, the
//!   endpoint file and its reloads; `server.rs` assembles it all, and `metrics.rs` the
//!   Prometheus metrics each folder counts (its own `metrics.rs`).
//!
//! The binary (`main.rs`) and the tests use the small face re-exported here; the fuzz targets
//! (`fuzz/`) use `fuzzing` (`sidecar/src/fuzzing.rs`), which exists only in builds with
//! `--cfg fuzzing`.

/// Makes each type a metric label value, written as its `label()` (each layer's `metrics.rs`
/// lists the label enums it encodes).
macro_rules! label_value {
    ($($ty:ty),+ $(,)?) => {$(
        impl prometheus_client::encoding::EncodeLabelValue for $ty {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.label())
            }
        }
    )+};
}

mod broker;
mod cluster;
mod config;
mod counts;
#[cfg(fuzzing)]
pub mod fuzzing;
mod handoff;
mod keys;
mod lifecycle;
mod mcp;
mod metrics;
mod ops;
mod peer;
mod proxy;
mod reply;
mod retained;
mod server;
mod session;
mod stream;
mod upstream;

pub use cluster::membership::{Peer, PeerState};
pub use cluster::ring::{HrwRing, SessionRing};
pub use config::cli::{Cli, DrainCli, KeygenCli, LogFormat};
pub use config::{Config, ConfigError, ConfigSource, MembershipConfig};
pub use keys::{KeygenError, keygen};
pub use ops::control::{DrainRequestError, request as request_drain};
pub use server::run;
