//! Membership: which pods serve the endpoint, and in which state
//! (`docs/design/routing.md#membership`).
//!
//! A [`Membership`] source (the static [`peers_file`], or the [`kubernetes`] watch of the peer
//! Service's EndpointSlices, merged with what each peer [`reports`] of itself)
//! publishes a [`Snapshot`] of every pod it knows — `uid, name, address, routable | draining |
//! gone, revision` — into a [`MembershipSink`]. The sink builds the routing [`View`] (the
//! session ring over live pods plus a home-token index) and swaps it in atomically; the request
//! path reads the current view with one `ArcSwap::load`, without a lock.
//!
//! Membership is eventually consistent between sidecars: correctness never depends on two
//! sidecars seeing the same snapshot at the same instant (the hop limit and the holder's
//! authority take care of disagreement, see [`crate::cluster::routing`]).

pub(crate) mod kubernetes;
pub(crate) mod peers_file;
pub(crate) mod reports;
pub(crate) mod slices;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use serde::{Deserialize, Serialize};

use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::ring::{HrwRing, SessionRing};
use crate::mcp::home::HomeToken;

/// The state of a pod as membership sees it (`docs/design/architecture.md#vocabulary`: routable,
/// draining).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
pub enum PeerState {
    /// Ready and not terminating: may receive new sessions and handoffs.
    Routable,
    /// Still serving but terminating (or not ready): keeps its sessions, gets no new ones.
    Draining,
    /// Not serving: requests for its sessions go to the ring owner.
    Gone,
}

impl PeerState {
    /// The metric label of the state.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Routable => "routable",
            Self::Draining => "draining",
            Self::Gone => "gone",
        }
    }

    /// Whether the pod still serves requests (routable or draining).
    pub(crate) fn is_alive(self) -> bool {
        self != Self::Gone
    }
}

/// One pod of the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The pod's UID (Kubernetes `metadata.uid`): its identity on the ring and in session ids.
    pub uid: String,
    /// The pod's name, for logs.
    pub name: String,
    /// The pod's MCP listener, `pod IP:spec.listen.port`; forwarded requests go here. In
    /// Kubernetes the port is the one the pod reports (its own `spec.listen.port`), so pods of
    /// both sides of a rollout that changes `spec.listen.port` reach each other.
    pub address: SocketAddr,
    /// The pod's peer (handoff) port when it is known (Kubernetes: the one it reports, else the
    /// peer Service's `tether-peer` port); `None`: this pod's `spec.peer.port`.
    pub peer_port: Option<u16>,
    /// Its state.
    pub state: PeerState,
    /// The pod's revision (Kubernetes: the `pod-template-hash` it reports), empty when unknown.
    pub revision: String,
}

/// Every pod a source knows, **oldest first**: the revision of the youngest routable pod is the
/// newest revision (the preferred set, `docs/design/routing.md#placement-and-routing`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The pods, oldest first; at most one entry per UID.
    pub peers: Vec<Peer>,
}

impl Snapshot {
    /// The newest revision: that of the youngest routable pod, if any.
    pub(crate) fn newest_revision(&self) -> Option<&str> {
        self.peers
            .iter()
            .rev()
            .find(|p| p.state == PeerState::Routable)
            .map(|p| p.revision.as_str())
    }
}

/// Which source publishes membership (the `source` label of
/// `tether_membership_changes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum Source {
    /// The EndpointSlice watch (`kubernetes.rs`).
    Kubernetes,
    /// The peers file (`peers_file.rs`).
    PeersFile,
}

impl Source {
    /// The source's name for logs and metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Kubernetes => "kubernetes",
            Self::PeersFile => "peers_file",
        }
    }
}

/// A source of membership snapshots.
#[async_trait]
pub(crate) trait Membership: Send + Sync {
    /// The source's name for logs and the `tether_membership_changes_total` label.
    fn name(&self) -> &'static str;

    /// Runs until `shutdown` fires, publishing every changed snapshot into `sink`. A source
    /// that cannot read its input keeps the last good snapshot and logs why.
    async fn run(&self, sink: MembershipSink, shutdown: ShutdownWatch);
}

