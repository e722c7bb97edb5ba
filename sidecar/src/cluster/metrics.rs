//! What membership counts (`docs/reference/metrics.md`): the changes it applied, the pods of the
//! endpoint by state, and the peers the health probes find down.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::membership::{PeerState, Source};
use super::peer_health::Down;

label_value!(PeerState, Source, Down);

/// Labels of `tether_membership_changes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    /// The membership source.
    source: Source,
}

/// Labels of `tether_ring_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    /// The pods' state.
    state: PeerState,
}

/// Labels of `tether_peers_down`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DownLabel {
    /// Why the peers are down.
    reason: Down,
}

/// Membership's metrics.
#[derive(Debug, Default)]
pub(crate) struct ClusterMetrics {
    /// Membership changes applied, by source.
    membership_changes: Family<SourceLabel, Counter>,
    /// Pods in the current membership, by state.
    ring_pods: Family<StateLabel, Gauge>,
    /// Peers the health probes currently find down, by cause.
    peers_down: Family<DownLabel, Gauge>,
}

impl ClusterMetrics {
    /// Membership's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
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
            "peers_down",
            "Peers the health probes find down, by cause",
            m.peers_down.clone(),
        );
        m
    }

    /// Counts a membership change published by `source` (`tether_membership_changes_total`).
    pub(crate) fn membership_change(&self, source: Source) {
        self.membership_changes
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// Sets the number of pods in `state` (`tether_ring_pods{state}`).
    pub(crate) fn set_ring_size(&self, state: PeerState, pods: usize) {
        self.ring_pods
            .get_or_create(&StateLabel { state })
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
    }

    /// The number of peers down now for `cause` (`tether_peers_down{reason}`).
    pub(crate) fn peers_down(&self, cause: Down, peers: i64) {
        self.peers_down
            .get_or_create(&DownLabel { reason: cause })
            .set(peers);
    }
}
