//! What the broker counts (`docs/reference/metrics.md`): the answers it and the proxy give
//! (requests by protocol version, rejections, 404s), the sessions it holds, creates, ends, hands
//! off and adopts, their streams and buffers, resumes, retries, the calls and tasks it tracks,
//! the bytes it retains, and its exchanges with the MCP server.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tether_crds::ProtocolVersion;

use crate::mcp::rejection::{NotFound, Rejection};
use crate::retained::Kind;
use crate::stream::buffer::Evictions;

/// Why the MCP server failed (`tether_upstream_errors_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum UpstreamFailure {
    /// Not reachable: the request was never sent.
    Refused,
    /// The exchange broke after the request was sent.
    Lost,
    /// No answer within `--upstream-timeout`.
    Timeout,
    /// Not ready to serve yet.
    NotReady,
    /// A body that could not be read.
    Body,
    /// An early-closed SSE stream whose resumes were all used up.
    ResumeExhausted,
    /// An early-closed SSE stream whose resume was refused.
    ResumeRefused,
    /// An early-closed SSE stream that cannot be resumed.
    ResumeUnavailable,
    /// An `initialize` answer without a result.
    InitializeWithoutResult,
    /// A failed `DELETE` of an upstream session.
    Delete,
    /// A 2026-07-28 answer that opened a session.
    StatelessSessionOpened,
}

impl UpstreamFailure {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Lost => "lost",
            Self::Timeout => "timeout",
            Self::NotReady => "not_ready",
            Self::Body => "body",
            Self::ResumeExhausted => "resume_exhausted",
            Self::ResumeRefused => "resume_refused",
            Self::ResumeUnavailable => "resume_unavailable",
            Self::InitializeWithoutResult => "initialize_without_result",
            Self::Delete => "delete",
            Self::StatelessSessionOpened => "stateless_session_opened",
        }
    }
}

/// Why buffered events were evicted (`tether_buffer_evictions_total{reason}`), one per count of
/// [`Evictions`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum Eviction {
    /// `buffer.maxEvents`.
    Count,
    /// `buffer.maxBytes`.
    Bytes,
    /// `buffer.ttl`.
    Ttl,
    /// The pod's budget, `--pod-retained-bytes`.
    PodCap,
    /// The session's share, `--max-session-buffer-bytes`.
    SessionCap,
    /// A stream no client was sent an event of, after `--unread-ttl`.
    UnreadTtl,
    /// Shed from a caller over its fair share of a full pod.
    PrincipalShare,
}

impl Eviction {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Bytes => "bytes",
            Self::Ttl => "ttl",
            Self::PodCap => "pod_cap",
            Self::SessionCap => "session_cap",
            Self::UnreadTtl => "unread_ttl",
            Self::PrincipalShare => "principal_share",
        }
    }

    /// How many events `e` evicted for this reason.
    fn of(self, e: &Evictions) -> u64 {
        match self {
            Self::Count => e.count,
            Self::Bytes => e.bytes,
            Self::Ttl => e.ttl,
            Self::PodCap => e.pod_cap,
            Self::SessionCap => e.session_cap,
            Self::UnreadTtl => e.unread_ttl,
            Self::PrincipalShare => e.principal_share,
        }
    }
}

/// Why a resume was refused (`tether_resumes_total{result="miss", reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ResumeMiss {
    /// The cursor does not parse (400 `malformed_cursor`).
    Malformed,
    /// The cursor names no stream of the session (400 `unknown_cursor`).
    UnknownStream,
    /// The cursor is past the stream's last event (400 `unknown_cursor`).
    Ahead,
    /// Events after the cursor were evicted (400 `cursor_evicted`).
    Evicted,
}

impl ResumeMiss {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownStream => "unknown_stream",
            Self::Ahead => "ahead",
            Self::Evicted => "evicted",
        }
    }
}

/// What became of a request whose id the session had seen before
/// (`tether_request_id_reuse_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum IdReuse {
    /// A retry attached to its request's stream, running or buffered.
    Joined,
    /// A retry given its request's stored answer.
    Replayed,
    /// A retry of a request answered and forgotten (`result_expired`).
    Expired,
    /// Another body under an answered id: a new request.
    Run,
    /// Another body under the id of a request still running (`request_id_reused`).
    Refused,
}

impl IdReuse {
    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Joined => "joined",
            Self::Replayed => "replayed",
            Self::Expired => "expired",
            Self::Run => "run",
            Self::Refused => "refused",
        }
    }
}

