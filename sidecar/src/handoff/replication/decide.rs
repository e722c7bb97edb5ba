//! The pure decisions of replication (`docs/design/replication.md`): where a session's replica
//! lives ([`replica_pod`]) and what a pod does with a request for a session it does not hold
//! ([`absent`]).

use crate::cluster::membership::{Peer, PeerState, View};
use crate::cluster::peer_health::Down;
use crate::peer::hop::Hop;

/// The replica pod of session `id` held by pod `holder`: the pod that would be `owner(id)`
/// without the holder — the first routable pod of the routing walk other than the holder
/// (`docs/design/replication.md#where-a-replica-lives`). `None` when the holder has no
/// routable peer.
pub(crate) fn replica_pod<'v>(view: &'v View, id: &str, holder: &str) -> Option<&'v Peer> {
    view.walk(id)
        .find(|p| p.uid != holder && p.state == PeerState::Routable)
}

/// Whether pod `uid` left `view` (absent, or gone): a replica it sent may be promoted.
pub(crate) fn left(view: &View, uid: &str) -> bool {
    view.peer(uid).is_none_or(|p| !p.state.is_alive())
}

/// What a pod does with a request for a session it does not hold and did not hand off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Absent {
    /// Promote the replica kept here: its holder is gone.
    Promote,
    /// Ask this pod (the session's replica pod) for the replica back: this pod is where the
    /// session lives (its home, or its owner) and lost it — its sidecar restarted.
    Claim(Peer),
    /// 503 + `Retry-After`: the replica kept here belongs to a holder that membership still
    /// lists but that the request could not reach; it may be dead without membership knowing.
    Unavailable,
    /// Route it as any request (to the holder, the walk, or 404).
    Route,
}

/// This pod, as [`absent`] sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Here<'a> {
    /// Its UID.
    pub(crate) uid: &'a str,
    /// Whether it is the session's home (its id names this pod).
    pub(crate) home: bool,
    /// Whether the session's home is alive in membership (it is where the session lives
    /// then, unless it handed it off).
    pub(crate) home_alive: bool,
    /// Whether replication is on (`spec.session.replication` is not `None`).
    pub(crate) replicating: bool,
}

