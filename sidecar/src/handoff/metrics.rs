//! What handoff counts (`docs/reference/metrics.md`): failed handoff attempts and how long the
//! acknowledged ones took, the tails forwarded after them, the requests cut at the drain
//! deadline, the peer messages and connections refused before anything was spent on them, the
//! nonces remembered, how old membership's view is when a rebalance round reads it, the replicas
//! kept here and taken over, and the replicas sent and the sessions without one
//! (`docs/design/replication.md`).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::peer::auth::AuthFailure;
use crate::peer::client::SendError;
use crate::peer::wire::ReplicaOutcome;

/// Why a handoff attempt failed (`tether_handoffs_failed_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum HandoffFailure {
    /// The peer could not be reached.
    Unreachable,
    /// The peer answered with an error (draining, full, busy).
    Refused,
    /// The peer answered without a valid acknowledgement.
    Unacknowledged,
    /// A push got no answer and the target could not say whether it took the session.
    InDoubt,
    /// No routable peer to hand the session to.
    NoTarget,
    /// Forwarding a stream's tail to the new holder failed.
    Tail,
    /// The new holder left or lost the session while this pod still had a copy.
    HolderLost,
    /// A peer holds the session at a later epoch: the copy here was stale.
    Superseded,
    /// The drain's deadline passed before the session's turn.
    Deadline,
}

impl HandoffFailure {
    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Refused => "refused",
            Self::Unacknowledged => "unacknowledged",
            Self::InDoubt => "in_doubt",
            Self::NoTarget => "no_target",
            Self::Tail => "tail",
            Self::HolderLost => "holder_lost",
            Self::Superseded => "superseded",
            Self::Deadline => "deadline",
        }
    }
}

impl From<&SendError> for HandoffFailure {
    fn from(e: &SendError) -> Self {
        match e {
            SendError::Unreachable(_) | SendError::Lost(_) => Self::Unreachable,
            SendError::Refused { .. } => Self::Refused,
            SendError::Unacknowledged(_) => Self::Unacknowledged,
        }
    }
}

/// How a session was taken over from its replica (`tether_replicas_taken_over_total{how}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum TakeOver {
    /// Promoted here, the replica pod, once its holder left membership.
    Promoted,
    /// Claimed back by its holder, whose sidecar restarted, from its replica pod.
    Claimed,
}

impl TakeOver {
    /// The `how` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Promoted => "promoted",
            Self::Claimed => "claimed",
        }
    }
}

/// What became of a replica sent to its replica pod (`tether_replicas_sent_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum ReplicaSent {
    /// Kept.
    Kept,
    /// The replica pod holds the session at a later epoch: the copy here was stale.
    StaleEpoch,
    /// The replica pod's budget had no room.
    Full,
    /// The replica pod drains.
    Draining,
    /// The session ended at the replica pod.
    Ended,
    /// The replica pod found the session id forged.
    Invalid,
    /// The replica pod does not know this pod (its membership lags).
    NotMember,
    /// The replica pod's copy was not the change's base: the replica is sent whole.
    Behind,
    /// No acknowledged answer.
    Unanswered,
}

impl ReplicaSent {
    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Kept => "kept",
            Self::StaleEpoch => "stale_epoch",
            Self::Full => "full",
            Self::Draining => "draining",
            Self::Ended => "ended",
            Self::Invalid => "invalid",
            Self::NotMember => "not_member",
            Self::Behind => "behind",
            Self::Unanswered => "unanswered",
        }
    }
}

impl From<ReplicaOutcome> for ReplicaSent {
    fn from(outcome: ReplicaOutcome) -> Self {
        match outcome {
            ReplicaOutcome::Kept => Self::Kept,
            ReplicaOutcome::StaleEpoch => Self::StaleEpoch,
            ReplicaOutcome::Full => Self::Full,
            ReplicaOutcome::Draining => Self::Draining,
            ReplicaOutcome::Ended => Self::Ended,
            ReplicaOutcome::Invalid => Self::Invalid,
            ReplicaOutcome::NotMember => Self::NotMember,
            ReplicaOutcome::Behind => Self::Behind,
        }
    }
}

/// How a request's wait for its record to be kept ended (`tether_write_ahead_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::VariantArray)]
pub(crate) enum WriteAheadOutcome {
    /// The replica pod keeps the record: the request is dispatched.
    Written,
    /// It will not (no replica pod, refused, unanswered): dispatched without.
    Unwritten,
    /// The session is no longer held here.
    Moot,
    /// Not kept within 1 s: dispatched without.
    Timeout,
    /// Not waited for: a second dispatch of the request is harmless.
    Harmless,
}

impl WriteAheadOutcome {
    /// The `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Unwritten => "unwritten",
            Self::Moot => "moot",
            Self::Timeout => "timeout",
            Self::Harmless => "harmless",
        }
    }
}

label_value!(
    HandoffFailure,
    AuthFailure,
    TakeOver,
    ReplicaSent,
    WriteAheadOutcome
);

/// Labels of `tether_write_ahead_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteAheadLabel {
    /// How the wait ended.
    outcome: WriteAheadOutcome,
}

/// Labels of `tether_replicas_sent_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SentLabel {
    /// What became of the replica.
    outcome: ReplicaSent,
}

/// Labels of `tether_replicas_taken_over_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TakeOverLabel {
    /// How the session was taken over.
    how: TakeOver,
}

/// Labels of `tether_handoffs_failed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    /// Why the attempt failed.
    reason: HandoffFailure,
}

/// Labels of `tether_peer_auth_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabel {
    /// Why the message or connection was refused.
    reason: AuthFailure,
}

