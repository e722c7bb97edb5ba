//! The `McpEndpoint` spec and status types (serde + schemars) and their defaults.
//!
//! Field names are camelCase on the wire. Durations are Kubernetes durations (Go
//! `time.ParseDuration` syntax: `30s`, `5m`, `1h30m`); sizes are plain integers in bytes.
//! Every field except `targetRef` has a default, so a minimal manifest only names its target.
//!
//! The CEL rules (`x-kubernetes-validations`) reject at admission what [`crate::validate`]
//! rejects in the sidecar and the operator, except what CEL cannot see (an Origin's port above
//! 65535): both are tested against the same cases.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of one MCP endpoint: which workload serves it and how tether's sidecar in front
/// of each of its pods admits, buffers, routes and drains MCP Streamable HTTP traffic.
// Each `printcolumn(...)` repeats the same keys, which clippy takes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "mcp.tether.dev",
    version = "v1alpha1",
    kind = "McpEndpoint",
    namespaced,
    shortname = "mcpe",
    status = "McpEndpointStatus",
    doc = "An MCP server workload fronted by tether sidecars (sticky sessions, resumable SSE, drain and handoff).",
    printcolumn(
        name = "Target",
        type_ = "string",
        description = "The Deployment whose pods serve the endpoint",
        json_path = ".spec.targetRef.name"
    ),
    printcolumn(
        name = "Routable",
        type_ = "integer",
        description = "Pods that take new sessions",
        json_path = ".status.routable"
    ),
    printcolumn(
        name = "Draining",
        type_ = "integer",
        description = "Pods handing their sessions off",
        json_path = ".status.draining"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Status of the Ready condition",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "self.listen.port != self.admin.port"
).message("spec.admin.port must differ from spec.listen.port").field_path(".admin.port"))]
#[x_kube(validation = Rule::new(
    "self.peer.port != self.listen.port && self.peer.port != self.admin.port"
).message("spec.peer.port must differ from spec.listen.port and spec.admin.port").field_path(".peer.port"))]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_formats)]
#[schemars(transform = crate::schema::reflowed_descriptions)]
pub struct McpEndpointSpec {
    /// The workload whose pods serve this endpoint. Only `kind: Deployment` is supported.
    /// Immutable: point an endpoint at another workload by creating a new McpEndpoint.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.targetRef is immutable; create a new McpEndpoint for another workload"))]
    pub target_ref: TargetRef,
    /// Where the MCP server listens inside its pod (the sidecar's upstream). Changing it rolls
    /// the pods.
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// Where the sidecar accepts client traffic. Changing it rolls the pods.
    #[serde(default)]
    pub listen: ListenSpec,
    /// The sidecar's admin listener (`/healthz`, `/readyz`, `/metrics`). Changing it rolls the
    /// pods.
    #[serde(default)]
    pub admin: AdminSpec,
    /// The sidecars' internal peer listener, over which a draining pod hands its sessions to
    /// the pods that stay. Changing it rolls the pods.
    #[serde(default)]
    pub peer: PeerSpec,
    /// The `Origin` allowlist, a defence against DNS rebinding: a request from a browser origin
    /// not listed gets 403. Running sidecars reload it without a restart.
    #[serde(default)]
    pub origins: OriginsSpec,
    /// MCP protocol versions clients may use (the `MCP-Protocol-Version` header). A request
    /// naming any other version gets 400. Default: every version tether supports. Running
    /// sidecars reload it without a restart (sessions keep their negotiated version).
    #[serde(default = "default_protocol_versions")]
    #[x_kube(validation = Rule::new("size(self) > 0").message("spec.protocolVersions must list at least one version"))]
    #[x_kube(validation = Rule::new(
        "self.all(v, v in ['2025-03-26', '2025-06-18', '2025-11-25', '2026-07-28'])"
    ).message("spec.protocolVersions: unknown version; known: 2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28"))]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w == v))").message("spec.protocolVersions: duplicate version"))]
    #[schemars(length(max = 8), inner(length(max = 16)))]
    pub protocol_versions: Vec<String>,
    /// Bounds of each SSE stream's replay buffer, from which a client resuming with
    /// `Last-Event-ID` gets the events it missed. Running sidecars reload them without a
    /// restart; new bounds apply to streams opened after the reload.
    #[serde(default)]
    pub buffer: BufferSpec,
    /// Session lifetime and migration policy. Running sidecars reload `idleTimeout`; changing
    /// `migration` rolls the pods.
    #[serde(default)]
    pub session: SessionSpec,
    /// Drain policy during rollouts: how long a terminating pod may take to hand its sessions
    /// off and finish its requests. Changing it rolls the pods.
    #[serde(default)]
    pub drain: DrainSpec,
    /// The sidecar container the operator injects. Changing it rolls the pods.
    #[serde(default)]
    pub sidecar: SidecarSpec,
    /// How the sidecar carries the credentials of an MCP server that requires authorization.
    /// Running sidecars reload it without a restart.
    #[serde(default)]
    pub auth: AuthSpec,
}