/// What to do with a request for session `id` that `here` does not hold, given the holder of
/// the replica kept here (if any), the membership `view`, the request's `hop` and peer health
/// `down`.
pub(crate) fn absent(
    here: Here<'_>,
    id: &str,
    replica_of: Option<&str>,
    view: &View,
    hop: &Hop,
    down: &dyn Fn(&str) -> Option<Down>,
) -> Absent {
    if let Some(holder) = replica_of.filter(|h| *h != here.uid) {
        return if left(view, holder) {
            Absent::Promote
        } else if hop.visited(holder) || down(holder).is_some() {
            Absent::Unavailable
        } else {
            Absent::Route
        };
    }
    // A session lives on its home, or — its home gone — on its owner.
    let lives_here =
        here.home || (!here.home_alive && view.owner(id).is_some_and(|o| o.uid == here.uid));
    // The replica pod may have passed the request on (it saw the holder alive): the claim
    // asks it anyway, over the peer channel.
    if here.replicating
        && lives_here
        && let Some(pod) = replica_pod(view, id, here.uid)
    {
        return Absent::Claim(pod.clone());
    }
    Absent::Route
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::Snapshot;
    use crate::cluster::membership::fixtures::peer;

    const R: PeerState = PeerState::Routable;
    const D: PeerState = PeerState::Draining;
    const G: PeerState = PeerState::Gone;

    fn view(peers: &[(&str, PeerState)]) -> View {
        View::new(Snapshot {
            peers: peers.iter().map(|(u, s)| peer(u, *s)).collect(),
        })
    }

    /// A session id whose walk over a, b, c starts at `first`.
    fn id_owned_by(view: &View, first: &str) -> String {
        (0..)
            .map(|n| format!("session-{n}"))
            .find(|id| view.owner(id).is_some_and(|o| o.uid == first))
            .unwrap()
    }

    #[test]
    fn the_replica_pod_is_the_owner_without_the_holder() {
        let all = view(&[("a", R), ("b", R), ("c", R)]);
        for holder in ["a", "b", "c"] {
            let id = id_owned_by(&all, holder);
            let pod = replica_pod(&all, &id, holder).unwrap();
            let without: Vec<(&str, PeerState)> = [("a", R), ("b", R), ("c", R)]
                .into_iter()
                .filter(|(u, _)| *u != holder)
                .collect();
            assert_eq!(
                Some(&pod.uid),
                view(&without).owner(&id).map(|p| &p.uid),
                "once the holder {holder} is gone, its replica pod is the owner"
            );
        }
        // A session whose holder is not its owner: the owner keeps the replica.
        let id = id_owned_by(&all, "a");
        assert_eq!(replica_pod(&all, &id, "b").unwrap().uid, "a");
        // Draining pods get none; a holder alone has no replica pod.
        let draining = view(&[("a", R), ("b", D)]);
        assert!(replica_pod(&draining, &id, "a").is_none());
        assert!(replica_pod(&view(&[("a", R)]), &id, "a").is_none());
    }

    #[test]
    fn a_request_for_a_session_not_held_follows_the_table() {
        let live = view(&[("a", R), ("b", R), ("c", R)]);
        let lost = view(&[("a", G), ("b", R), ("c", R)]);
        let left = view(&[("b", R), ("c", R)]);
        let id = id_owned_by(&live, "b");
        let fresh = Hop::default();
        let through_a = Hop {
            count: 1,
            visited: vec!["a".into()],
        };
        let up = |_: &str| None;
        let refused = |u: &str| (u == "a").then_some(Down::Refused);
        let b = |home| Here {
            uid: "b",
            home,
            home_alive: true,
            replicating: true,
        };
        let claim_from =
            |v: &View, holder: &str| Absent::Claim(replica_pod(v, &id, holder).unwrap().clone());
        for (row, here, replica_of, view, hop, down, want) in [
            (
                "holder gone",
                b(false),
                Some("a"),
                &lost,
                &fresh,
                &up as &dyn Fn(&str) -> Option<Down>,
                Absent::Promote,
            ),
            (
                "holder left the view",
                b(false),
                Some("a"),
                &left,
                &fresh,
                &up,
                Absent::Promote,
            ),
            (
                "holder alive, not asked yet",
                b(false),
                Some("a"),
                &live,
                &fresh,
                &up,
                Absent::Route,
            ),
            (
                "holder alive, the request passed it",
                b(false),
                Some("a"),
                &live,
                &through_a,
                &up,
                Absent::Unavailable,
            ),
            (
                "holder alive, refuses connections",
                b(false),
                Some("a"),
                &live,
                &fresh,
                &refused,
                Absent::Unavailable,
            ),
            (
                "no replica, homed here: claim",
                b(true),
                None,
                &live,
                &fresh,
                &up,
                claim_from(&live, "b"),
            ),
            (
                "no replica, homed here, passed on by the replica pod: claim",
                b(true),
                None,
                &live,
                &Hop {
                    count: 1,
                    visited: vec![replica_pod(&live, &id, "b").unwrap().uid.clone()],
                },
                &up,
                claim_from(&live, "b"),
            ),
            (
                "no replica, owned here, home gone: claim",
                Here {
                    home_alive: false,
                    ..b(false)
                },
                None,
                &live,
                &fresh,
                &up,
                claim_from(&live, "b"),
            ),
            (
                "no replica, owned here, home alive: route to it",
                b(false),
                None,
                &live,
                &fresh,
                &up,
                Absent::Route,
            ),
            (
                "replication off",
                Here {
                    replicating: false,
                    ..b(true)
                },
                None,
                &live,
                &fresh,
                &up,
                Absent::Route,
            ),
        ] {
            assert_eq!(
                absent(here, &id, replica_of, view, hop, down),
                want,
                "{row}"
            );
        }
        // Neither home nor owner: nothing to claim, the walk goes on.
        let c = Here {
            uid: "c",
            home: false,
            home_alive: false,
            replicating: true,
        };
        assert_eq!(absent(c, &id, None, &live, &fresh, &up), Absent::Route);
    }
}
