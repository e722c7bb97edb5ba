//! Prometheus metrics of the sidecar (`docs/reference/metrics.md`), served on the admin port at
//! `/metrics`.
//!
//! Every name starts with `tether_`. Labels never carry a session id: only reasons, methods,
//! eras and protocol versions, each from a small fixed set.

use std::time::Duration;

use http::{Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tether_crds::ProtocolVersion;

use crate::mcp::admission::Era;
use crate::mcp::rejection::{NotFound, Rejection};
use crate::stream::buffer::Evictions;

/// A `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    /// The reason.
    reason: &'static str,
}

/// Labels of `tether_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerReason {
    /// `mcp`, `peer` or `admin`.
    listener: &'static str,
    /// `listener_full` or `source_full`.
    reason: &'static str,
}

/// Labels of `tether_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// HTTP method.
    method: &'static str,
    /// `sessionful` (2025-03-26 … 2025-11-25) or `stateless` (2026-07-28).
    era: &'static str,
}

/// Labels of `tether_rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    /// HTTP status.
    status: u16,
    /// Rejection reason (`docs/reference/status-codes.md`).
    reason: &'static str,
}

/// Labels of `tether_resumes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResumeLabels {
    /// `hit` or `miss`.
    result: &'static str,
    /// Why a resume missed (`none` for hits).
    reason: &'static str,
}

/// Labels of `tether_protocol_version_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    /// The protocol version in effect for the request.
    version: &'static str,
}

/// Labels of `tether_request_id_reuse_total` and `tether_mrtr_retries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// What became of the request (each family lists its outcomes).
    outcome: &'static str,
}

/// Labels of `tether_membership_changes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    /// The membership source (`peers_file`, `kubernetes`).
    source: &'static str,
}

/// Labels of `tether_ring_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    /// `routable`, `draining` or `gone`.
    state: &'static str,
}

/// Labels of `tether_forwards_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    /// `home` (to the session's home), `walk` (the ranked walk of a gone home), `placement`
    /// (an `initialize` or stateless request of a draining pod).
    kind: &'static str,
    /// `ok` (the peer answered), `connect_error` (the next candidate was tried),
    /// `client_closed` (the client left mid-exchange), `error` (the peer broke it off).
    outcome: &'static str,
}

/// Labels of `tether_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// The result.
    result: &'static str,
}

/// Labels of `tether_retained_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    /// What is retained: `journal`, `records` or `buffers`.
    kind: &'static str,
}

/// Labels of `tether_forward_hops_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HopLabel {
    /// The hop number of the forwarded request (1 or 2).
    hop: u8,
}

/// Labels of `tether_peer_connects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReusedLabel {
    /// Whether a pooled connection was reused (`true`) or a new one opened (`false`).
    reused: &'static str,
}