/// Handoff's metrics.
#[derive(Debug)]
pub(crate) struct HandoffMetrics {
    /// Handoff attempts that failed, by reason: a session whose every candidate failed stays
    /// here.
    handoffs_failed: Family<FailureLabel, Counter>,
    /// Time from the start of a session's handoff to the peer's acknowledgement, in seconds.
    handoff_seconds: Histogram,
    /// Events of handed-off streams forwarded to their new holder after the push.
    tail_events_forwarded: Counter,
    /// Requests still running at the drain deadline, ended with a JSON-RPC error.
    requests_cut: Counter,
    /// Peer messages and connections refused before anything was spent on them, by reason.
    peer_auth_failures: Family<AuthLabel, Counter>,
    /// Nonces of peer messages remembered within the time window.
    peer_nonces: Gauge,
    /// Seconds since membership's source last confirmed its view (0 while it reads its input).
    membership_age_seconds: Gauge<f64, AtomicU64>,
    /// Replicas of sessions held by peers kept here.
    replicas: Gauge,
    /// Sessions taken over from a replica, by how.
    replicas_taken_over: Family<TakeOverLabel, Counter>,
    /// Replicas sent to their replica pod, by what became of them.
    replicas_sent: Family<SentLabel, Counter>,
    /// Sessions held here without a replica kept current.
    sessions_unreplicated: Gauge,
    /// Requests that waited for their record to be kept before dispatch, by how it ended, and
    /// those that did not need to.
    write_ahead: Family<WriteAheadLabel, Counter>,
}

impl HandoffMetrics {
    /// Handoff's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self {
            handoffs_failed: Family::default(),
            handoff_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            tail_events_forwarded: Counter::default(),
            requests_cut: Counter::default(),
            peer_auth_failures: Family::default(),
            peer_nonces: Gauge::default(),
            membership_age_seconds: Gauge::default(),
            replicas: Gauge::default(),
            replicas_taken_over: Family::default(),
            replicas_sent: Family::default(),
            sessions_unreplicated: Gauge::default(),
            write_ahead: Family::default(),
        };
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
            "membership_age_seconds",
            "Seconds since membership's source last confirmed its view (0 while it reads its input)",
            m.membership_age_seconds.clone(),
        );
        r.register(
            "replicas",
            "Replicas of sessions held by peers kept here",
            m.replicas.clone(),
        );
        r.register(
            "replicas_taken_over",
            "Sessions taken over from a replica (promoted here, or claimed back by their restarted holder)",
            m.replicas_taken_over.clone(),
        );
        r.register(
            "replicas_sent",
            "Replicas sent to their replica pod, by what became of them",
            m.replicas_sent.clone(),
        );
        r.register(
            "sessions_unreplicated",
            "Sessions held here without a replica kept current (new, refused, or no replica pod)",
            m.sessions_unreplicated.clone(),
        );
        r.register(
            "write_ahead",
            "Requests that waited for their replica pod to keep their retry record before they were dispatched, by how the wait ended; harmless: did not wait, a second dispatch changes nothing",
            m.write_ahead.clone(),
        );
        m
    }

    /// Counts a failed handoff attempt (`tether_handoffs_failed_total{reason}`).
    pub(crate) fn handoff_failed(&self, reason: HandoffFailure) {
        self.handoffs_failed
            .get_or_create(&FailureLabel { reason })
            .inc();
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

    /// Requests ended with an error at the drain deadline (`tether_requests_cut_total`).
    pub(crate) fn requests_cut(&self, requests: u64) {
        self.requests_cut.inc_by(requests);
    }

    /// A peer message or connection refused before anything was spent on it
    /// (`tether_peer_auth_failures_total{reason}`).
    pub(crate) fn peer_auth_failure(&self, reason: AuthFailure) {
        self.peer_auth_failures
            .get_or_create(&AuthLabel { reason })
            .inc();
    }

    /// Nonces remembered now (`tether_peer_nonces`).
    pub(crate) fn peer_nonces(&self, nonces: usize) {
        self.peer_nonces
            .set(i64::try_from(nonces).unwrap_or(i64::MAX));
    }

    /// How old membership's view may be (`tether_membership_age_seconds`).
    pub(crate) fn membership_age(&self, age: Duration) {
        self.membership_age_seconds.set(age.as_secs_f64());
    }

    /// Replicas kept here now (`tether_replicas`).
    pub(crate) fn replicas(&self, kept: usize) {
        self.replicas.set(i64::try_from(kept).unwrap_or(i64::MAX));
    }

    /// A session taken over from its replica (`tether_replicas_taken_over_total{how}`).
    pub(crate) fn replica_taken_over(&self, how: TakeOver) {
        self.replicas_taken_over
            .get_or_create(&TakeOverLabel { how })
            .inc();
    }

    /// A replica sent, by what became of it (`tether_replicas_sent_total{outcome}`).
    pub(crate) fn replica_sent(&self, outcome: ReplicaSent) {
        self.replicas_sent
            .get_or_create(&SentLabel { outcome })
            .inc();
    }

    /// A request's write-ahead wait ended (`tether_write_ahead_total{outcome}`).
    pub(crate) fn write_ahead(&self, outcome: WriteAheadOutcome) {
        self.write_ahead
            .get_or_create(&WriteAheadLabel { outcome })
            .inc();
    }

    /// Sessions held here without a replica kept current (`tether_sessions_unreplicated`).
    pub(crate) fn sessions_unreplicated(&self, sessions: usize) {
        self.sessions_unreplicated
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }
}
