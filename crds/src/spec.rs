//! The `McpEndpoint` spec types (serde + schemars) and their defaults.
//!
//! Field names are camelCase on the wire. Durations are Kubernetes durations (Go
//! `time.ParseDuration` syntax: `30s`, `5m`, `1h30m`); sizes are plain integers in bytes.
//! Every field except `targetRef` has a default, so a minimal manifest only names its target.

use kube::CustomResource;
use kube::core::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of one MCP endpoint: which workload serves it and how tether's sidecar in front
/// of each of its pods admits, buffers, routes and drains MCP Streamable HTTP traffic.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "mcp.tether.dev",
    version = "v1alpha1",
    kind = "McpEndpoint",
    namespaced,
    shortname = "mcpe",
    doc = "An MCP server workload fronted by tether sidecars (sticky sessions, resumable SSE, drain and handoff)."
)]
#[serde(rename_all = "camelCase")]
pub struct McpEndpointSpec {
    /// The workload whose pods serve this endpoint. Only `kind: Deployment` is supported.
    pub target_ref: TargetRef,
    /// Where the MCP server listens inside its pod (the sidecar's upstream).
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// Where the sidecar accepts client traffic.
    #[serde(default)]
    pub listen: ListenSpec,
    /// The sidecar's admin listener (`/healthz`, `/readyz`, `/metrics`).
    #[serde(default)]
    pub admin: AdminSpec,
    /// The sidecars' internal peer listener (session handoff, DESIGN.md §3.4).
    #[serde(default)]
    pub peer: PeerSpec,
    /// The `Origin` allowlist (DNS-rebinding defence, spec O-01/O-02).
    #[serde(default)]
    pub origins: OriginsSpec,
    /// MCP protocol versions clients may use (`MCP-Protocol-Version`, spec P-03). A request
    /// naming any other version gets 400. Default: every version tether supports.
    #[serde(default = "default_protocol_versions")]
    pub protocol_versions: Vec<String>,
    /// Per-stream SSE replay buffer bounds (DESIGN.md §3.2).
    #[serde(default)]
    pub buffer: BufferSpec,
    /// Session lifetime and migration policy.
    #[serde(default)]
    pub session: SessionSpec,
    /// Drain policy during rollouts (DESIGN.md §3.4).
    #[serde(default)]
    pub drain: DrainSpec,
}

/// Reference to the workload that serves the endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Kind of the workload. Only `Deployment` is supported.
    pub kind: String,
    /// Name of the workload, in the McpEndpoint's namespace.
    pub name: String,
}

/// The MCP server inside the pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// TCP port of the MCP server on the pod's loopback interface. Default `3000`.
    #[serde(default = "default_upstream_port")]
    pub port: u16,
    /// HTTP path of the MCP server's endpoint. Default `/mcp`.
    #[serde(default = "default_mcp_path")]
    pub path: String,
}

/// The sidecar's client-facing listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenSpec {
    /// TCP port the sidecar listens on (on the pod IP). Default `8080`.
    #[serde(default = "default_listen_port")]
    pub port: u16,
    /// HTTP path of the MCP endpoint clients use. Default `/mcp`.
    #[serde(default = "default_mcp_path")]
    pub path: String,
}

/// The sidecar's admin listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminSpec {
    /// TCP port of `/healthz`, `/readyz`, `/drain` and `/metrics`. Default `9901`.
    #[serde(default = "default_admin_port")]
    pub port: u16,
}

/// The sidecar's internal peer listener: draining sidecars push sessions, replay buffers and
/// the tail of in-flight streams to their peers over it (`docs/handoff.md`). Only sidecars of the
/// same endpoint talk to it; every message is authenticated with the endpoint Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerSpec {
    /// TCP port of the peer listener (on the pod IP). Default `9902`.
    #[serde(default = "default_peer_port")]
    pub port: u16,
}

/// The `Origin` allowlist (spec O-01/O-02).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OriginsSpec {
    /// Allowed browser origins, each `scheme://host[:port]` (`http` or `https`; a missing port
    /// means the scheme's default). A request whose `Origin` is not listed gets 403.
    /// Default: empty (every request carrying an `Origin` is refused).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Whether requests without an `Origin` header (non-browser clients) are admitted.
    /// Default `true`.
    #[serde(default = "default_true")]
    pub allow_missing: bool,
}