/// The sidecar's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Requests admitted to the MCP endpoint, by method and era.
    requests: Family<RequestLabels, Counter>,
    /// Requests answered with an error by the sidecar itself, by status and reason.
    rejections: Family<RejectionLabels, Counter>,
    /// 404s for a session id, by reason (forged, unknown, deleted, expired, upstream_gone).
    not_found: Family<Reason, Counter>,
    /// Requests refused for their `Origin`.
    origin_rejections: Counter,
    /// Requests by the protocol version in effect.
    protocol_versions: Family<VersionLabel, Counter>,
    /// Sessions held now.
    sessions: Gauge,
    /// Sessions created.
    sessions_created: Counter,
    /// Sessions ended, by reason (deleted, expired, upstream_gone).
    sessions_ended: Family<Reason, Counter>,
    /// Streams held now (live and tombstones).
    streams: Gauge,
    /// Events buffered now.
    buffer_events: Gauge,
    /// Bytes of event data buffered now.
    buffer_bytes: Gauge,
    /// Bytes of buffered events no client was sent yet.
    buffer_unsent_bytes: Gauge,
    /// Events received from the upstream and buffered.
    events_buffered: Counter,
    /// Buffered events evicted, by reason (count, bytes, ttl, pod_cap, session_cap).
    evictions: Family<Reason, Counter>,
    /// Resumes with `Last-Event-ID`, by result and miss reason.
    resumes: Family<ResumeLabels, Counter>,
    /// Events replayed to resuming clients.
    replayed_events: Counter,
    /// Requests whose id the session had seen before, by what became of them.
    request_id_reuse: Family<OutcomeLabel, Counter>,
    mrtr_retries: Family<OutcomeLabel, Counter>,
    /// `subscriptions/listen` streams ended because the credential that opened them expired.
    streams_credential_expired: Counter,
    /// Sessions the sweeper looked at (the ones due, not every one held).
    sweep_sessions: Counter,
    /// Upstream SSE streams resumed by the sidecar after an early close (SEP-1699 polling).
    upstream_resumes: Counter,
    /// Times an upstream task stopped reading its response for want of room (backpressure).
    upstream_paused: Counter,
    /// Seconds upstream tasks spent so paused, in all.
    upstream_paused_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Upstream tasks paused now.
    upstream_paused_now: Gauge,
    /// Upstream failures, by kind.
    upstream_errors: Family<Reason, Counter>,
    /// Sessions whose upstream session was rebuilt from the journal.
    sessions_rebuilt: Counter,
    /// Time from a resume request to its response headers, in seconds.
    resume_seconds: Histogram,
    /// Membership changes applied, by source.
    membership_changes: Family<SourceLabel, Counter>,
    /// Pods in the current membership, by state.
    ring_pods: Family<StateLabel, Gauge>,
    /// Seconds since membership's source last confirmed its view (0 while it reads its input).
    membership_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Requests forwarded to a peer, by kind and outcome.
    forwards: Family<ForwardLabels, Counter>,
    /// Forwarded requests by the hop number they left with.
    forward_hops: Family<HopLabel, Counter>,
    /// Connections forwarded requests went out on, pooled or new.
    peer_connects: Family<ReusedLabel, Counter>,
    /// Peers the health probes currently find down, by cause (`refused`, `unresponsive`).
    peers_down: Family<Reason, Gauge>,
    /// Time from the start of a drain to its end (all requests done, or the deadline), in
    /// seconds.
    drain_seconds: Histogram,
    /// Sessions handed to a peer and acknowledged by it.
    handoffs_sent: Counter,
    /// Sessions adopted from a peer.
    handoffs_received: Counter,
    /// Handoff attempts that failed, by reason (`unreachable`, `refused`, `no_target`,
    /// `tail`): a session whose every candidate failed stays here.
    handoffs_failed: Family<Reason, Counter>,
    /// Time from the start of a session's handoff to the peer's acknowledgement, in seconds.
    handoff_seconds: Histogram,
    /// Events of handed-off streams forwarded to their new holder after the push.
    tail_events_forwarded: Counter,
    /// Requests still running at the drain deadline, ended with a JSON-RPC error.
    requests_cut: Counter,
    /// Changes of the endpoint file seen, by result (`applied`, `invalid`, `unreadable`).
    config_reloads: Family<ResultLabel, Counter>,
    /// Changes of the key ring's files seen, by result (`applied`, `invalid`).
    key_ring_reloads: Family<ResultLabel, Counter>,
    /// 1 while the endpoint file asks for pod settings other than the running ones (they take
    /// effect when the pod restarts), else 0.
    config_restart_pending: Gauge,
    /// Admin requests refused, by reason (`drain_not_local`: `/drain` from the network).
    admin_refused: Family<Reason, Counter>,
    /// Bytes the pod's sessions retain now, by kind (`journal`, `records`, `buffers`).
    retained_bytes: Family<KindLabel, Gauge>,
    revalidations: Family<ResultLabel, Counter>,
    /// Upstream SSE events over `--max-event-bytes`: reading stopped there, the event was never
    /// buffered.
    upstream_events_too_large: Counter,
    /// Client connections open on the MCP listener.
    client_connections: Gauge,
    /// Connections open on the peer listener.
    peer_connections: Gauge,
    /// Connections open on the admin listener.
    admin_connections: Gauge,
    /// Session requests running at the MCP server (`--max-calls`).
    calls_in_flight: Gauge,
    /// Connections refused a slot, by listener and reason.
    connections_refused: Family<ListenerReason, Counter>,
    /// Peer messages and connections refused before anything was spent on them, by reason.
    peer_auth_failures: Family<Reason, Counter>,
    /// Nonces of peer messages remembered within the time window.
    peer_nonces: Gauge,
    /// Connections closed because a request head was not complete `--header-timeout` after its
    /// first byte.
    header_timeouts: Counter,
    /// Request heads pingora refused before the sidecar saw them (400: malformed, over 256
    /// header fields or 1 MiB; 405: `CONNECT`).
    request_heads_refused: Counter,
    /// Connections closed because a write to the client waited `--client-write-timeout`.
    client_write_timeouts: Counter,
    /// GETs that took a stream over from another connection (spec T-09).
    stream_takeovers: Counter,
    /// Tasks of the tasks extension created on this pod that a client may still poll
    /// (`--max-open-tasks`).
    tasks_open: Gauge,
    upstream_deletes_pending: Gauge,
    /// Tasks not tracked because `--max-open-tasks` were open: a drain does not wait for them.
    tasks_untracked: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("tether");
        let m = Self {
            requests: Family::default(),
            rejections: Family::default(),
            not_found: Family::default(),
            origin_rejections: Counter::default(),
            protocol_versions: Family::default(),
            sessions: Gauge::default(),
            sessions_created: Counter::default(),
            sessions_ended: Family::default(),
            streams: Gauge::default(),
            buffer_events: Gauge::default(),
            buffer_bytes: Gauge::default(),
            buffer_unsent_bytes: Gauge::default(),
            events_buffered: Counter::default(),
            evictions: Family::default(),
            resumes: Family::default(),
            replayed_events: Counter::default(),
            request_id_reuse: Family::default(),
            mrtr_retries: Family::default(),
            streams_credential_expired: Counter::default(),
            sweep_sessions: Counter::default(),
            upstream_resumes: Counter::default(),
            upstream_paused: Counter::default(),
            upstream_paused_seconds: Counter::default(),
            upstream_paused_now: Gauge::default(),
            upstream_errors: Family::default(),
            sessions_rebuilt: Counter::default(),
            resume_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            membership_changes: Family::default(),
            ring_pods: Family::default(),
            membership_age_seconds: Gauge::default(),
            forwards: Family::default(),
            forward_hops: Family::default(),
            peer_connects: Family::default(),
            peers_down: Family::default(),
            drain_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            handoffs_sent: Counter::default(),
            handoffs_received: Counter::default(),
            handoffs_failed: Family::default(),
            handoff_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            tail_events_forwarded: Counter::default(),
            requests_cut: Counter::default(),
            tasks_open: Gauge::default(),
            upstream_deletes_pending: Gauge::default(),
            tasks_untracked: Counter::default(),
            config_reloads: Family::default(),
            key_ring_reloads: Family::default(),
            config_restart_pending: Gauge::default(),
            admin_refused: Family::default(),
            retained_bytes: Family::default(),
            revalidations: Family::default(),
            upstream_events_too_large: Counter::default(),
            client_connections: Gauge::default(),
            peer_connections: Gauge::default(),
            admin_connections: Gauge::default(),
            calls_in_flight: Gauge::default(),
            connections_refused: Family::default(),
            peer_auth_failures: Family::default(),
            peer_nonces: Gauge::default(),
            header_timeouts: Counter::default(),
            request_heads_refused: Counter::default(),
            client_write_timeouts: Counter::default(),
            stream_takeovers: Counter::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("requests", "MCP requests admitted", m.requests.clone());
        r.register(
            "rejections",
            "Requests answered with an error by the sidecar",
            m.rejections.clone(),
        );
        r.register(
            "not_found",
            "404s for a session id, by reason",
            m.not_found.clone(),
        );
        r.register(
            "origin_rejections",
            "Requests refused for their Origin",
            m.origin_rejections.clone(),
        );
        r.register(
            "protocol_version_requests",
            "Requests by protocol version",
            m.protocol_versions.clone(),
        );
        r.register("sessions", "Sessions held", m.sessions.clone());
        r.register(
            "sessions_created",
            "Sessions created",
            m.sessions_created.clone(),
        );
        r.register(
            "sessions_ended",
            "Sessions ended, by reason",
            m.sessions_ended.clone(),
        );
        r.register(
            "streams",
            "Streams held (live and tombstones)",
            m.streams.clone(),
        );
        r.register("buffer_events", "Events buffered", m.buffer_events.clone());
        r.register(
            "buffer_bytes",
            "Bytes of event data buffered",
            m.buffer_bytes.clone(),
        );
        r.register(
            "buffer_unsent_bytes",
            "Bytes of buffered events no client was sent yet",
            m.buffer_unsent_bytes.clone(),
        );
        r.register(
            "events_buffered",
            "Events received from the upstream and buffered",
            m.events_buffered.clone(),
        );
        r.register(
            "buffer_evictions",
            "Buffered events evicted, by reason",
            m.evictions.clone(),
        );
        r.register("resumes", "Resumes with Last-Event-ID", m.resumes.clone());
        r.register(
            "replayed_events",
            "Events replayed to resuming clients",
            m.replayed_events.clone(),
        );
        r.register(
            "streams_credential_expired",
            "subscriptions/listen streams ended because the JWT that opened them expired",
            m.streams_credential_expired.clone(),
        );
        r.register(
            "request_id_reuse",
            "Requests whose id the session had seen before: joined, replayed, expired, run or refused",
            m.request_id_reuse.clone(),
        );
        r.register(
            "mrtr_retries",
            "Retries of multi round-trip requests: forwarded to the pod that issued their requestState, served by it, or served elsewhere (issuer_gone, too_large)",
            m.mrtr_retries.clone(),
        );
        r.register(
            "sweep_sessions",
            "Sessions the sweeper looked at: those due to turn idle or with something expiring",
            m.sweep_sessions.clone(),
        );
        r.register(
            "upstream_resumes",
            "Upstream SSE streams resumed after an early close",
            m.upstream_resumes.clone(),
        );
        r.register(
            "upstream_paused",
            "Times an upstream response was not read for want of buffer room",
            m.upstream_paused.clone(),
        );
        r.register(
            "upstream_paused_seconds",
            "Seconds upstream responses were not read for want of buffer room",
            m.upstream_paused_seconds.clone(),
        );
        r.register(
            "upstream_paused_streams",
            "Upstream responses not read now for want of buffer room",
            m.upstream_paused_now.clone(),
        );
        r.register(
            "upstream_errors",
            "Upstream failures",
            m.upstream_errors.clone(),
        );
        r.register(
            "sessions_rebuilt",
            "Sessions whose upstream session was rebuilt from the journal",
            m.sessions_rebuilt.clone(),
        );
        r.register(
            "resume_seconds",
            "Time from a resume request to its response headers",
            m.resume_seconds.clone(),
        );
        r.register(
            "membership_changes",
            "Membership changes applied, by source",
            m.membership_changes.clone(),
        );
        r.register(
            "ring_pods",
            "Pods in the current membership, by state",
            m.ring_pods.clone(),
        );
        r.register(
            "membership_age_seconds",
            "Seconds since membership's source last confirmed its view (0 while it reads its input)",
            m.membership_age_seconds.clone(),
        );
        r.register(
            "forwards",
            "Requests forwarded to a peer sidecar, by kind and outcome",
            m.forwards.clone(),
        );
        r.register(
            "forward_hops",
            "Forwarded requests by hop number",
            m.forward_hops.clone(),
        );
        r.register(
            "peer_connects",
            "Connections forwarded requests went out on, by whether a pooled one was reused",
            m.peer_connects.clone(),
        );
        r.register(
            "peers_down",
            "Peers the health probes find down, by cause",
            m.peers_down.clone(),
        );
        r.register(
            "drain_seconds",
            "Time a drain took, until requests in flight finished or the deadline",
            m.drain_seconds.clone(),
        );
        r.register(
            "handoffs_sent",
            "Sessions handed to a peer and acknowledged",
            m.handoffs_sent.clone(),
        );
        r.register(
            "handoffs_received",
            "Sessions adopted from a peer",
            m.handoffs_received.clone(),
        );
        r.register(
            "handoffs_failed",
            "Failed handoff attempts, by reason",
            m.handoffs_failed.clone(),
        );
        r.register(
            "handoff_seconds",
            "Time from the start of a handoff to the peer's acknowledgement",
            m.handoff_seconds.clone(),
        );
        r.register(
            "tail_events_forwarded",
            "Events of handed-off streams forwarded to their new holder",
            m.tail_events_forwarded.clone(),
        );
        r.register(
            "requests_cut",
            "Requests ended with a JSON-RPC error at the drain deadline",
            m.requests_cut.clone(),
        );
        r.register(
            "tasks_open",
            "Tasks created on this pod that a client may still poll",
            m.tasks_open.clone(),
        );
        r.register(
            "upstream_deletes_pending",
            "Upstream DELETEs the sidecar sends on its own (expired sessions' and others), waiting or in flight: at most --max-upstream-deletes at once",
            m.upstream_deletes_pending.clone(),
        );
        r.register(
            "tasks_untracked",
            "Tasks not tracked because --max-open-tasks were open",
            m.tasks_untracked.clone(),
        );
        r.register(
            "key_ring_reloads",
            "Changes of the key ring's files seen, by result",
            m.key_ring_reloads.clone(),
        );
        r.register(
            "config_reloads",
            "Changes of the endpoint file seen, by result",
            m.config_reloads.clone(),
        );
        r.register(
            "config_restart_pending",
            "1 while the endpoint file asks for pod settings that need a restart",
            m.config_restart_pending.clone(),
        );
        r.register(
            "admin_refused",
            "Admin requests refused, by reason",
            m.admin_refused.clone(),
        );
        r.register(
            "retained_bytes",
            "Bytes the pod's sessions retain, by kind",
            m.retained_bytes.clone(),
        );
        r.register(
            "revalidations",
            "Pings asking the MCP server whether it still accepts a credential before an answer from memory, by result",
            m.revalidations.clone(),
        );
        r.register(
            "upstream_events_too_large",
            "Upstream SSE events over --max-event-bytes, never buffered",
            m.upstream_events_too_large.clone(),
        );
        r.register(
            "client_connections",
            "Client connections open on the MCP listener",
            m.client_connections.clone(),
        );
        r.register(
            "peer_connections",
            "Connections open on the peer listener",
            m.peer_connections.clone(),
        );
        r.register(
            "admin_connections",
            "Connections open on the admin listener",
            m.admin_connections.clone(),
        );
        r.register(
            "calls_in_flight",
            "Session requests running at the MCP server now, read by a client or not",
            m.calls_in_flight.clone(),
        );
        r.register(
            "connections_refused",
            "Connections refused a slot (over the listener's cap or its per-source cap), by listener and reason",
            m.connections_refused.clone(),
        );
        r.register(
            "peer_auth_failures",
            "Peer messages and connections refused before anything was spent on them, by reason",
            m.peer_auth_failures.clone(),
        );
        r.register(
            "peer_nonces",
            "Nonces of peer messages remembered within the time window",
            m.peer_nonces.clone(),
        );
        r.register(
            "header_timeouts",
            "Connections closed for a request head not complete within --header-timeout",
            m.header_timeouts.clone(),
        );
        r.register(
            "request_heads_refused",
            "Request heads pingora refused before the sidecar saw them",
            m.request_heads_refused.clone(),
        );
        r.register(
            "client_write_timeouts",
            "Connections closed for a write waiting --client-write-timeout",
            m.client_write_timeouts.clone(),
        );
        r.register(
            "stream_takeovers",
            "GETs that took a stream over from another connection",
            m.stream_takeovers.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts a rejection in `tether_rejections_total{status, reason}`, a 404 for a session id
    /// also in `tether_not_found_total{reason}`, and a refused `Origin` in
    /// `tether_origin_rejections_total`.
    pub(crate) fn rejection(&self, rejection: &Rejection) {
        self.rejections
            .get_or_create(&RejectionLabels {
                status: rejection.status().as_u16(),
                reason: rejection.reason(),
            })
            .inc();
        match rejection {
            Rejection::SessionNotFound(why) => {
                self.not_found
                    .get_or_create(&Reason {
                        reason: why.label(),
                    })
                    .inc();
            }
            Rejection::OriginForbidden => {
                self.origin_rejections.inc();
            }
            _ => {}
        }
    }

    /// Counts an admitted request in `tether_requests_total{method, era}`.
    pub(crate) fn request(&self, method: &Method, era: Era) {
        let method = match *method {
            Method::GET => "GET",
            Method::POST => "POST",
            Method::DELETE => "DELETE",
            _ => "OTHER",
        };
        self.requests
            .get_or_create(&RequestLabels {
                method,
                era: era.label(),
            })
            .inc();
    }

    /// Counts a request in `tether_protocol_version_requests_total{version}` by the protocol
    /// version in effect for it.
    pub(crate) fn protocol_version(&self, version: ProtocolVersion) {
        self.protocol_versions
            .get_or_create(&VersionLabel {
                version: version.as_str(),
            })
            .inc();
    }

    /// A session created here: `tether_sessions` up, `tether_sessions_created_total`.
    pub(crate) fn session_created(&self) {
        self.sessions.inc();
        self.sessions_created.inc();
    }

    /// A session adopted from a peer: `tether_handoffs_received_total`, and `tether_sessions`
    /// up when it is `new` here (not a copy of an earlier push it replaces).
    pub(crate) fn session_adopted(&self, new: bool) {
        if new {
            self.sessions.inc();
        }
        self.handoffs_received.inc();
    }

    /// A session handed off from here and taken back (its new holder is gone): `tether_sessions`
    /// up.
    pub(crate) fn session_reclaimed(&self) {
        self.sessions.inc();
    }

    /// A session handed to a peer that acknowledged it: `tether_sessions` down,
    /// `tether_handoffs_sent_total`.
    pub(crate) fn session_handed_off(&self) {
        self.sessions.dec();
        self.handoffs_sent.inc();
    }

    /// A session ended here: `tether_sessions` down, `tether_sessions_ended_total{reason}`.
    pub(crate) fn session_ended(&self, reason: NotFound) {
        self.sessions.dec();
        self.sessions_ended
            .get_or_create(&Reason {
                reason: reason.label(),
            })
            .inc();
    }

    /// An upstream session rebuilt from its journal (`tether_sessions_rebuilt_total`).
    pub(crate) fn session_rebuilt(&self) {
        self.sessions_rebuilt.inc();
    }

    /// An event received from the upstream and buffered (`tether_events_buffered_total`).
    pub(crate) fn event_buffered(&self) {
        self.events_buffered.inc();
    }

    /// The stream, event and byte gauges (`tether_streams`, `tether_buffer_events`,
    /// `tether_buffer_bytes`), as the sweep counted them, and the pod's bytes of events no
    /// client was sent yet (`tether_buffer_unsent_bytes`).
    pub(crate) fn buffered(&self, streams: u64, events: u64, bytes: u64, unsent: u64) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.streams.set(gauge(streams));
        self.buffer_events.set(gauge(events));
        self.buffer_bytes.set(gauge(bytes));
        self.buffer_unsent_bytes.set(gauge(unsent));
    }

    /// A resume served from the buffer: `tether_resumes_total{result="hit"}`, the events it
    /// replays (`tether_replayed_events_total`) and the time to its response headers
    /// (`tether_resume_seconds`).
    pub(crate) fn resume_hit(&self, replayed: u64, took: Duration) {
        self.resumes
            .get_or_create(&ResumeLabels {
                result: "hit",
                reason: "none",
            })
            .inc();
        self.replayed_events.inc_by(replayed);
        self.resume_seconds.observe(took.as_secs_f64());
    }

    /// A revalidation `ping` answered `status`: `tether_revalidations_total{result}`
    /// (`accepted` for a 2xx, `refused` for 401/403, `other`).
    pub(crate) fn revalidation(&self, status: StatusCode) {
        let result = match status.as_u16() {
            200..=299 => "accepted",
            401 | 403 => "refused",
            _ => "other",
        };
        self.revalidations
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// A resume refused: `tether_resumes_total{result="miss", reason}` (`malformed`,
    /// `unknown_stream`, `ahead`, `evicted`).
    pub(crate) fn resume_miss(&self, reason: &'static str) {
        self.resumes
            .get_or_create(&ResumeLabels {
                result: "miss",
                reason,
            })
            .inc();
    }

    /// The count of streams ended because the credential that opened them expired
    /// (`tether_streams_credential_expired_total`), for the streams to count themselves in.
    pub(crate) fn streams_credential_expired(&self) -> Counter {
        self.streams_credential_expired.clone()
    }

    /// A request whose id the session had seen before, and what became of it
    /// (`tether_request_id_reuse_total`): `joined` (a retry attached to its request's stream,
    /// running or buffered), `replayed` (a retry given its request's stored answer), `expired` (a retry of
    /// a request answered and forgotten, `result_expired`), `run` (another body under an
    /// answered id: a new request) or `refused` (another body under the id of a request still
    /// running, `request_id_reused`).
    pub(crate) fn request_id_reuse(&self, outcome: &'static str) {
        self.request_id_reuse
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// A retry of a multi round-trip request (a sealed `requestState`), and where it went
    /// (`tether_mrtr_retries_total`): `forwarded` (to the pod that issued its state),
    /// `served_by_issuer`, or served by this pod instead: `issuer_gone` (left the endpoint or
    /// refuses connections), `too_large` (a body over 64 KiB).
    pub(crate) fn mrtr_retry(&self, outcome: &'static str) {
        self.mrtr_retries
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// An upstream SSE stream resumed after an early close (`tether_upstream_resumes_total`).
    pub(crate) fn upstream_resumed(&self) {
        self.upstream_resumes.inc();
    }

    /// `n` sessions a sweep looked at (`tether_sweep_sessions_total`).
    pub(crate) fn swept(&self, n: usize) {
        self.sweep_sessions.inc_by(n as u64);
    }

    /// An upstream task stopped reading its response: its stream holds its bounds of events
    /// nobody was sent, or the pod is over its byte cap (`tether_upstream_paused_total`,
    /// `tether_upstream_paused_streams`).
    pub(crate) fn upstream_paused(&self) {
        self.upstream_paused.inc();
        self.upstream_paused_now.inc();
    }

    /// A paused upstream task reads again after `took` (`tether_upstream_paused_seconds_total`).
    pub(crate) fn upstream_resumed_reading(&self, took: Duration) {
        self.upstream_paused_now.dec();
        self.upstream_paused_seconds.inc_by(took.as_secs_f64());
    }

    /// A forwarded request by the hop number it left with (`tether_forward_hops_total{hop}`).
    pub(crate) fn forward_hop(&self, hop: u8) {
        self.forward_hops.get_or_create(&HopLabel { hop }).inc();
    }

    /// A forwarded request went out on a pooled connection (`reused`) or a new one
    /// (`tether_peer_connects_total{reused}`).
    pub(crate) fn peer_connect(&self, reused: bool) {
        let reused = if reused { "true" } else { "false" };
        self.peer_connects
            .get_or_create(&ReusedLabel { reused })
            .inc();
    }

    /// The number of peers down now for `cause` (`tether_peers_down{reason}`: `refused`,
    /// `unresponsive`).
    pub(crate) fn peers_down(&self, cause: &'static str, peers: i64) {
        self.peers_down
            .get_or_create(&Reason { reason: cause })
            .set(peers);
    }

    /// Bytes retained now of `kind` (`tether_retained_bytes{kind}`: `journal`, `records`,
    /// `replies`, `buffers`).
    pub(crate) fn retained(&self, kind: &'static str, bytes: u64) {
        self.retained_bytes
            .get_or_create(&KindLabel { kind })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// An admin request refused (`tether_admin_refused_total{reason}`).
    pub(crate) fn admin_refused(&self, reason: &'static str) {
        self.admin_refused.get_or_create(&Reason { reason }).inc();
    }

    /// How long a drain took (`tether_drain_seconds`).
    pub(crate) fn drain_took(&self, took: Duration) {
        self.drain_seconds.observe(took.as_secs_f64());
    }

    /// How long a handoff took until the peer acknowledged it (`tether_handoff_seconds`).
    pub(crate) fn handoff_took(&self, took: Duration) {
        self.handoff_seconds.observe(took.as_secs_f64());
    }

    /// Events of handed-off streams forwarded to their new holder
    /// (`tether_tail_events_forwarded_total`).
    pub(crate) fn tail_events_forwarded(&self, events: u64) {
        self.tail_events_forwarded.inc_by(events);
    }

    /// Upstream `DELETE`s the sidecar sends on its own, waiting or in flight now
    /// (`tether_upstream_deletes_pending`).
    pub(crate) fn upstream_deletes_pending(&self, pending: usize) {
        self.upstream_deletes_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    /// Tasks open on this pod now (`tether_tasks_open`).
    pub(crate) fn tasks_open(&self, open: usize) {
        self.tasks_open.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// A task left untracked at `--max-open-tasks` (`tether_tasks_untracked_total`).
    pub(crate) fn task_untracked(&self) {
        self.tasks_untracked.inc();
    }

    /// Requests ended with an error at the drain deadline (`tether_requests_cut_total`).
    pub(crate) fn requests_cut(&self, requests: u64) {
        self.requests_cut.inc_by(requests);
    }

    /// A change of the key ring's files seen, by `result`
    /// (`tether_key_ring_reloads_total{result}`: `applied`, `invalid`).
    pub(crate) fn key_ring_reload(&self, result: &'static str) {
        self.key_ring_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// A change of the endpoint file seen, by `result` (`tether_config_reloads_total{result}`:
    /// `applied`, `invalid`, `unreadable`).
    pub(crate) fn config_reload(&self, result: &'static str) {
        self.config_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Whether pod settings of the endpoint file wait for a restart
    /// (`tether_config_restart_pending`, 1 or 0).
    pub(crate) fn restart_pending(&self, pending: bool) {
        self.config_restart_pending.set(i64::from(pending));
    }

    /// An upstream SSE event over `--max-event-bytes` (`tether_upstream_events_too_large_total`).
    pub(crate) fn upstream_event_too_large(&self) {
        self.upstream_events_too_large.inc();
    }

    /// A connection opened (`true`) or closed (`false`) on the `listener` (`mcp`:
    /// `tether_client_connections`, `peer`: `tether_peer_connections`, `admin`:
    /// `tether_admin_connections`).
    pub(crate) fn connection(&self, listener: &'static str, opened: bool) {
        let gauge = match listener {
            "peer" => &self.peer_connections,
            "admin" => &self.admin_connections,
            _ => &self.client_connections,
        };
        if opened {
            gauge.inc();
        } else {
            gauge.dec();
        }
    }

    /// Session requests running at the MCP server now (`tether_calls_in_flight`).
    pub(crate) fn set_calls_in_flight(&self, n: usize) {
        self.calls_in_flight
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A connection the `listener` refused a slot, for `reason`
    /// (`tether_connections_refused_total{listener,reason}`).
    pub(crate) fn connection_refused(&self, listener: &'static str, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ListenerReason { listener, reason })
            .inc();
    }

    /// A peer message or connection refused before anything was spent on it
    /// (`tether_peer_auth_failures_total{reason}`: `header`, `mac`, `misaddressed`, `skew`,
    /// `message_too_large`, `replayed`, `digest_mismatch`, `tls`, `plaintext`).
    pub(crate) fn peer_auth_failure(&self, reason: &'static str) {
        self.peer_auth_failures
            .get_or_create(&Reason { reason })
            .inc();
    }

    /// Nonces remembered now (`tether_peer_nonces`).
    pub(crate) fn peer_nonces(&self, nonces: usize) {
        self.peer_nonces
            .set(i64::try_from(nonces).unwrap_or(i64::MAX));
    }

    /// A connection closed for a request head past `--header-timeout`
    /// (`tether_header_timeouts_total`).
    pub(crate) fn header_timeout(&self) {
        self.header_timeouts.inc();
    }

    /// A request head pingora refused itself (`tether_request_heads_refused_total`).
    pub(crate) fn request_head_refused(&self) {
        self.request_heads_refused.inc();
    }

    /// A connection closed for a write past `--client-write-timeout`
    /// (`tether_client_write_timeouts_total`).
    pub(crate) fn client_write_timeout(&self) {
        self.client_write_timeouts.inc();
    }

    /// A GET that took a stream over from another connection (`tether_stream_takeovers_total`).
    pub(crate) fn stream_takeover(&self) {
        self.stream_takeovers.inc();
    }

    /// Counts a failed handoff attempt.
    pub(crate) fn handoff_failed(&self, reason: &'static str) {
        self.handoffs_failed.get_or_create(&Reason { reason }).inc();
    }

    /// Counts evicted events by reason (`tether_buffer_evictions_total{reason}`).
    pub(crate) fn evictions(&self, e: &Evictions) {
        for (reason, n) in [
            ("count", e.count),
            ("bytes", e.bytes),
            ("ttl", e.ttl),
            ("pod_cap", e.pod_cap),
            ("session_cap", e.session_cap),
            ("unread_ttl", e.unread_ttl),
            ("principal_share", e.principal_share),
        ] {
            if n > 0 {
                self.evictions.get_or_create(&Reason { reason }).inc_by(n);
            }
        }
    }

    /// Counts an upstream failure.
    pub(crate) fn upstream_error(&self, reason: &'static str) {
        self.upstream_errors.get_or_create(&Reason { reason }).inc();
    }

    /// Counts a membership change published by `source`.
    pub(crate) fn membership_change(&self, source: &'static str) {
        self.membership_changes
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// How old membership's view may be (`tether_membership_age_seconds`).
    pub(crate) fn membership_age(&self, age: Duration) {
        self.membership_age_seconds.set(age.as_secs_f64());
    }

    /// Sets the number of pods in `state`.
    pub(crate) fn set_ring_size(&self, state: &'static str, pods: usize) {
        self.ring_pods
            .get_or_create(&StateLabel { state })
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
    }

    /// Counts a forward of `kind` that ended with `outcome`.
    pub(crate) fn forward(&self, kind: &'static str, outcome: &'static str) {
        self.forwards
            .get_or_create(&ForwardLabels { kind, outcome })
            .inc();
    }

    /// The metrics in the Prometheus text format.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_registered() {
        // Each metric field needs a `register` call; count both in this file's source.
        let source = include_str!("metrics.rs");
        let source = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let start = source.find("pub(crate) struct Metrics {").unwrap();
        let block = &source[start..start + source[start..].find("\n}").unwrap()];
        let fields = block
            .lines()
            .map(str::trim_start)
            .filter(|l| {
                [
                    ": Family<",
                    ": Counter,",
                    ": Counter<",
                    ": Gauge,",
                    ": Gauge<",
                    ": Histogram,",
                ]
                .iter()
                .any(|t| l.contains(t))
            })
            .count();
        let registrations = source.matches("r.register(").count();
        assert_eq!(fields, 62);
        assert_eq!(registrations, fields, "a metric field is not registered");
    }

    #[test]
    fn the_metrics_doc_lists_every_sidecar_metric_with_its_type() {
        use tether_tests::repo::{assert_documented, documented_metrics, exposed_families};
        let m = Metrics::new();
        // A labelled family prints nothing until it has a sample: one in each, through the
        // recording methods the sidecar uses.
        m.request(&Method::POST, Era::Sessionful);
        m.rejection(&Rejection::SessionNotFound(NotFound::Forged));
        m.protocol_version(ProtocolVersion::V2025_11_25);
        m.session_ended(NotFound::Deleted);
        m.evictions(&Evictions {
            ttl: 1,
            ..Evictions::default()
        });
        m.resume_hit(1, Duration::from_millis(1));
        m.upstream_error("x");
        m.membership_change("kubernetes");
        m.set_ring_size("routable", 1);
        m.forward("home", "ok");
        m.forward_hop(1);
        m.peer_connect(true);
        m.peers_down("refused", 1);
        m.handoff_failed("x");
        m.config_reload("applied");
        m.key_ring_reload("applied");
        m.peer_auth_failure("mac");
        m.admin_refused("drain_not_local");
        m.connection_refused("mcp", "source_full");
        m.retained("journal", 1);
        m.revalidation(StatusCode::OK);
        m.request_id_reuse("run");
        m.mrtr_retry("forwarded");
        let families = exposed_families(&m.encode());
        assert_eq!(
            families.len(),
            62,
            "a family has no sample here: record one of each new labelled family"
        );
        assert_documented(
            "the sidecar's",
            &families,
            &documented_metrics(Some("Sidecar")),
        );
    }

    #[test]
    fn encodes_with_the_tether_prefix() {
        let m = Metrics::new();
        m.not_found
            .get_or_create(&Reason { reason: "forged" })
            .inc();
        m.evictions(&Evictions {
            ttl: 2,
            ..Evictions::default()
        });
        let text = m.encode();
        assert!(
            text.contains("tether_not_found_total{reason=\"forged\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tether_buffer_evictions_total{reason=\"ttl\"} 2"),
            "{text}"
        );
        assert!(text.contains("# EOF"));
    }
}