/// The routing view built from one [`Snapshot`]: immutable, swapped as a whole.
#[derive(Debug)]
pub(crate) struct View {
    snapshot: Snapshot,
    by_home: HashMap<HomeToken, usize>,
    /// Ring over routable + draining pods: the `ranked(S)` walk of a session whose home is gone.
    alive: HrwRing,
    /// Ring over the preferred set (routable pods of the newest revision, or all routable pods):
    /// `owner(S)`.
    preferred: HrwRing,
    /// Per pod index: whether it is in the preferred set.
    in_preferred: Vec<bool>,
    routable: Vec<usize>,
    /// Per pod index: since when this sidecar has seen it routable without a break (`None`:
    /// not routable).
    routable_since: Vec<Option<std::time::Instant>>,
    /// How long a pod is routable before it counts as settled (`--rebalance-dwell`).
    dwell: std::time::Duration,
}

impl View {
    /// Builds the view of `snapshot`.
    pub(crate) fn new(snapshot: Snapshot) -> Self {
        let peers = &snapshot.peers;
        let by_home = peers
            .iter()
            .enumerate()
            .map(|(i, p)| (HomeToken::for_pod(&p.uid), i))
            .collect();
        let alive_idx: Vec<usize> = (0..peers.len())
            .filter(|&i| peers[i].state.is_alive())
            .collect();
        let routable: Vec<usize> = (0..peers.len())
            .filter(|&i| peers[i].state == PeerState::Routable)
            .collect();
        let newest = snapshot.newest_revision();
        let mut preferred_idx: Vec<usize> = routable
            .iter()
            .copied()
            .filter(|&i| Some(peers[i].revision.as_str()) == newest)
            .collect();
        if preferred_idx.is_empty() {
            preferred_idx.clone_from(&routable);
        }
        let alive = HrwRing::new(alive_idx.iter().map(|&i| (peers[i].uid.as_str(), i)));
        let preferred = HrwRing::new(preferred_idx.iter().map(|&i| (peers[i].uid.as_str(), i)));
        let mut in_preferred = vec![false; peers.len()];
        for &i in &preferred_idx {
            in_preferred[i] = true;
        }
        let now = std::time::Instant::now();
        let routable_since = peers
            .iter()
            .map(|p| (p.state == PeerState::Routable).then_some(now))
            .collect();
        Self {
            in_preferred,
            by_home,
            alive,
            preferred,
            routable,
            routable_since,
            dwell: std::time::Duration::ZERO,
            snapshot,
        }
    }

    /// This view with pods counting as settled once routable for `dwell`.
    pub(crate) fn with_dwell(mut self, dwell: std::time::Duration) -> Self {
        self.dwell = dwell;
        self
    }

    /// Whether pod index `i` has been routable for the dwell at `now`.
    fn settled_at(&self, i: usize, now: std::time::Instant) -> bool {
        self.routable_since[i].is_some_and(|s| now.saturating_duration_since(s) >= self.dwell)
    }

    /// Whether pod `uid` has been routable for `--rebalance-dwell`: sessions adopted elsewhere
    /// follow it as their owner only then.
    pub(crate) fn is_settled(&self, uid: &str) -> bool {
        let now = std::time::Instant::now();
        self.snapshot
            .peers
            .iter()
            .position(|p| p.uid == uid)
            .is_some_and(|i| self.settled_at(i, now))
    }

    /// The view of `snapshot`, following `previous`: a pod routable in both keeps the instant
    /// it became routable.
    pub(crate) fn after(snapshot: Snapshot, previous: &View) -> Self {
        let mut view = Self::new(snapshot).with_dwell(previous.dwell);
        for (i, peer) in view.snapshot.peers.iter().enumerate() {
            if view.routable_since[i].is_some()
                && let Some(since) = previous.routable_since(&peer.uid)
            {
                view.routable_since[i] = Some(since);
            }
        }
        view
    }