/// Credentials of an MCP server that requires authorization (OAuth bearer tokens, API keys).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// Request headers that carry a client's credentials, lowercase. Every request the sidecar
    /// sends the MCP server on a session's behalf (the rebuild of its upstream session on a new
    /// pod, its reopened standalone stream, the resume of an upstream stream, the end of its
    /// upstream session) carries them as the session's clients last sent them; they are kept in
    /// memory only, never logged and never handed to another pod. Default `["authorization"]`;
    /// list more for API-key schemes (e.g. `x-api-key`).
    #[serde(default = "default_forward_headers")]
    #[x_kube(validation = Rule::new("self.all(h, h.matches('^[a-z0-9!#$%&*+.^_|~-]+$'))").message("spec.auth.forwardHeaders: each entry must be a lowercase HTTP header name"))]
    #[schemars(length(max = 16), inner(length(min = 1, max = 64)))]
    pub forward_headers: Vec<String>,
    /// What a session is bound to, fixed at its `initialize`: every later request of the
    /// session must present the same principal, or it gets the 404 of an unknown session.
    /// `SubjectAndClient` (default): the `iss` and `sub` claims of a JWT bearer token and the
    /// client it was issued to (`azp`, else `client_id`), read, not verified (the MCP server
    /// verifies), else the credential itself: the same user's token from another client
    /// application does not drive the session; `Subject`: `iss` and `sub` only (any client of
    /// the user); `Credential`: the credential itself (a refreshed opaque token then ends the
    /// session: clients initialize again); `None`: no binding. An anonymous `initialize` binds
    /// the session to presenting no credential.
    #[serde(default)]
    pub binding: AuthBinding,
    /// How long the MCP server's acceptance of a credential vouches for it. Before a resume, a
    /// standalone GET or a retry is served from the sidecar's memory with a credential the
    /// server has not accepted for the session within this window, the sidecar sends the server
    /// a `ping` in the session with that credential; a 401 or 403 goes to the client (with its
    /// `WWW-Authenticate`) and nothing is served. At most `1h`. Default `60s`; `0s` turns it
    /// off.
    #[serde(
        default = "default_revalidate",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('1h')").message("spec.auth.revalidate must be a duration between 0s and 1h"))]
    pub revalidate: Duration,
}

fn default_revalidate() -> Duration {
    std::time::Duration::from_secs(60).into()
}

/// What a session is bound to (`spec.auth.binding`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AuthBinding {
    /// The token's subject and client (`iss`, `sub` and `azp` or `client_id` of a JWT), else
    /// the credential.
    #[default]
    SubjectAndClient,
    /// The token's subject (`iss`, `sub` of a JWT), else the credential.
    Subject,
    /// The credential itself.
    Credential,
    /// No binding.
    None,
}

fn default_forward_headers() -> Vec<String> {
    vec!["authorization".to_owned()]
}

impl Default for AuthSpec {
    fn default() -> Self {
        Self {
            forward_headers: default_forward_headers(),
            binding: AuthBinding::default(),
            revalidate: default_revalidate(),
        }
    }
}

/// The injected sidecar container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Image of the sidecar, e.g. `ghcr.io/tether-dev/tether-sidecar:0.1.0`. Default: the
    /// operator's `--sidecar-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU and memory requests and limits of the sidecar container. Default: the operator's
    /// (requests 50m CPU and 64Mi memory, limit 256Mi memory); `{}` sets none, as in a pod spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Observed state of an endpoint, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_formats)]
