//! Command-line interface of `tether-sidecar` (every flag also reads an environment variable,
//! which is how the operator configures the sidecar container).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the drain socket is by default: a directory of the sidecar's own (the operator mounts
/// an `emptyDir` there into the sidecar container only).
pub const DEFAULT_DRAIN_SOCKET: &str = "/run/tether/drain.sock";

/// tether's per-pod sidecar: sticky MCP sessions, resumable SSE streams.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "tether-sidecar",
    version,
    about,
    after_help = "To drain a running sidecar from inside its pod: tether-sidecar drain --help"
)]
pub struct Cli {
    /// McpEndpoint manifest (YAML) with the endpoint's spec.
    #[arg(long, env = "TETHER_ENDPOINT", value_name = "FILE")]
    pub endpoint: PathBuf,
    /// This pod's IP; the MCP listener (spec.listen.port) and the admin listener
    /// (spec.admin.port) bind to it.
    #[arg(long, env = "POD_IP", value_name = "IP")]
    pub pod_ip: IpAddr,
    /// This pod's UID: identifies the pod in session ids (the session's home).
    #[arg(long, env = "POD_UID", value_name = "UID")]
    pub pod_uid: String,
    /// The endpoint's key ring: a directory in the layout of the operator's Secret (`secret`,
    /// optional `previous` and `next`, `tls.crt`, `tls.key`, `ca.crt`;
    /// `docs/design/peer-trust.md#the-key-ring`), read again whenever a file changes.
    /// `tether-sidecar keygen DIR` writes one for a sidecar run by hand.
    #[arg(
        long,
        env = "TETHER_SECRET_DIR",
        value_name = "DIR",
        required_unless_present = "secret_file",
        conflicts_with = "secret_file"
    )]
    pub secret_dir: Option<PathBuf>,
    /// A single key file (at least 16 bytes) instead of `--secret-dir`: no rotation, and no
    /// peer TLS (`spec.peer.tls` must be `false`).
    #[arg(long, env = "TETHER_SECRET_FILE", value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Static membership: a YAML list of the endpoint's pods (uid, name, address, state,
    /// revision; the format is in `docs/design/routing.md#membership`), polled every 200 ms and
    /// applied once two reads agree. Without it (and without `--peer-service`) the sidecar is
    /// the endpoint's only pod.
    #[arg(
        long,
        env = "TETHER_PEERS_FILE",
        value_name = "FILE",
        conflicts_with = "peer_service"
    )]
    pub peers_file: Option<PathBuf>,
    /// Kubernetes membership: watch the EndpointSlices of this Service of `--namespace` (the
    /// endpoint's headless peer Service, `<endpoint>-peers`) and ask each of its pods
    /// for its revision, start and ports; the operator sets it.
    #[arg(long, env = "TETHER_PEER_SERVICE", value_name = "SERVICE")]
    pub peer_service: Option<String>,
    /// This pod's revision, reported to its peers: the newest revision gets new sessions and
    /// handoffs. The operator sets it from the pod's `pod-template-hash` label (downward API);
    /// without it the revision is empty. At most 63 characters of `A-Z a-z 0-9 - _ .` (a label
    /// value); anything else is a start-up error.
    #[arg(long, env = "TETHER_REVISION", value_name = "REVISION")]
    pub revision: Option<String>,
    /// Namespace of the Service watched with `--peer-service` (the downward API's
    /// `metadata.namespace`).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        value_name = "NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,
    /// Upstream MCP endpoint, `http://host:port[/path]` or `host:port`. Default:
    /// `http://127.0.0.1:<spec.upstream.port><spec.upstream.path>`.
    #[arg(long, env = "TETHER_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,
    /// Interval of `: keep-alive` comments on idle SSE streams.
    #[arg(long, env = "TETHER_KEEP_ALIVE", value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub keep_alive: Duration,
    /// Most sessions this pod holds; further `initialize` requests get 503 `too_many_sessions` +
    /// `Retry-After`.
    #[arg(
        long,
        env = "TETHER_MAX_SESSIONS",
        value_name = "N",
        default_value_t = 10_000
    )]
    pub max_sessions: usize,
    /// Most sessions one principal (the caller a session is bound to, `spec.auth.binding`) holds
    /// on a pod, so that one caller cannot take every `--max-sessions` slot: a further
    /// `initialize` of it gets 429 `principal_sessions` + `Retry-After`. Sessions handed over by
    /// peers are not refused for it; sessions bound to no caller count against `--max-sessions`
    /// only.
    #[arg(
        long,
        env = "TETHER_MAX_PRINCIPAL_SESSIONS",
        value_name = "N",
        default_value_t = 2500
    )]
    pub max_principal_sessions: usize,
    /// Most JSON-RPC messages in one batch (a 2025-03-26 session's POST may carry a batch; 400
    /// beyond, found while parsing: a larger batch costs the parse of this many members).
    #[arg(long, env = "TETHER_MAX_BATCH", value_name = "N", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_batch: usize,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, env = "TETHER_MAX_REQUEST_BYTES", value_name = "BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// How long a request body may take to arrive (408 beyond; slow-loris defence).
    #[arg(long, env = "TETHER_REQUEST_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Largest `initialize` params, in bytes: the session's journal keeps them for its whole
    /// life to rebuild its upstream session (413 `initialize_too_large` beyond).
    #[arg(long, env = "TETHER_MAX_INITIALIZE_BYTES", value_name = "BYTES", default_value_t = 64 * 1024)]
    pub max_initialize_bytes: usize,
    /// Largest journal of one session, in bytes: its `initialize`, log level and resource
    /// subscriptions (at most 1,024), kept to rebuild its upstream session; a
    /// `resources/subscribe` or `logging/setLevel` beyond gets 413 `journal_full`.
    #[arg(long, env = "TETHER_MAX_JOURNAL_BYTES", value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub max_journal_bytes: usize,
    /// Answered requests per session whose answers stay replayable to a retry (the newest ones;
    /// also bounded by `--retry-window-bytes` and `buffer.ttl`). An older request that is
    /// retried gets a JSON-RPC error saying its result is no longer available
    /// (`data.reason` = `result_expired`), never a second execution.
    #[arg(long, env = "TETHER_RETRY_WINDOW", value_name = "REQUESTS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub retry_window: u32,
    /// Bytes of retry state per session (records, stored replies, tombstones) within which
    /// answered requests stay replayable; beyond it the oldest answered ones are forgotten.
    #[arg(long, env = "TETHER_RETRY_WINDOW_BYTES", value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub retry_window_bytes: u64,
    /// Largest retry state of one session, in bytes: its retry records (request ids, body
    /// digests), stored replies (the MCP server's complete non-SSE answers, kept for retried
    /// requests) and tombstones (forgotten answered ids). Beyond it the oldest answered requests
    /// are forgotten first; a request that still does not fit (the rest belongs to requests in
    /// flight or unread) gets 413 `retry_state_full`.
    #[arg(long, env = "TETHER_MAX_SESSION_RETRY_BYTES", value_name = "BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_session_retry_bytes: u64,
    /// How long a request's head (request line and header fields) may take to arrive: a
    /// connection's first head from the moment it was accepted, a later one from its first
    /// byte; a client still sending it then (or sending nothing) has its connection closed
    /// (slow-loris defence on the MCP, peer and admin listeners: pingora's own read timeout
    /// bounds each read, not the whole head).
    #[arg(long, env = "TETHER_HEADER_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// How long one write to a client may wait for it to read (a chunk of an SSE stream is at
    /// most 64 KiB or one event); a client that stops reading has its connection closed, and
    /// its stream stays buffered for a resume with `Last-Event-ID`.
    #[arg(long, env = "TETHER_CLIENT_WRITE_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub client_write_timeout: Duration,
    /// Most client connections the MCP listener keeps open (peers' forwarded requests count
    /// too); the first request of a further connection gets 503 `too_many_connections` +
    /// `Retry-After`, then the connection is closed.
    #[arg(
        long,
        env = "TETHER_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = 4096
    )]
    pub max_connections: usize,
    /// Most connections one source address keeps open on the MCP listener (and on the peer
    /// listener), so that one client, or one pod, cannot hold every connection of the pod; the
    /// first request of a further one gets 429 `source_connections` + `Retry-After`, then the
    /// connection is closed. Behind a gateway, whose address every client shares, raise it or
    /// set 0 (no per-source bound). `spec.listen.maxConnectionsPerSource` overrides it.
    #[arg(
        long,
        env = "TETHER_MAX_CONNECTIONS_PER_SOURCE",
        value_name = "N",
        default_value_t = 1024
    )]
    pub max_connections_per_source: usize,
    /// Most connections the admin listener keeps open (probes, `/metrics` scrapes, `/keys`,
    /// `/drained` waits); a further one's first request gets 503 + `Retry-After`.
    #[arg(
        long,
        env = "TETHER_ADMIN_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = 256
    )]
    pub admin_max_connections: usize,
    /// Most connections one source address keeps open on the admin listener (the kubelet's
    /// probes and `preStop` hooks come from the node's; 0: no per-source bound).
    #[arg(
        long,
        env = "TETHER_ADMIN_MAX_CONNECTIONS_PER_SOURCE",
        value_name = "N",
        default_value_t = 16
    )]
    pub admin_max_connections_per_source: usize,
    /// Idle connections to peer sidecars (and to the MCP server, for requests passed through
    /// as they are) kept open for reuse, across all peers: a forwarded request that finds one
    /// skips a new connection and its TLS handshake. Each closes after 20 s unused.
    #[arg(
        long,
        env = "TETHER_PEER_POOL_SIZE",
        value_name = "N",
        default_value_t = 1024
    )]
    pub peer_pool_size: usize,
    /// Requests carried at once by one HTTP/2 connection between sidecars (peer TLS on: hops
    /// multiplex over a few connections, so a client that cuts its stream costs no handshake).
    /// Each request may have 256 KiB of its answer in flight on the connection, so one
    /// connection buffers at most N × 256 KiB; more requests to a peer open another connection.
    #[arg(
        long,
        env = "TETHER_PEER_MAX_STREAMS",
        value_name = "N",
        default_value_t = 100
    )]
    pub peer_max_streams: u32,
    /// Most take-overs of one session's streams per second: a GET that ends another
    /// connection's read of the same stream (spec T-09). More get 429 `takeover_budget` +
    /// `Retry-After`, so a client reopening GETs in a loop cannot churn the session. 0 = no
    /// limit.
    #[arg(
        long,
        env = "TETHER_MAX_TAKEOVERS",
        value_name = "N",
        default_value_t = 10
    )]
    pub max_takeovers: u32,
    /// Most requests of one session running at the MCP server at once (counted from their
    /// dispatch until their answer was read whole or their stream ended, whether a client reads
    /// them or not); a further one gets 429 `session_calls` + `Retry-After` and is not sent.
    #[arg(
        long,
        env = "TETHER_MAX_SESSION_CALLS",
        value_name = "N",
        default_value_t = 64
    )]
    pub max_session_calls: usize,
    /// Most requests running at once of all the sessions bound to one caller
    /// (`spec.auth.binding`); a further one gets 429 `principal_calls` + `Retry-After`. Sessions
    /// bound to no caller have the session and pod bounds only.
    #[arg(
        long,
        env = "TETHER_MAX_PRINCIPAL_CALLS",
        value_name = "N",
        default_value_t = 512
    )]
    pub max_principal_calls: usize,
    /// Most session requests running at the MCP server at once on this pod
    /// (`tether_calls_in_flight`); a further one gets 429 `pod_calls` + `Retry-After`. Each
    /// costs the sidecar about 100 KiB while it runs (`tether_retained_bytes{kind="calls"}`), so
    /// the default follows the container: as many as fit in a quarter of `--memory-limit`,
    /// else 4,096.
    #[arg(long, env = "TETHER_MAX_CALLS", value_name = "N")]
    pub max_calls: Option<usize>,
    /// Most tasks of the tasks extension this pod tracks as open (created here and not yet
    /// seen terminal by a client, within their `ttlMs`): a drain serves the polls of those polled
    /// within `--task-poll-window` until none is left or `spec.drain.timeout`
    /// (`tether_tasks_open`). Tasks past it are still served and their ids sealed, but a drain
    /// does not wait for them (`tether_tasks_untracked_total`).
    #[arg(
        long,
        env = "TETHER_MAX_OPEN_TASKS",
        value_name = "N",
        default_value_t = 10_000
    )]
    pub max_open_tasks: usize,
    /// Most open tasks of one owner this pod tracks (the principal their ids are sealed for;
    /// all anonymous callers share one share), so that one caller's tasks nobody polls to their
    /// end cannot take every `--max-open-tasks` place; past it they are served, not tracked.
    #[arg(
        long,
        env = "TETHER_MAX_PRINCIPAL_OPEN_TASKS",
        value_name = "N",
        default_value_t = 2500
    )]
    pub max_principal_open_tasks: usize,
    /// How recently a client must have polled an open task (been sent its status) for a drain
    /// to wait for it: a task nobody polls keeps no drain waiting (its next poll, after the pod
    /// is gone, finds it failed).
    #[arg(long, env = "TETHER_TASK_POLL_WINDOW", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub task_poll_window: Duration,
    /// Largest SSE event (or line) read from the upstream, in bytes (lowered to
    /// `--pod-retained-bytes` when larger); reading stops at a larger one, never buffered whole,
    /// and its request ends with a JSON-RPC error (`data.reason` = `event_too_large`).
    #[arg(long, env = "TETHER_MAX_EVENT_BYTES", value_name = "BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_event_bytes: usize,
    /// The pod's one byte budget for everything its sessions retain
    /// (`tether_retained_bytes{kind}`): event buffers, journals, retry records, stored
    /// replies, tombstones (calls in flight show there too, bounded by `--max-calls`). Default: half of `--memory-limit`, else 128 MiB. Over it, the
    /// events clients were sent and the answers of spent requests are given up, oldest first;
    /// while what cannot be freed (journals, tombstones, events no client was sent) fills it,
    /// upstream responses are not read and new sessions and requests get 429 `pod_full`.
    /// `--pod-buffer-bytes` is an older name of it.
    #[arg(
        long,
        alias = "pod-buffer-bytes",
        env = "TETHER_POD_RETAINED_BYTES",
        value_name = "BYTES"
    )]
    pub pod_retained_bytes: Option<u64>,
    /// Each session's share of buffered event data, in bytes (lowered to
    /// `--pod-retained-bytes` when larger): beyond it the events clients were sent go, the
    /// oldest completed streams' first; while events no client was sent fill it, the session's
    /// upstream responses are not read, so one session cannot take the pod's budget.
    #[arg(long, env = "TETHER_MAX_SESSION_BUFFER_BYTES", value_name = "BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_session_buffer_bytes: u64,
    /// Most bytes the sessions of one principal (the caller a session is bound to,
    /// `spec.auth.binding`) pin together — journals, tombstones, events no client was sent —
    /// so that one caller cannot fill `--pod-retained-bytes` with answers it never reads.
    /// Default: a quarter of `--pod-retained-bytes`. At it, the caller's requests get 429
    /// `principal_retained`; when the pod's budget is full, a caller over its fair share (the
    /// budget divided among the callers pinning bytes) gets it too and its unread buffers are
    /// shed, while the others go on. Sessions bound to no caller count against the pod's
    /// budget only.
    #[arg(
        long,
        env = "TETHER_MAX_PRINCIPAL_RETAINED_BYTES",
        value_name = "BYTES"
    )]
    pub max_principal_retained_bytes: Option<u64>,
    /// How long the events of a stream no client was ever sent an event of stay buffered (at
    /// most `spec.buffer.ttl`): no client holds a cursor of such a stream, only a retry of
    /// its request can still read it (a stream a reader left mid-way keeps `spec.buffer.ttl`).
    /// A later retry gets 400 `cursor_evicted`.
    #[arg(long, env = "TETHER_UNREAD_TTL", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub unread_ttl: std::time::Duration,
    /// The sidecar container's memory limit, in bytes (the operator sets it from the Downward
    /// API, `resources.limits.memory`): the default `--pod-retained-bytes` is half of it.
    #[arg(long, env = "TETHER_MEMORY_LIMIT", value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Idle connections to the MCP server kept open for reuse: a connection that falls idle
    /// beyond them is closed, and an idle one is closed after 60 s. A burst of concurrent
    /// requests opens as many connections; afterwards only these stay.
    #[arg(
        long,
        env = "TETHER_UPSTREAM_MAX_IDLE_CONNECTIONS",
        value_name = "N",
        default_value_t = 32
    )]
    pub upstream_max_idle_connections: usize,
    /// Most `DELETE`s of upstream sessions the sidecar sends on its own at once (sessions it
    /// expired, an upstream session a 2026-07-28 request opened, a replaced copy's): a sweep
    /// that expires thousands of sessions ends theirs this many at a time, each waiting one a
    /// few hundred bytes (`tether_upstream_deletes_pending`), instead of opening thousands of
    /// connections to the MCP server at once.
    #[arg(long, env = "TETHER_MAX_UPSTREAM_DELETES", value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_upstream_deletes: u32,
    /// Most tools remembered from the MCP server's `tools/list` answers, with whether it
    /// declares each read-only (harmless to call again): a call of such a tool
    /// skips the write-ahead. A tool beyond this many waits as any other
    /// (`tether_write_ahead_tools`).
    #[arg(
        long,
        env = "TETHER_WRITE_AHEAD_MAX_TOOLS",
        value_name = "N",
        default_value_t = 1024
    )]
    pub write_ahead_max_tools: usize,
    /// How long the upstream may take to send response headers (504 beyond).
    #[arg(long, env = "TETHER_UPSTREAM_TIMEOUT", value_name = "DURATION", default_value = "300s", value_parser = parse_duration)]
    pub upstream_timeout: Duration,
    /// Wait before resuming an upstream SSE stream closed early without a `retry` hint.
    #[arg(long, env = "TETHER_UPSTREAM_RETRY", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub upstream_retry: Duration,
    /// How long a session whose upstream session must be rebuilt (the MCP server restarted, or
    /// the session was handed over) waits for an MCP server that is not ready — refusing
    /// connections, answering 502/503/504 or not in time — before it ends. Meanwhile its
    /// requests get 503 `upstream_not_ready` + `Retry-After` and each retries the rebuild.
    #[arg(long, env = "TETHER_REBUILD_RETRY_FOR", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub rebuild_retry_for: Duration,
    /// Worker threads of the MCP listener.
    #[arg(long, env = "TETHER_THREADS", value_name = "N", default_value_t = 2)]
    pub threads: usize,
    /// Hand sessions to peers when draining (`docs/design/handoff.md`). `false` keeps
    /// them on the draining pod until it stops (the baseline the rolling-upgrade demo compares
    /// against); `spec.session.migration: Pin` does the same per endpoint.
    #[arg(long, env = "TETHER_HANDOFF", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub handoff: bool,
    /// Most resumes (`GET` + `Last-Event-ID`) this pod serves per second, with a burst of as
    /// many; more get 429 + `Retry-After` (a reconnect storm after a pod stops is spread out).
    /// 0 = no limit.
    #[arg(
        long,
        env = "TETHER_RESUME_BUDGET",
        value_name = "N",
        default_value_t = 0
    )]
    pub resume_budget: u32,
    /// Largest peer-protocol message (a pushed session or a tail batch), in bytes; larger
    /// buffers travel in several messages.
    #[arg(long, env = "TETHER_PEER_MAX_MESSAGE_BYTES", value_name = "BYTES", default_value_t = 16 * 1024 * 1024)]
    pub peer_max_message_bytes: usize,
    /// This pod's pod settings (ports, paths, upstream, migration, drain) as the JSON of the
    /// `mcp.tether.dev/pod-settings` annotation, which the operator passes through the downward
    /// API; they override the endpoint file's, so a sidecar restarted in an old pod during a
    /// rollout keeps the settings its pod was made for.
    #[arg(long, env = "TETHER_POD_SETTINGS", value_name = "JSON")]
    pub pod_settings: Option<String>,
    /// How often the endpoint file is checked for changes. Origins, protocol versions, buffer
    /// bounds and the idle timeout are reloaded in place; other fields need a restart
    /// (`tether_crds::reload`).
    #[arg(long, env = "TETHER_CONFIG_POLL", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub config_poll: Duration,
    /// How long membership may go without its source confirming it (a failing EndpointSlice
    /// watch, an unreadable peers file) before a request for a session this pod cannot find
    /// gets 503 + `Retry-After` instead of 404 (`tether_membership_age_seconds`).
    #[arg(long, env = "TETHER_MEMBERSHIP_STALE_AFTER", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub membership_stale_after: Duration,
    /// How long a pod must have been routable before sessions adopted elsewhere follow it as
    /// their new `owner(S)`, and the least time between two such moves of one session
    /// (`docs/design/handoff.md#adopted-sessions-follow-the-owner`).
    #[arg(long, env = "TETHER_REBALANCE_DWELL", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub rebalance_dwell: Duration,
    /// Unix socket on which the sidecar takes the request to drain (`tether-sidecar drain`
    /// sends it); mode 0600, in a directory only the sidecar's container mounts, so nothing
    /// outside the sidecar — not the MCP server's container, not the network — can start a
    /// drain. A stale socket file from an earlier run is replaced.
    #[arg(long, env = "TETHER_DRAIN_SOCKET", value_name = "FILE", default_value = DEFAULT_DRAIN_SOCKET)]
    pub drain_socket: PathBuf,
    /// Log format, `text` or `json`. The level comes from `RUST_LOG` (default `info`); at
    /// `debug` or `trace` pingora's own targets stay at `info` unless `RUST_LOG` names them,
    /// since they print request headers, session ids among them.
    #[arg(
        long,
        env = "TETHER_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// `--max-calls` when `--memory-limit` and the flag are both absent.