    /// Since when this sidecar has seen pod `uid` routable without a break.
    pub(crate) fn routable_since(&self, uid: &str) -> Option<std::time::Instant> {
        let i = self.snapshot.peers.iter().position(|p| p.uid == uid)?;
        self.routable_since[i]
    }

    /// The snapshot this view was built from.
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The pod whose home token is `home`, if membership knows it (in any state).
    pub(crate) fn home(&self, home: &HomeToken) -> Option<&Peer> {
        self.by_home.get(home).map(|&i| &self.snapshot.peers[i])
    }

    /// The pod with this UID, if known.
    pub(crate) fn peer(&self, uid: &str) -> Option<&Peer> {
        self.snapshot.peers.iter().find(|p| p.uid == uid)
    }

    /// `owner(S)`: the HRW winner of `key` over the preferred set; `None` with no routable pod.
    pub(crate) fn owner(&self, key: &str) -> Option<&Peer> {
        self.preferred.owner(key).map(|i| &self.snapshot.peers[i])
    }

    /// `ranked(S)`: every routable or draining pod, in `key`'s HRW preference order.
    pub(crate) fn ranked(&self, key: &str) -> impl Iterator<Item = &Peer> {
        self.alive
            .ranked(key)
            .into_iter()
            .map(|i| &self.snapshot.peers[i])
    }

    /// The order in which a session whose home is gone is looked for: the preferred set in
    /// `key`'s HRW order (adopted sessions live on `owner(S)`, and the runner-up is the owner
    /// from before the last join, still holding S until it moves), then the other routable or
    /// draining pods in `ranked(S)` order.
    ///
    /// After the owner come the settled pods of the preferred set, then the others: a session
    /// adopted elsewhere follows a new owner only once it settled (`--rebalance-dwell`), so
    /// until then it is on the owner among the settled pods, which the walk asks second however
    /// many pods joined meanwhile.
    pub(crate) fn walk(&self, key: &str) -> impl Iterator<Item = &Peer> {
        let now = std::time::Instant::now();
        let preferred = self.preferred.ranked(key);
        let (owner, others) = preferred.split_first().unwrap_or((&usize::MAX, &[]));
        let settled = others.iter().copied().filter(|&i| self.settled_at(i, now));
        let unsettled = others.iter().copied().filter(|&i| !self.settled_at(i, now));
        let rest = self
            .alive
            .ranked(key)
            .into_iter()
            .filter(|&i| !self.in_preferred[i]);
        (*owner != usize::MAX)
            .then_some(*owner)
            .into_iter()
            .chain(settled)
            .chain(unsettled)
            .chain(rest)
            .map(|i| &self.snapshot.peers[i])
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// Routable pods, oldest first.
    pub(crate) fn routable(&self) -> impl Iterator<Item = &Peer> {
        self.routable.iter().map(|&i| &self.snapshot.peers[i])
    }

    /// Pods per state, for the ring-size gauge.
    pub(crate) fn count(&self, state: PeerState) -> usize {
        self.snapshot
            .peers
            .iter()
            .filter(|p| p.state == state)
            .count()
    }
}

/// Where sources publish, and where the request path reads the current [`View`].
#[derive(Clone)]
pub(crate) struct MembershipSink {
    view: Arc<ArcSwap<View>>,
    metrics: Arc<ClusterMetrics>,
    terminating: Arc<tokio::sync::watch::Sender<bool>>,
    /// Counts the views published.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// Whether the view is known to be current, and since when it may not be.
    freshness: Arc<parking_lot::Mutex<Freshness>>,
}

/// Whether a sink's view is current (`docs/design/routing.md#membership`).
#[derive(Debug, Clone, Copy)]
struct Freshness {
    /// The source delivered a complete view at least once.
    known: bool,
    /// The source fails to read its input.
    failing: bool,
    /// When the source last confirmed its view (or the sink was made).
    confirmed: std::time::Instant,
}

impl std::fmt::Debug for MembershipSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembershipSink")
            .field("peers", &self.view.load().snapshot.peers.len())
            .finish()
    }
}