#[schemars(transform = crate::schema::reflowed_descriptions)]
pub struct McpEndpointStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every pod of the target runs a ready sidecar of the current spec), `Progressing`
    /// (pods of an older pod template remain: a rollout is under way), `Degraded` (the operator
    /// cannot do what the spec asks; the reason says why). A list-map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// Pods of the target Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i32>,
    /// Pods whose sidecar is ready: they take new sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routable: Option<i32>,
    /// Pods being deleted: their sidecars hand sessions off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<i32>,
    /// The endpoint's key ring: the Secret its sidecars mount, the ids of its keys and where a
    /// key rotation stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyRingStatus>,
}

/// The endpoint's key ring as the operator last wrote or read it. A key is named by its id, 8
/// hex characters of a hash of it; the keys themselves are only in the Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRingStatus {
    /// The Secret that holds the key ring. Once it has existed the operator never creates another
    /// on its own: while it is missing the endpoint is `Degraded` (`SecretMissing`) until it is
    /// restored or the annotation `mcp.tether.dev/new-key` asks for a new key.
    pub secret: String,
    /// Id of the key that signs session ids and peer messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Id of the key the last rotation replaced: it only verifies, while sessions minted with it
    /// live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Id of the key a rotation under way staged: it only verifies until it is promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Where a rotation stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<KeyPhase>,
    /// The value of the annotation `mcp.tether.dev/rotate-key` whose rotation the key ring holds
    /// or last held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<String>,
    /// The last value of the annotation `mcp.tether.dev/retire-previous-key` handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired: Option<String>,
    /// The last value of the annotation `mcp.tether.dev/new-key` handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_key: Option<String>,
    /// What the rotation under way waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a key rotation stands: `Stable` (none under way), `Staged` (a new key is staged as
/// next; it is promoted once every pod verifies with it), `Promoted` (the new key signs; the
/// previous one is retired once every pod signs with the new key and holds no session minted
/// with the previous one).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum KeyPhase {
    /// No rotation under way: one key signs and verifies.
    #[default]
    Stable,
    /// A new key is staged as `next`; it is promoted once every pod verifies with it.
    Staged,
    /// The new key signs; the previous one is retired once every pod signs with the new key and
    /// no session minted with the previous one is left.
    Promoted,
}

/// Reference to the workload that serves the endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Kind of the workload. Only `Deployment` is supported.
    #[x_kube(validation = Rule::new("self == 'Deployment'").message("spec.targetRef.kind: only \"Deployment\" is supported"))]
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Name of the workload, in the McpEndpoint's namespace.
    #[x_kube(validation = Rule::new("self != ''").message("spec.targetRef.name must not be empty"))]
    #[schemars(length(max = 253))]
    pub name: String,
}

/// The MCP server inside the pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// TCP port of the MCP server on the pod's loopback interface. Default `3000`.
    #[serde(default = "default_upstream_port")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.upstream.port must be between 1 and 65535"))]
    pub port: u16,
    /// HTTP path of the MCP server's endpoint. Default `/mcp`.
    #[serde(default = "default_mcp_path")]
    #[x_kube(validation = Rule::new("self.matches('^/[!-~]*$') && !self.contains('?') && !self.contains('#')").message("spec.upstream.path must be an absolute URL path without query or fragment, like \"/mcp\""))]
    #[schemars(length(max = 1024))]
    pub path: String,
    /// `Host` the sidecar sends the MCP server. Default: the authority it dials
    /// (`127.0.0.1:<port>`), which SDK servers' DNS-rebinding protection accepts; the client's
    /// `Host` travels in `X-Forwarded-Host` and `Forwarded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9.-]+(:[0-9]{1,5})?$') || self.matches('^\\\\[[0-9A-Fa-f:.]+\\\\](:[0-9]{1,5})?$')").message("spec.upstream.host must be a host name or IP address with an optional port, like \"localhost:3000\""))]
    #[schemars(length(max = 261))]
    pub host: Option<String>,
    /// Whether the client's `Origin` is passed to the MCP server. Default `false`: the sidecar
    /// checks `Origin` against `spec.origins` itself, and an SDK server on loopback refuses a
    /// browser origin it does not know (403 or 421).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_origin: bool,
}