pub(crate) const DEFAULT_MAX_CALLS: usize = 4096;

/// `--pod-retained-bytes` when `--memory-limit` and the flag are both absent: 128 MiB.
pub(crate) const DEFAULT_POD_RETAINED_BYTES: u64 = 128 * 1024 * 1024;

impl Cli {
    /// The pod's byte budget: `--pod-retained-bytes`, else half of `--memory-limit`, else
    /// [`DEFAULT_POD_RETAINED_BYTES`].
    pub(crate) fn pod_retained_bytes(&self) -> u64 {
        self.pod_retained_bytes.unwrap_or_else(|| {
            self.memory_limit
                .map_or(DEFAULT_POD_RETAINED_BYTES, |limit| limit / 2)
        })
    }

    /// Most calls in flight on the pod: `--max-calls`, else as many as a quarter of
    /// `--memory-limit` holds, else [`DEFAULT_MAX_CALLS`].
    pub(crate) fn max_calls(&self) -> usize {
        self.max_calls.unwrap_or_else(|| {
            self.memory_limit.map_or(DEFAULT_MAX_CALLS, |limit| {
                usize::try_from(limit / 4 / crate::broker::CALL_BYTES)
                    .unwrap_or(usize::MAX)
                    .max(1)
            })
        })
    }