impl MembershipSink {
    /// A sink whose initial view is `initial` (for a pod without peers: itself alone).
    pub(crate) fn new(initial: Snapshot, metrics: Arc<ClusterMetrics>) -> Self {
        let sink = Self {
            view: Arc::new(ArcSwap::from_pointee(View::new(initial))),
            metrics,
            terminating: Arc::new(tokio::sync::watch::channel(false).0),
            changes: Arc::new(tokio::sync::watch::channel(0).0),
            freshness: Arc::new(parking_lot::Mutex::new(Freshness {
                known: false,
                failing: false,
                confirmed: std::time::Instant::now(),
            })),
        };
        sink.update_gauges(&sink.view.load());
        sink
    }

    /// Where membership and the peer probes are counted.
    pub(crate) fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// The current view (lock-free).
    pub(crate) fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// Publishes `snapshot` from `source`; does nothing when it equals the current one.
    /// Returns whether the view changed.
    pub(crate) fn publish(&self, source: Source, snapshot: Snapshot) -> bool {
        if self.view.load().snapshot == snapshot {
            return false;
        }
        let view = Arc::new(View::after(snapshot, &self.view.load()));
        self.update_gauges(&view);
        tracing::info!(
            source = source.label(),
            routable = view.count(PeerState::Routable),
            draining = view.count(PeerState::Draining),
            gone = view.count(PeerState::Gone),
            "membership changed"
        );
        self.view.store(view);
        self.metrics.membership_change(source);
        self.changes.send_modify(|n| *n += 1);
        true
    }

    /// The source's view is complete and current now: it read its input (the peers file), or
    /// its watch delivered an event after its first complete list.
    pub(crate) fn confirm(&self) {
        *self.freshness.lock() = Freshness {
            known: true,
            failing: false,
            confirmed: std::time::Instant::now(),
        };
    }

    /// The source cannot read its input now; the view it last confirmed stays in force.
    pub(crate) fn failing(&self) {
        self.freshness.lock().failing = true;
    }

    /// Whether the source delivered a complete view yet (until then the pod is not ready).
    pub(crate) fn is_known(&self) -> bool {
        self.freshness.lock().known
    }

    /// How old the view may be at `now`: zero while the source reads its input, else the time
    /// since it last did (since the sink was made, before a first complete view).
    pub(crate) fn age(&self, now: std::time::Instant) -> std::time::Duration {
        let f = *self.freshness.lock();
        if f.known && !f.failing {
            return std::time::Duration::ZERO;
        }
        now.saturating_duration_since(f.confirmed)
    }

    /// Pods count as settled once routable for `dwell` (`--rebalance-dwell`).
    pub(crate) fn set_dwell(&self, dwell: std::time::Duration) {
        let view = View::after(self.view.load().snapshot.clone(), &self.view.load());
        self.view.store(Arc::new(view.with_dwell(dwell)));
    }

    /// Changes with every view published (the peer prober probes new peers at once).
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Records that this pod is being deleted (its endpoint of the peer Service turned
    /// `terminating`): the sidecar drains (`docs/design/handoff.md#when-a-pod-drains`). Idempotent.
    pub(crate) fn mark_terminating(&self) {
        self.terminating
            .send_if_modified(|t| !std::mem::replace(t, true));
    }

    /// Whether this pod is being deleted ([`Self::mark_terminating`] was called).
    pub(crate) fn is_terminating(&self) -> bool {
        *self.terminating.borrow()
    }

    /// Turns `true` once this pod is being deleted.
    pub(crate) fn terminating(&self) -> tokio::sync::watch::Receiver<bool> {
        self.terminating.subscribe()
    }

    fn update_gauges(&self, view: &View) {
        for state in [PeerState::Routable, PeerState::Draining, PeerState::Gone] {
            self.metrics.set_ring_size(state, view.count(state));
        }
    }
}

/// Pods for unit tests of the crate (`#[cfg(test)]`).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{Peer, PeerState};