/// The sidecar's client-facing listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenSpec {
    /// TCP port the sidecar listens on (on the pod IP). Default `8080`.
    #[serde(default = "default_listen_port")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.listen.port must be between 1 and 65535"))]
    pub port: u16,
    /// HTTP path of the MCP endpoint clients use. Default `/mcp`.
    #[serde(default = "default_mcp_path")]
    #[x_kube(validation = Rule::new("self.matches('^/[!-~]*$') && !self.contains('?') && !self.contains('#')").message("spec.listen.path must be an absolute URL path without query or fragment, like \"/mcp\""))]
    #[schemars(length(max = 1024))]
    pub path: String,
    /// Most client connections one source address keeps open on a pod, so that one client
    /// cannot hold every connection of it: a further one's first request gets 429
    /// `source_connections`. Clients behind a gateway or an ingress share its address: raise it
    /// there; `0`: no per-source bound. Unset: the sidecar's `--max-connections-per-source`
    /// (1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_source: Option<u32>,
}

/// The sidecar's admin listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminSpec {
    /// TCP port of `/healthz`, `/readyz`, `/drained` and `/metrics`. Default `9901`.
    #[serde(default = "default_admin_port")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.admin.port must be between 1 and 65535"))]
    pub port: u16,
}

/// The sidecar's internal peer listener: draining sidecars push sessions, replay buffers and
/// the tail of in-flight streams to their peers over it (`docs/design/handoff.md`). Only sidecars of the
/// same endpoint talk to it; every message is authenticated with the endpoint Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerSpec {
    /// TCP port of the peer listener (on the pod IP). Default `9902`.
    #[serde(default = "default_peer_port")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.peer.port must be between 1 and 65535"))]
    pub port: u16,
    /// Mutual TLS between sidecars: the peer port accepts only TLS connections whose client
    /// presents a certificate of the endpoint's CA (the operator generates it into the
    /// endpoint's Secret), and every handoff message and forwarded request travels over it.
    /// `false` leaves sidecar-to-sidecar traffic in plaintext (still authenticated by the
    /// endpoint's key), for a network that encrypts it already. Default `true`.
    #[serde(default = "default_true")]
    pub tls: bool,
}

/// The `Origin` allowlist.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OriginsSpec {
    /// Allowed browser origins, each `scheme://host[:port]` (`http` or `https`; a missing port
    /// means the scheme's default). A request whose `Origin` is not listed gets 403.
    /// Default: empty (every request carrying an `Origin` is refused).
    #[serde(default)]
    #[x_kube(validation = Rule::new(
        r#"self.all(o, o.matches('^[hH][tT][tT][pP][sS]?://(\\[[0-9a-fA-F:]+\\]|[A-Za-z0-9.-]+)(:0*[1-9][0-9]{0,4})?$'))"#
    ).message("spec.origins.allow: every entry must be scheme://host[:port] with scheme http or https, e.g. \"https://app.example.com\""))]
    #[schemars(length(max = 256), inner(length(max = 256)))]
    pub allow: Vec<String>,
    /// Whether requests without an `Origin` header (non-browser clients) are admitted.
    /// Default `true`.
    #[serde(default = "default_true")]
    pub allow_missing: bool,
}

/// Bounds of each stream's replay buffer. The oldest events are evicted first; a resume from an
/// evicted cursor gets 400 `cursor_evicted`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BufferSpec {
    /// Most events kept per stream, 1 to 100000 (each costs about 100 bytes of bookkeeping
    /// beyond its data). Default `1024`.
    #[serde(default = "default_max_events")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100000").message("spec.buffer.maxEvents must be between 1 and 100000"))]
    pub max_events: u32,
    /// Most bytes of event data kept per stream, 1 to 67108864 (64 MiB). Default `4194304`
    /// (4 MiB).
    #[serde(default = "default_max_bytes")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 67108864").message("spec.buffer.maxBytes must be between 1 and 67108864 (64 MiB)"))]
    pub max_bytes: u64,
    /// How long an event stays replayable after it was received, at most `24h`. Default `10m`.
    #[serde(
        default = "default_buffer_ttl",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('24h')").message("spec.buffer.ttl must be a positive duration of at most 24h"))]
    pub ttl: Duration,
}