    /// What one principal's sessions may pin: `--max-principal-retained-bytes`, else a
    /// quarter of the pod's budget.
    pub(crate) fn max_principal_retained_bytes(&self) -> u64 {
        self.max_principal_retained_bytes
            .unwrap_or_else(|| self.pod_retained_bytes() / 4)
    }
}

/// `tether-sidecar drain`: drains the sidecar running in this pod (the `preStop` hook the
/// operator injects into the sidecar container) and waits until the drain is done.
///
/// Prints the drain's outcome as JSON (`{"drained":true,"inFlight":0,"handedOff":N,…}`) and
/// exits 0 when every request in flight finished, 1 when `spec.drain.timeout` passed first, 2
/// when the sidecar cannot be reached.
#[derive(Clone, Debug, Parser)]
#[command(name = "tether-sidecar drain", version)]
pub struct DrainCli {
    /// The running sidecar's drain socket (its `--drain-socket`).
    #[arg(long, env = "TETHER_DRAIN_SOCKET", value_name = "FILE", default_value = DEFAULT_DRAIN_SOCKET)]
    pub drain_socket: PathBuf,
}

/// `tether-sidecar keygen`: writes a new key ring (an HMAC key, a CA and a peer certificate,
/// `docs/design/peer-trust.md#the-key-ring`) into a directory, for sidecars run by hand; give
/// every sidecar of one endpoint the same directory's files (`--secret-dir`). Exits 0 when
/// written, 1 when the directory already holds a key ring (it is never overwritten), 2 on an
/// I/O error.
#[derive(Clone, Debug, Parser)]
#[command(name = "tether-sidecar keygen", version)]
pub struct KeygenCli {
    /// The directory to write (created when missing; files are readable by their owner only).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Written into the certificates' common names, e.g. `<namespace>/<endpoint>`.
    #[arg(long, value_name = "LABEL", default_value = "local")]
    pub label: String,
}