    /// Pod `uid` (named after its UID, revision `v1`) on `127.0.0.1:8080`, in `state`.
    pub(crate) fn peer(uid: &str, state: PeerState) -> Peer {
        Peer {
            uid: uid.into(),
            name: uid.into(),
            address: "127.0.0.1:8080".parse().unwrap(),
            peer_port: None,
            state,
            revision: "v1".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::ops::admin::Exposition;

    pub(crate) fn peer(uid: &str, state: PeerState, revision: &str) -> Peer {
        Peer {
            uid: uid.into(),
            name: format!("pod-{uid}"),
            address: "127.0.0.1:8080".parse().unwrap(),
            peer_port: None,
            state,
            revision: revision.into(),
        }
    }

    #[test]
    fn a_view_is_trusted_once_known_and_ages_while_its_source_fails() {
        let sink = MembershipSink::new(Snapshot::default(), Arc::default());
        let later = std::time::Instant::now() + std::time::Duration::from_secs(5);
        assert!(!sink.is_known());
        assert!(
            sink.age(later) >= std::time::Duration::from_secs(5),
            "unknown: as old as the sink"
        );
        sink.confirm();
        assert!(sink.is_known());
        assert_eq!(sink.age(later), std::time::Duration::ZERO);
        sink.failing();
        assert!(sink.is_known(), "a failing source keeps its last view");
        assert!(sink.age(later) >= std::time::Duration::from_secs(4));
        sink.confirm();
        assert_eq!(sink.age(later), std::time::Duration::ZERO);
    }

    #[test]
    fn a_pod_stays_routable_since_it_first_was_until_it_is_not() {
        let first = View::new(Snapshot {
            peers: vec![
                peer("a", PeerState::Routable, "v1"),
                peer("b", PeerState::Draining, "v1"),
            ],
        });
        let a_since = first.routable_since("a").unwrap();
        assert_eq!(first.routable_since("b"), None);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = View::after(
            Snapshot {
                peers: vec![
                    peer("a", PeerState::Routable, "v1"),
                    peer("b", PeerState::Routable, "v1"),
                ],
            },
            &first,
        );
        assert_eq!(
            second.routable_since("a"),
            Some(a_since),
            "still routable: the same instant"
        );
        assert!(
            second.routable_since("b").unwrap() > a_since,
            "newly routable: now"
        );
        let third = View::after(
            Snapshot {
                peers: vec![
                    peer("a", PeerState::Draining, "v1"),
                    peer("b", PeerState::Routable, "v1"),
                ],
            },
            &second,
        );
        assert_eq!(third.routable_since("a"), None);
        let fourth = View::after(
            Snapshot {
                peers: vec![peer("a", PeerState::Routable, "v1")],
            },
            &third,
        );
        assert!(
            fourth.routable_since("a").unwrap() > a_since,
            "a break starts the clock again"
        );
    }

    #[test]
    fn the_walk_asks_the_owner_then_the_settled_pods() {
        let snap = Snapshot {
            peers: ["a", "b", "c", "d"]
                .map(|u| peer(u, PeerState::Routable, "v1"))
                .to_vec(),
        };
        let mut view = View::new(snap).with_dwell(std::time::Duration::from_secs(60));
        // a and b have been routable for an hour, c and d just joined.
        let long_ago = std::time::Instant::now() - std::time::Duration::from_secs(3600);
        view.routable_since[0] = Some(long_ago);
        view.routable_since[1] = Some(long_ago);
        for i in 0..200 {
            let key = format!("session-{i}");
            let walk: Vec<&str> = view.walk(&key).map(|p| p.uid.as_str()).collect();
            let hrw: Vec<&str> = view.ranked(&key).map(|p| p.uid.as_str()).collect();
            assert_eq!(walk[0], hrw[0], "the owner first");
            let settled_owner = hrw.iter().find(|u| ["a", "b"].contains(u)).unwrap();
            let second = if ["a", "b"].contains(&walk[0]) {
                hrw.iter()
                    .filter(|u| ["a", "b"].contains(u))
                    .nth(1)
                    .unwrap()
            } else {
                settled_owner
            };
            assert_eq!(
                walk[1], *second,
                "then the settled pods in HRW order: {walk:?}"
            );
            assert_eq!(walk.len(), 4);
        }
        assert!(view.is_settled("a") && !view.is_settled("c"));
    }

    #[test]
    fn the_preferred_set_is_the_newest_revision() {
        let snap = Snapshot {
            peers: vec![
                peer("a", PeerState::Routable, "v1"),
                peer("b", PeerState::Routable, "v1"),
                peer("c", PeerState::Routable, "v2"),
                peer("d", PeerState::Draining, "v2"),
            ],
        };
        let view = View::new(snap);
        for i in 0..200 {
            let key = format!("session-{i}");
            assert_eq!(view.owner(&key).unwrap().uid, "c", "v2 is the newest");
            let ranked: Vec<_> = view.ranked(&key).map(|p| p.uid.as_str()).collect();
            assert_eq!(ranked.len(), 4, "ranked covers routable and draining pods");
        }
    }

    #[test]
    fn gone_pods_are_off_the_ring_but_their_home_is_known() {
        let snap = Snapshot {
            peers: vec![
                peer("a", PeerState::Gone, "v1"),
                peer("b", PeerState::Routable, "v1"),
            ],
        };
        let view = View::new(snap);
        assert_eq!(
            view.home(&HomeToken::for_pod("a")).unwrap().state,
            PeerState::Gone
        );
        assert!(view.home(&HomeToken::for_pod("zz")).is_none());
        assert!(view.ranked("k").all(|p| p.uid == "b"));
        assert_eq!(view.owner("k").unwrap().uid, "b");
    }

    #[test]
    fn no_routable_pod_means_no_owner() {
        let view = View::new(Snapshot {
            peers: vec![peer("a", PeerState::Draining, "v1")],
        });
        assert!(view.owner("k").is_none());
        assert_eq!(view.ranked("k").count(), 1);
    }

    #[test]
    fn publishing_an_equal_snapshot_changes_nothing() {
        let metrics = Metrics::new();
        let snap = Snapshot {
            peers: vec![peer("a", PeerState::Routable, "v1")],
        };
        let sink = MembershipSink::new(snap.clone(), Arc::clone(&metrics.cluster));
        assert!(!sink.publish(Source::PeersFile, snap.clone()));
        let mut next = snap;
        next.peers[0].state = PeerState::Draining;
        assert!(sink.publish(Source::PeersFile, next));
        assert_eq!(sink.view().count(PeerState::Draining), 1);
        assert!(
            metrics
                .encode()
                .contains("tether_membership_changes_total{source=\"peers_file\"} 1")
        );
    }

    #[test]
    fn the_walk_visits_the_preferred_set_first() {
        let view = View::new(Snapshot {
            peers: vec![
                peer("b", PeerState::Draining, "v1"),
                peer("c", PeerState::Routable, "v1"),
                peer("d", PeerState::Routable, "v2"),
                peer("e", PeerState::Routable, "v2"),
            ],
        });
        for n in 0..200 {
            let key = format!("session-{n}");
            let walk: Vec<&str> = view.walk(&key).map(|p| p.uid.as_str()).collect();
            assert_eq!(walk.len(), 4, "{walk:?}");
            let (new, old) = walk.split_at(2);
            assert!(new.iter().all(|u| ["d", "e"].contains(u)), "{walk:?}");
            assert!(old.iter().all(|u| ["b", "c"].contains(u)), "{walk:?}");
            assert_eq!(Some(new[0]), view.owner(&key).map(|p| p.uid.as_str()));
            let ranked: Vec<&str> = view.ranked(&key).map(|p| p.uid.as_str()).collect();
            let old_in_rank: Vec<&str> = ranked
                .into_iter()
                .filter(|u| ["b", "c"].contains(u))
                .collect();
            assert_eq!(
                old,
                old_in_rank.as_slice(),
                "the rest keeps ranked(S) order"
            );
        }
    }
}