/// Bounds of each stream's replay buffer. The oldest events are evicted first; a resume from an
/// evicted cursor gets 400 `cursor_evicted`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BufferSpec {
    /// Most events kept per stream. Default `1024`.
    #[serde(default = "default_max_events")]
    pub max_events: u32,
    /// Most bytes of event data kept per stream. Default `4194304` (4 MiB).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// How long an event stays replayable after it was received. Default `10m`.
    #[serde(default = "default_buffer_ttl")]
    pub ttl: Duration,
}

/// Session lifetime and migration policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSpec {
    /// A session without any request or attached stream for this long is ended (later requests
    /// get 404, spec S-05). Default `30m`.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: Duration,
    /// How sessions leave a draining pod. Default `Replay`.
    #[serde(default)]
    pub migration: Migration,
}

/// How a session moves off a draining pod (DESIGN.md §3.4 step 4).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Migration {
    /// Hand the session to a peer, which rebuilds the upstream session from the journal.
    #[default]
    Replay,
    /// Never move sessions: the draining pod serves them until `drain.timeout`, then they end.
    Pin,
}

/// Drain policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Upper bound of a pod's drain (handoff plus in-flight requests). Default `60s`.
    #[serde(default = "default_drain_timeout")]
    pub timeout: Duration,
}

/// The MCP protocol versions tether knows, oldest first (spec `mcp-spec.md` version keys V1–V4).
///
/// 2024-11-05 (HTTP+SSE) is not served by the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// `2025-03-26` (V1): sessions, batching allowed (B-01).
    V2025_03_26,
    /// `2025-06-18` (V2): no batching (B-02), `MCP-Protocol-Version` header (P-01).
    V2025_06_18,
    /// `2025-11-25` (V3): priming events and SSE polling (R-05..R-07).
    V2025_11_25,
    /// `2026-07-28` (V4): stateless, no sessions or resumability (SEP-2567/2575).
    V2026_07_28,
}

impl ProtocolVersion {
    /// Every known version, oldest first.
    pub const ALL: [ProtocolVersion; 4] = [
        ProtocolVersion::V2025_03_26,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2026_07_28,
    ];

    /// The version as it appears on the wire, e.g. `2025-06-18`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolVersion::V2025_03_26 => "2025-03-26",
            ProtocolVersion::V2025_06_18 => "2025-06-18",
            ProtocolVersion::V2025_11_25 => "2025-11-25",
            ProtocolVersion::V2026_07_28 => "2026-07-28",
        }
    }

    /// Parses a wire version; `None` when unknown.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether the version is sessionless (2026-07-28 and later).
    pub fn is_stateless(self) -> bool {
        self >= ProtocolVersion::V2026_07_28
    }
}

impl std::fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_protocol_versions() -> Vec<String> {
    ProtocolVersion::ALL
        .iter()
        .map(|v| v.as_str().to_owned())
        .collect()
}
fn default_upstream_port() -> u16 {
    3000
}
fn default_listen_port() -> u16 {
    8080
}
fn default_admin_port() -> u16 {
    9901
}
fn default_peer_port() -> u16 {
    9902
}
fn default_mcp_path() -> String {
    "/mcp".to_owned()
}
fn default_true() -> bool {
    true
}
fn default_max_events() -> u32 {
    1024
}
fn default_max_bytes() -> u64 {
    4 * 1024 * 1024
}
fn default_buffer_ttl() -> Duration {
    std::time::Duration::from_secs(600).into()
}
fn default_idle_timeout() -> Duration {
    std::time::Duration::from_secs(30 * 60).into()
}
fn default_drain_timeout() -> Duration {
    std::time::Duration::from_secs(60).into()
}

impl Default for UpstreamSpec {
    fn default() -> Self {
        Self {
            port: default_upstream_port(),
            path: default_mcp_path(),
        }
    }
}

impl Default for ListenSpec {
    fn default() -> Self {
        Self {
            port: default_listen_port(),
            path: default_mcp_path(),
        }
    }
}

impl Default for AdminSpec {
    fn default() -> Self {
        Self {
            port: default_admin_port(),
        }
    }
}

impl Default for PeerSpec {
    fn default() -> Self {
        Self {
            port: default_peer_port(),
        }
    }
}

impl Default for OriginsSpec {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            allow_missing: true,
        }
    }
}

impl Default for BufferSpec {
    fn default() -> Self {
        Self {
            max_events: default_max_events(),
            max_bytes: default_max_bytes(),
            ttl: default_buffer_ttl(),
        }
    }
}

impl Default for SessionSpec {
    fn default() -> Self {
        Self {
            idle_timeout: default_idle_timeout(),
            migration: Migration::default(),
        }
    }
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            timeout: default_drain_timeout(),
        }
    }
}
