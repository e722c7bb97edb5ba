//! The peer protocol: how the sidecars of one endpoint talk to each other
//! (`docs/design/peer-trust.md`, `docs/design/peer-protocol.md#messages`). Its
//! version, paths and probe header are here; the messages ([`wire`]), their authentication and
//! acknowledgements ([`auth`]), replayed nonces ([`nonces`]), the sending side ([`client`]) and
//! the signed hop headers of a forwarded request ([`hop`]) are its modules. It is the layer below
//! `cluster/` (membership learns what peers report through it; routing reads hop headers) and
//! `handoff/` (which moves sessions with it and serves its messages): it knows no session, no
//! broker and no membership.
//!
//! | path (`POST`, on the peer port) | message | answer |
//! |---|---|---|
//! | [`SESSIONS_PATH`] | [`wire::SessionPush`] | 200 once the receiver holds the session |
//! | [`TAIL_PATH`] | [`wire::TailPush`] | 200 applied |
//! | [`CANCEL_PATH`] | [`wire::CancelPush`] | 200 once the cancellation reached the receiver's MCP server |
//! | [`HELD_PATH`] | [`wire::HeldQuery`] | [`wire::HeldAnswer`] |
//! | [`REPLICAS_PATH`] | [`wire::ReplicasPush`] | [`wire::ReplicasAnswer`] |
//! | [`CLAIM_PATH`] | [`wire::ClaimQuery`] | [`wire::ClaimAnswer`] |
//! | [`ABOUT_PATH`] | [`wire::About`] | the receiver's [`wire::About`] |
//!
//! Every sidecar also answers [`PROBE_PATH`] on its MCP port (peers' liveness probes), naming the
//! protocol it speaks in [`TETHER_PEER_PROTOCOL`]: where a later version will be negotiated.

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod hop;
pub(crate) mod nonces;
pub(crate) mod wire;

/// The peer protocol this sidecar speaks (`docs/design/peer-protocol.md#versions`).
pub(crate) const PROTOCOL: u8 = 2;
/// Path of session pushes.
pub(crate) const SESSIONS_PATH: &str = "/v2/sessions";
/// Path of tail messages.
pub(crate) const TAIL_PATH: &str = "/v2/tail";
/// Path of relayed cancellations.
pub(crate) const CANCEL_PATH: &str = "/v2/cancel";
/// Path of the question whether a session was taken.
pub(crate) const HELD_PATH: &str = "/v2/held";
/// Path of replicas sent to a session's replica pod.
pub(crate) const REPLICAS_PATH: &str = "/v2/replicas";
/// Path of a restarted holder's claim of a replica.
pub(crate) const CLAIM_PATH: &str = "/v2/claim";
/// Path of the exchange of reports.
pub(crate) const ABOUT_PATH: &str = "/v2/about";
/// The path every sidecar answers `200 ok` on, on its MCP listener, for its peers' probes.
pub(crate) const PROBE_PATH: &str = "/.tether/ping";
/// The header of a probe's answer naming the peer protocol the sidecar speaks.
pub(crate) const TETHER_PEER_PROTOCOL: http::HeaderName =
    http::HeaderName::from_static("tether-peer-protocol");

/// Whether a path is the peer protocol's (the proxy hands it to the peer listener).
pub(crate) fn is_peer_path(path: &str) -> bool {
    path.starts_with("/v2/")
}