/// Parses a positive Kubernetes-style duration (`500ms`, `15s`, `5m`, `1h30m`).
///
/// # Errors
/// A message for malformed, negative or zero durations.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: tether_crds::Duration = s
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 15s or 5m: {e}"))?;
    if d.is_negative() || Duration::from(d).is_zero() {
        return Err(format!("{s:?} must be a positive duration"));
    }
    Ok(d.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("15").is_err());
    }

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        DrainCli::command().debug_assert();
        KeygenCli::command().debug_assert();
    }

    /// `docs/reference/sidecar-flags.md`: every flag with its environment variable, default
    /// and help, as clap knows them.
    fn flags_reference() -> String {
        use clap::CommandFactory;
        let mut out = String::from(
            "# `tether-sidecar` flags\n\n\
             <!-- Generated from the sidecar's command line (sidecar/src/config/cli.rs); do not \
             edit. Regenerate with: make references -->\n\n\
             The operator configures the injected sidecar through the environment variables; run \
             by hand, the flags are the same. Durations are Kubernetes durations (`500ms`, `15s`, \
             `5m`, `1h30m`); sizes are bytes. The endpoint itself (ports, paths, Origins, \
             protocol versions, buffer bounds, timeouts) comes from the `--endpoint` file, an \
             `McpEndpoint` manifest ([crd.md](crd.md)).\n\n",
        );
        out.push_str(&flag_table(&Cli::command()));
        out.push_str(
            "\n## `tether-sidecar drain`\n\n\
             Drains the sidecar running in this pod through its drain socket and waits until the \
             drain is done (the sidecar container's `preStop` hook). Prints the outcome as JSON; \
             exits 0 when drained, 1 when `spec.drain.timeout` passed first, 2 when the sidecar \
             cannot be reached.\n\n",
        );
        out.push_str(&flag_table(&DrainCli::command()));
        out.push_str(
            "\n## `tether-sidecar keygen DIR`\n\n\
             Writes a new key ring (an HMAC key, a per-endpoint CA and the peer certificate it \
             signed) into `DIR`, for sidecars run by hand: give every sidecar of one endpoint the \
             same files with `--secret-dir`. Never overwrites a key ring; exits 0 when written, 1 \
             when `DIR` holds one already, 2 on an I/O error.\n\n",
        );
        out.push_str(&flag_table(&KeygenCli::command()));
        out
    }

    /// One row per flag of `command`: flag, environment variable, default, help.
    fn flag_table(command: &clap::Command) -> String {
        let mut out =
            String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["help", "version"].contains(&long) {
                continue;
            }
            let value = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map(|n| format!(" {n}"))
                .unwrap_or_default();
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|d| format!("`{}`", d.to_string_lossy()))
                .collect();
            let default = match (arg.is_required_set(), defaults.is_empty()) {
                (true, _) => "required".to_owned(),
                (false, true) => "none".to_owned(),
                (false, false) => defaults.join(", "),
            };
            let help = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(|h| {
                    h.to_string()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "| `--{long}{value}` | {env} | {default} | {help} |\n"
            ));
        }
        out
    }

    #[test]
    fn the_flags_reference_is_generated_from_the_cli() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = "docs/reference/sidecar-flags.md";
        if let Err(e) = tether_crds::reference::check_generated(&root, path, &flags_reference()) {
            panic!("{e}");
        }
    }
}