/// Session lifetime and migration policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSpec {
    /// A session without any request or attached stream for this long is ended (later requests
    /// get 404); at most `24h`. Default `30m`.
    #[serde(
        default = "default_idle_timeout",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('24h')").message("spec.session.idleTimeout must be a positive duration of at most 24h"))]
    pub idle_timeout: Duration,
    /// How sessions leave a draining pod. Default `Replay`.
    #[serde(default)]
    pub migration: Migration,
    /// What each session's holder keeps on a second pod (its replica), so the session survives
    /// the holder's loss without warning (an OOM kill, a lost node, a sidecar crash): `None`,
    /// `Sessions` (the session without its buffered events) or `Events` (with them). Running
    /// sidecars reload it. Default `Sessions`. Each session is sent to its replica pod (its
    /// runner-up) when what the replica carries changed, at most every 50 ms, as the change
    /// since the copy there; the replica pod counts it in its retained bytes. Measured cost of
    /// `Sessions` for a request that does not wait for `writeAhead`: about 11 % more CPU per
    /// JSON request at one client and 22 to 29 % with 32 busy sessions, 2 to 5 % per SSE
    /// event, under 1 KiB per idle session at the replica pod; `Events` costs 65 to 73 % more
    /// per SSE event and doubles to triples the SSE lag p99.
    #[serde(default)]
    pub replication: Replication,
    /// With replication, whether a request is sent to the MCP server only once the replica pod
    /// keeps its retry record (write-ahead): a request running when its holder was lost is then
    /// never run a second time by its client's retry, which gets an explicit error instead.
    /// Only requests whose second run could change something wait: `ping`, the lists, reads,
    /// (un)subscriptions, `completion/complete`, `logging/setLevel`, `tasks/get`, `tasks/result`,
    /// `tasks/cancel` and calls of the tools the MCP server's `tools/list` declares
    /// `readOnlyHint: true` go at once. A request that waits costs a round trip to the replica pod before the MCP
    /// server sees it, and a message per round trip (requests waiting together share one):
    /// measured on a 2-core machine with a trivial tool, 5.5 to 6 times the CPU per call of
    /// `replication: None` at one client and twice with 32 busy sessions. With `false` a
    /// request that started in the last 50 ms before an unannounced loss may run again if its
    /// client retries it. Running sidecars reload it. Default `true`.
    #[serde(default = "default_true")]
    pub write_ahead: bool,
}

/// What a session's replica on its runner-up pod carries (`docs/design/replication.md`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Replication {
    /// No replica: a session ends with the pod that holds it, unless the pod drains.
    None,
    /// The session, its journal, credential digests, retry records with their answers,
    /// tombstones and its streams' numbering, without buffered events: a request running when
    /// the holder was lost ends with an explicit error, and a resume replays nothing from before.
    #[default]
    Sessions,
    /// `Sessions` plus the buffered events, sent in batches: a resume replays them on the new
    /// holder.
    Events,
}

/// How a session moves off a draining pod.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Migration {
    /// Hand the session to a peer, which rebuilds the upstream session from the journal.
    #[default]
    Replay,
    /// Never move sessions: the draining pod serves them until `drain.timeout`, then they end.
    Pin,
}

/// Drain policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Upper bound of a pod's drain (handoff plus in-flight requests), at most `1h`. Default
    /// `60s`.
    #[serde(
        default = "default_drain_timeout",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1h')").message("spec.drain.timeout must be a positive duration of at most 1h"))]
    pub timeout: Duration,
    /// How long after its drain began a pod's sidecar still accepts connections, at most `5m`:
    /// the time the Service's routing (kube-proxy on every node, ingress controllers, load
    /// balancers) takes to stop sending new connections to a terminating pod. Connections that
    /// arrive meanwhile are served as by any pod: their sessions are on peers by then. A drain
    /// that outlasts it adds nothing. Default `5s`; `0s` closes the listeners once the drain
    /// ends.
    #[serde(
        default = "default_shutdown_delay",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('5m')").message("spec.drain.shutdownDelay must be a duration between 0s and 5m"))]
    pub shutdown_delay: Duration,
}

/// The MCP protocol versions tether knows, oldest first (version keys V1–V4).
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

fn default_shutdown_delay() -> Duration {
    std::time::Duration::from_secs(5).into()
}

impl Default for UpstreamSpec {
    fn default() -> Self {
        Self {
            port: default_upstream_port(),
            path: default_mcp_path(),
            host: None,
            forward_origin: false,
        }
    }
}

impl Default for ListenSpec {
    fn default() -> Self {
        Self {
            port: default_listen_port(),
            path: default_mcp_path(),
            max_connections_per_source: None,
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
            tls: true,
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
            replication: Replication::default(),
            write_ahead: true,
        }
    }
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            timeout: default_drain_timeout(),
            shutdown_delay: default_shutdown_delay(),
        }
    }
}