/// What the MCP server answered a revalidation `ping` (`tether_revalidations_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum Revalidation {
    /// A 2xx: the credential is still accepted.
    Accepted,
    /// 401 or 403.
    Refused,
    /// Any other status.
    Other,
}

impl Revalidation {
    /// The result of a `ping` answered `status`.
    fn of(status: StatusCode) -> Self {
        match status.as_u16() {
            200..=299 => Self::Accepted,
            401 | 403 => Self::Refused,
            _ => Self::Other,
        }
    }

    /// The `result` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Refused => "refused",
            Self::Other => "other",
        }
    }
}

/// The `result` of a resume: a hit, or a miss for a reason.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum ResumeResult {
    Hit,
    Miss,
}

impl ResumeResult {
    fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
        }
    }
}

/// The `reason` of a resume: `none` for a hit.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ResumeReason(Option<ResumeMiss>);

impl ResumeReason {
    fn label(self) -> &'static str {
        self.0.map_or("none", ResumeMiss::label)
    }
}

label_value!(
    UpstreamFailure,
    Eviction,
    ResumeMiss,
    IdReuse,
    Revalidation,
    ResumeResult,
    ResumeReason,
    NotFound,
    Kind,
    ToolRerun,
);

/// Whether a second call of a tool is harmless (`tether_write_ahead_tools{rerun}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ToolRerun {
    /// Declared read-only.
    Harmless,
    /// Not declared so.
    Harmful,
}

impl ToolRerun {
    /// The `rerun` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Harmless => "harmless",
            Self::Harmful => "harmful",
        }
    }
}

/// Labels of `tether_write_ahead_tools`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    /// Whether a second call is harmless.
    rerun: ToolRerun,
}

/// Labels of `tether_not_found_total` and `tether_sessions_ended_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotFoundLabel {
    /// Why the session is not (or no longer) here.
    reason: NotFound,
}

/// Labels of `tether_buffer_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabel {
    /// Why the events were evicted.
    reason: Eviction,
}

/// Labels of `tether_upstream_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabel {
    /// Why the MCP server failed.
    reason: UpstreamFailure,
}

/// Labels of `tether_rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    /// HTTP status.
    status: u16,
    /// Rejection reason (`docs/reference/status-codes.md`).
    reason: &'static str,
}

/// Labels of `tether_protocol_version_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    /// The protocol version in effect for the request.
    version: &'static str,
}

/// Labels of `tether_resumes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResumeLabels {
    /// `hit` or `miss`.
    result: ResumeResult,
    /// Why a resume missed (`none` for hits).
    reason: ResumeReason,
}

/// Labels of `tether_request_id_reuse_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// What became of the request.
    outcome: IdReuse,
}

/// Labels of `tether_revalidations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// The result.
    result: Revalidation,
}

/// Labels of `tether_retained_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    /// What is retained.
    kind: Kind,
}

/// A gauge set from a count.
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The broker's metrics.
#[derive(Debug)]
pub(crate) struct BrokerMetrics {
    /// Requests answered with an error by the sidecar itself, by status and reason.
    rejections: Family<RejectionLabels, Counter>,
    /// 404s for a session id, by reason.
    not_found: Family<NotFoundLabel, Counter>,
    /// Requests refused for their `Origin`.
    origin_rejections: Counter,
    /// Requests by the protocol version in effect.
    protocol_versions: Family<VersionLabel, Counter>,
    /// Sessions held now.
    sessions: Gauge,
    /// Sessions created.
    sessions_created: Counter,
    /// Sessions ended, by reason (deleted, expired, upstream_gone).
    sessions_ended: Family<NotFoundLabel, Counter>,
    /// Sessions handed to a peer and acknowledged by it.
    handoffs_sent: Counter,
    /// Sessions adopted from a peer.
    handoffs_received: Counter,
    /// Sessions whose upstream session was rebuilt from the journal.
    sessions_rebuilt: Counter,
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
    /// Buffered events evicted, by reason.
    evictions: Family<EvictionLabel, Counter>,
    /// Resumes with `Last-Event-ID`, by result and miss reason.
    resumes: Family<ResumeLabels, Counter>,
    /// Events replayed to resuming clients.
    replayed_events: Counter,
    /// Time from a resume request to its response headers, in seconds.
    resume_seconds: Histogram,
    /// Requests whose id the session had seen before, by what became of them.
    request_id_reuse: Family<OutcomeLabel, Counter>,
    /// `subscriptions/listen` streams ended because the credential that opened them expired.
    streams_credential_expired: Counter,
    /// Credential revalidations, by result.
    revalidations: Family<ResultLabel, Counter>,
    /// GETs that took a stream over from another connection (spec T-09).
    stream_takeovers: Counter,
    /// Sessions the sweeper looked at (the ones due, not every one held).
    sweep_sessions: Counter,
    /// Bytes the pod's sessions retain now, by kind.
    retained_bytes: Family<KindLabel, Gauge>,
    /// Session requests running at the MCP server (`--max-calls`).
    calls_in_flight: Gauge,
    /// Tasks of the tasks extension created on this pod that a client may still poll.
    tasks_open: Gauge,
    /// Tasks not tracked because `--max-open-tasks` were open.
    tasks_untracked: Counter,
    /// Upstream failures, by reason.
    upstream_errors: Family<UpstreamLabel, Counter>,
    /// Upstream SSE streams resumed by the sidecar after an early close (SEP-1699 polling).
    upstream_resumes: Counter,
    /// Times an upstream task stopped reading its response for want of room (backpressure).
    upstream_paused: Counter,
    /// Seconds upstream tasks spent so paused, in all.
    upstream_paused_seconds: Counter<f64, AtomicU64>,
    /// Upstream tasks paused now.
    upstream_paused_now: Gauge,
    /// Upstream SSE events over `--max-event-bytes`, never buffered.
    upstream_events_too_large: Counter,
    /// Upstream `DELETE`s the sidecar sends on its own, waiting or in flight.
    upstream_deletes_pending: Gauge,
    /// Tools the MCP server declared, by whether a second call is harmless.
    write_ahead_tools: Family<ToolLabel, Gauge>,
}

impl BrokerMetrics {
    /// The broker's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self {
            rejections: Default::default(),
            not_found: Default::default(),
            origin_rejections: Default::default(),
            protocol_versions: Default::default(),
            sessions: Default::default(),
            sessions_created: Default::default(),
            sessions_ended: Default::default(),
            handoffs_sent: Default::default(),
            handoffs_received: Default::default(),
            sessions_rebuilt: Default::default(),
            streams: Default::default(),
            buffer_events: Default::default(),
            buffer_bytes: Default::default(),
            buffer_unsent_bytes: Default::default(),
            events_buffered: Default::default(),
            evictions: Default::default(),
            resumes: Default::default(),
            replayed_events: Default::default(),
            resume_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            request_id_reuse: Default::default(),
            streams_credential_expired: Default::default(),
            revalidations: Default::default(),
            stream_takeovers: Default::default(),
            sweep_sessions: Default::default(),
            retained_bytes: Default::default(),
            calls_in_flight: Default::default(),
            tasks_open: Default::default(),
            tasks_untracked: Default::default(),
            upstream_errors: Default::default(),
            upstream_resumes: Default::default(),
            upstream_paused: Default::default(),
            upstream_paused_seconds: Default::default(),
            upstream_paused_now: Default::default(),
            upstream_events_too_large: Default::default(),
            upstream_deletes_pending: Default::default(),
            write_ahead_tools: Default::default(),
        };
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
            "write_ahead_tools",
            "Tools the MCP server declared in its tools/list answers, by whether a second call is harmless (read-only: no write-ahead): at most --write-ahead-max-tools",
            m.write_ahead_tools.clone(),
        );
        r.register(
            "tasks_untracked",
            "Tasks not tracked because --max-open-tasks were open",
            m.tasks_untracked.clone(),
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
            "calls_in_flight",
            "Session requests running at the MCP server now, read by a client or not",
            m.calls_in_flight.clone(),
        );
        r.register(
            "stream_takeovers",
            "GETs that took a stream over from another connection",
            m.stream_takeovers.clone(),
        );
        m
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
                    .get_or_create(&NotFoundLabel { reason: *why })
                    .inc();
            }
            Rejection::OriginForbidden => {
                self.origin_rejections.inc();
            }
            _ => {}
        }
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

    /// A session ended here: `tether_sessions` down, `tether_sessions_ended_total{reason}`
    /// (`deleted`, `expired`, `upstream_gone`).
    pub(crate) fn session_ended(&self, reason: NotFound) {
        self.sessions.dec();
        self.sessions_ended
            .get_or_create(&NotFoundLabel { reason })
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
        self.streams.set(gauge(streams));
        self.buffer_events.set(gauge(events));
        self.buffer_bytes.set(gauge(bytes));
        self.buffer_unsent_bytes.set(gauge(unsent));
    }

    /// Counts evicted events by reason (`tether_buffer_evictions_total{reason}`).
    pub(crate) fn evictions(&self, e: &Evictions) {
        for &reason in <Eviction as strum::VariantArray>::VARIANTS {
            let n = reason.of(e);
            if n > 0 {
                self.evictions
                    .get_or_create(&EvictionLabel { reason })
                    .inc_by(n);
            }
        }
    }

    /// A resume served from the buffer: `tether_resumes_total{result="hit"}`, the events it
    /// replays (`tether_replayed_events_total`) and the time to its response headers
    /// (`tether_resume_seconds`).
    pub(crate) fn resume_hit(&self, replayed: u64, took: Duration) {
        self.resumes
            .get_or_create(&ResumeLabels {
                result: ResumeResult::Hit,
                reason: ResumeReason(None),
            })
            .inc();
        self.replayed_events.inc_by(replayed);
        self.resume_seconds.observe(took.as_secs_f64());
    }

    /// A resume refused: `tether_resumes_total{result="miss", reason}`.
    pub(crate) fn resume_miss(&self, reason: ResumeMiss) {
        self.resumes
            .get_or_create(&ResumeLabels {
                result: ResumeResult::Miss,
                reason: ResumeReason(Some(reason)),
            })
            .inc();
    }

    /// A request whose id the session had seen before, and what became of it
    /// (`tether_request_id_reuse_total`).
    pub(crate) fn request_id_reuse(&self, outcome: IdReuse) {
        self.request_id_reuse
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// The count of streams ended because the credential that opened them expired
    /// (`tether_streams_credential_expired_total`), for the streams to count themselves in.
    pub(crate) fn streams_credential_expired(&self) -> Counter {
        self.streams_credential_expired.clone()
    }

    /// A revalidation `ping` answered `status`: `tether_revalidations_total{result}`.
    pub(crate) fn revalidation(&self, status: StatusCode) {
        self.revalidations
            .get_or_create(&ResultLabel {
                result: Revalidation::of(status),
            })
            .inc();
    }

    /// A GET that took a stream over from another connection (`tether_stream_takeovers_total`).
    pub(crate) fn stream_takeover(&self) {
        self.stream_takeovers.inc();
    }

    /// `n` sessions a sweep looked at (`tether_sweep_sessions_total`).
    pub(crate) fn swept(&self, n: usize) {
        self.sweep_sessions.inc_by(n as u64);
    }

    /// Bytes retained now of `kind` (`tether_retained_bytes{kind}`).
    pub(crate) fn retained(&self, kind: Kind, bytes: u64) {
        self.retained_bytes
            .get_or_create(&KindLabel { kind })
            .set(gauge(bytes));
    }

    /// Session requests running at the MCP server now (`tether_calls_in_flight`).
    pub(crate) fn set_calls_in_flight(&self, n: usize) {
        self.calls_in_flight.set(gauge(n as u64));
    }

    /// Tasks open on this pod now (`tether_tasks_open`).
    pub(crate) fn tasks_open(&self, open: usize) {
        self.tasks_open.set(gauge(open as u64));
    }

    /// A task left untracked at `--max-open-tasks` (`tether_tasks_untracked_total`).
    pub(crate) fn task_untracked(&self) {
        self.tasks_untracked.inc();
    }

    /// Counts an upstream failure (`tether_upstream_errors_total{reason}`).
    pub(crate) fn upstream_error(&self, reason: UpstreamFailure) {
        self.upstream_errors
            .get_or_create(&UpstreamLabel { reason })
            .inc();
    }

    /// An upstream SSE stream resumed after an early close (`tether_upstream_resumes_total`).
    pub(crate) fn upstream_resumed(&self) {
        self.upstream_resumes.inc();
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

    /// An upstream SSE event over `--max-event-bytes` (`tether_upstream_events_too_large_total`).
    pub(crate) fn upstream_event_too_large(&self) {
        self.upstream_events_too_large.inc();
    }

    /// Upstream `DELETE`s the sidecar sends on its own, waiting or in flight now
    /// (`tether_upstream_deletes_pending`).
    pub(crate) fn upstream_deletes_pending(&self, pending: usize) {
        self.upstream_deletes_pending.set(gauge(pending as u64));
    }

    /// The tools known now, `harmless` and `harmful` to call again
    /// (`tether_write_ahead_tools{rerun}`).
    pub(crate) fn write_ahead_tools(&self, harmless: usize, harmful: usize) {
        for (rerun, n) in [
            (ToolRerun::Harmless, harmless),
            (ToolRerun::Harmful, harmful),
        ] {
            self.write_ahead_tools
                .get_or_create(&ToolLabel { rerun })
                .set(gauge(n as u64));
        }
    }
}
