//! Placement and routing between sidecars: [`route`] decides, from the current membership
//! [`View`], whether this pod serves a request ([`Route::Local`]) or forwards it, and to whom
//! ([`ForwardKind`]). The decision table, the hop headers and their limits ([`MAX_WALK_HOPS`],
//! [`MAX_HOPS`], the extra hop of a handed-off session, [`Router::moved_to`]) and why
//! disagreeing views cannot loop a request: `docs/design/routing.md#placement-and-routing`.
//! Peers that [`PeerHealth`] marks down are skipped like visited ones; forged session ids never
//! get here (404 at the entry).

use std::sync::Arc;

use crate::cluster::membership::{MembershipSink, Peer, PeerState, View};
use crate::cluster::peer_health::{Down, PeerHealth};
use crate::keys::KeyRing;
use crate::mcp::home::HomeToken;
use crate::mcp::rejection::{NotFound, Rejection};
pub(crate) use crate::peer::hop::{Hop, MAX_HOPS, MAX_WALK_HOPS};

/// How long membership may go unconfirmed and still be trusted, unless set otherwise.
pub(crate) const DEFAULT_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a request is forwarded (the `kind` label of `tether_forwards_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::VariantArray)]
pub(crate) enum ForwardKind {
    /// To the session's live home, or to the pod a task id names.
    Home,
    /// The home is gone: to `owner(S)` or the next pod of `ranked(S)`.
    Walk,
    /// A request without a session, placed on a routable peer because this pod drains.
    Placement,
    /// Back to this pod's own listener after every candidate failed, so it answers itself.
    Fallback,
    /// The session was handed off from here: to its new holder.
    Moved,
}

impl ForwardKind {
    /// Metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Home => "home",
            Self::Walk => "walk",
            Self::Placement => "placement",
            Self::Fallback => "fallback",
            Self::Moved => "moved",
        }
    }
}

/// What this pod does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Serve it here.
    Local,
    /// Proxy it to `peer`.
    Forward {
        /// The pod to forward to.
        peer: Peer,
        /// Why.
        kind: ForwardKind,
    },
    /// No pod can hold the session: 404 with this reason.
    NotFound(NotFound),
    /// The session's home, or a walk candidate skipped when no other is left, is alive in
    /// membership but does not answer: 503 + `Retry-After` (the session may survive a stall; a
    /// 404 would make the client drop it).
    Unavailable,
}

/// This pod, as routing sees it.
#[derive(Clone, Debug)]
pub(crate) struct Me<'a> {
    /// The pod's UID.
    pub(crate) uid: &'a str,
    /// Its home token.
    pub(crate) home: HomeToken,
    /// Whether it drains (then it places no new session on itself).
    pub(crate) draining: bool,
}

/// The request being routed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target<'a> {
    /// A request carrying a genuine session id (its MAC verified).
    Session {
        /// The client session id (the ring key).
        id: &'a str,
        /// The home token from the id.
        home: HomeToken,
        /// Whether this pod holds the session.
        held: bool,
    },
    /// A request about what a pod's MCP server issued, whose genuine sealed value names that
    /// pod (`mcp/sealed.rs`): a task of the tasks extension, or the `requestState` a multi
    /// round-trip request retries with. That pod serves it, draining or not.
    Issued {
        /// The home token from the sealed value.
        home: HomeToken,
    },
    /// A request without a session id; `nonce` (random per request) spreads placements.
    Placement {
        /// Any random string.
        nonce: &'a str,
    },
}

/// One pod's routing context: who it is, the membership it sees and the hop secret.
#[derive(Clone, Debug)]
pub(crate) struct Router {
    sink: MembershipSink,
    health: Arc<PeerHealth>,
    address: std::net::SocketAddr,
    uid: String,
    home: HomeToken,
    secret: KeyRing,
    stale_after: std::time::Duration,
}

impl Router {
    /// The router of pod `uid` (its MCP listener on `address`), reading membership from `sink`
    /// and skipping the peers `health` marks down.
    pub(crate) fn new(
        sink: MembershipSink,
        health: Arc<PeerHealth>,
        address: std::net::SocketAddr,
        uid: String,
        secret: KeyRing,
    ) -> Self {
        Self {
            sink,
            health,
            address,
            home: HomeToken::for_pod(&uid),
            uid,
            secret,
            stale_after: DEFAULT_STALE_AFTER,
        }
    }

    /// This pod's UID.
    pub(crate) fn uid(&self) -> &str {
        &self.uid
    }

    /// This pod as a forward target: its own MCP listener.
    pub(crate) fn own_peer(&self) -> Peer {
        Peer {
            uid: self.uid.clone(),
            name: self.uid.clone(),
            address: self.address,
            peer_port: None,
            state: PeerState::Routable,
            revision: String::new(),
        }
    }

    /// The endpoint secret (keys the hop MAC).
    pub(crate) fn secret(&self) -> &KeyRing {
        &self.secret
    }

    /// The current membership view (lock-free).
    pub(crate) fn view(&self) -> Arc<View> {
        self.sink.view()
    }

    /// The health of peers (forwards that cannot connect mark a peer down here).
    pub(crate) fn health(&self) -> &PeerHealth {
        &self.health
    }

    /// Where a session handed off from here to pod `uid` goes: that pod, when membership knows
    /// it alive and the hop budget allows. A holder marked down because a connection to it was
    /// refused or broken is still asked (a client leaving a forwarded exchange marks it so too):
    /// only it can answer for the session, and the hop budget bounds the retries.
    ///
    /// # Errors
    /// The answer when it cannot go there — never this pod's own lookup, which would call a
    /// session it handed off unknown: 404 `hop_limit` when the hop budget is spent; 503 +
    /// `Retry-After` when the new holder is alive but does not answer in time (the session may
    /// survive: an adopter stalled by load); 404 `no_holder` when the new holder left
    /// membership or refuses connections (the session went with it; a pod that kept a copy
    /// pushes it again instead).
    pub(crate) fn moved_to(&self, uid: &str, hop: &Hop) -> Result<Peer, Rejection> {
        let now = std::time::Instant::now();
        if hop.count >= MAX_HOPS {
            return Err(Rejection::SessionNotFound(NotFound::HopLimit));
        }
        match self
            .view()
            .peer(uid)
            .filter(|p| p.state.is_alive() && p.uid != self.uid)
        {
            None => Err(Rejection::SessionNotFound(NotFound::NoHolder)),
            Some(p) => match self.health.down(uid, now) {
                Some(Down::Refused) => Err(Rejection::SessionNotFound(NotFound::NoHolder)),
                Some(Down::Unresponsive) => Err(Rejection::PeerUnavailable),
                None => Ok(p.clone()),
            },
        }
    }

    /// This pod as routing sees it, `draining` or not.
    pub(crate) fn me(&self, draining: bool) -> Me<'_> {
        Me {
            uid: &self.uid,
            home: self.home,
            draining,
        }
    }

    /// [`route`] with this pod's identity, the current view and the peers now down.
    ///
    /// While membership is not known to be current (no complete view yet, or its source has
    /// failed for longer than `--membership-stale-after`), a session found on no pod is
    /// [`Route::Unavailable`] (503 + `Retry-After`), not 404: the pod holding it may be one this
    /// view does not know.
    pub(crate) fn route(&self, draining: bool, target: Target<'_>, hop: &Hop) -> Route {
        let me = self.me(draining);
        let now = std::time::Instant::now();
        let route = route(&self.view(), &me, target, hop, &|uid| {
            self.health.down(uid, now)
        });
        match route {
            Route::NotFound(_) if !self.trusted(now) => Route::Unavailable,
            route => route,
        }
    }

    /// How old membership's view may be at `now` (`tether_membership_age_seconds`).
    pub(crate) fn membership_age(&self, now: std::time::Instant) -> std::time::Duration {
        self.sink.age(now)
    }

    /// Whether membership's first complete view arrived (until then the pod is not ready).
    pub(crate) fn membership_known(&self) -> bool {
        self.sink.is_known()
    }

    /// Whether membership is known to be current at `now` (see [`Router::route`]).
    pub(crate) fn trusted(&self, now: std::time::Instant) -> bool {
        self.sink.is_known() && self.sink.age(now) <= self.stale_after
    }

    /// Sets how long membership may go unconfirmed and still be trusted
    /// (`--membership-stale-after`).
    pub(crate) fn stale_after(self, stale_after: std::time::Duration) -> Self {
        Self {
            stale_after,
            ..self
        }
    }
}

/// Decides where a request goes (module docs); `hop` is where it has been, and peers `down`
/// reports down are skipped like visited ones — except an unresponsive live home, which is
/// [`Route::Unavailable`]. A request this pod sent back to itself (the last visited pod is this
/// one) is never forwarded again.
pub(crate) fn route(
    view: &View,
    me: &Me<'_>,
    target: Target<'_>,
    hop: &Hop,
    down: &dyn Fn(&str) -> Option<Down>,
) -> Route {
    let skip = |p: &Peer| p.uid == me.uid || hop.visited(&p.uid) || down(&p.uid).is_some();
    let returned = hop.visited.last().is_some_and(|u| u == me.uid);
    let can_hop = hop.count < MAX_WALK_HOPS;
    let forward = |peer: &Peer, kind| {
        if can_hop {
            Route::Forward {
                peer: peer.clone(),
                kind,
            }
        } else {
            Route::NotFound(NotFound::HopLimit)
        }
    };
    match target {
        Target::Session { held: true, .. } => Route::Local,
        Target::Session { home, .. } if home == me.home => Route::Local,
        Target::Session { .. } if returned => Route::NotFound(NotFound::NoHolder),
        Target::Session { id, home, .. } => {
            if let Some(h) = view.home(&home).filter(|h| h.state.is_alive()) {
                // A draining home hands its sessions to `owner(S)`: the entry asks the owner
                // first, so requests of a moved session stop passing through the pod that is
                // about to stop (their streams would break when it does). An owner that does
                // not hold the session (yet) asks the home.
                if h.state == PeerState::Draining
                    && hop.count == 0
                    && let Some(o) = view.owner(id).filter(|o| !skip(o) && o.uid != h.uid)
                {
                    return forward(o, ForwardKind::Walk);
                }
                match down(&h.uid) {
                    Some(Down::Unresponsive) => return Route::Unavailable,
                    None if !skip(h) => return forward(h, ForwardKind::Home),
                    _ => {}
                }
            }
            // Handoffs move a session to its owner: an owner that does not answer in time (an
            // adopter stalled by load) most likely holds it, and the pods after it do not.
            if let Some(o) = view.owner(id)
                && o.uid != me.uid
                && !hop.visited(&o.uid)
                && down(&o.uid) == Some(Down::Unresponsive)
            {
                return Route::Unavailable;
            }
            let next = view
                .owner(id)
                .filter(|p| !skip(p))
                .or_else(|| view.walk(id).find(|p| !skip(p)));
            // A candidate skipped only because it does not answer in time may be the holder
            // (an adopter stalled by load): the session may survive, so 503, never 404.
            let stalled = || {
                view.walk(id).any(|p| {
                    p.uid != me.uid
                        && !hop.visited(&p.uid)
                        && down(&p.uid) == Some(Down::Unresponsive)
                })
            };
            match next {
                Some(p) => forward(p, ForwardKind::Walk),
                None if stalled() => Route::Unavailable,
                None => Route::NotFound(NotFound::NoHolder),
            }
        }
        Target::Issued { home } if home == me.home => Route::Local,
        Target::Issued { .. } if returned => Route::NotFound(NotFound::NoHolder),
        Target::Issued { home } => match view.home(&home).filter(|h| h.state.is_alive()) {
            Some(h) if down(&h.uid) == Some(Down::Unresponsive) => Route::Unavailable,
            Some(h) if !skip(h) => forward(h, ForwardKind::Home),
            _ => Route::NotFound(NotFound::NoHolder),
        },
        Target::Placement { nonce } => {
            let state = if me.draining {
                PeerState::Draining
            } else {
                view.peer(me.uid).map_or(PeerState::Routable, |p| p.state)
            };
            if state == PeerState::Routable || !can_hop || returned {
                return Route::Local;
            }
            let next = view
                .owner(nonce)
                .filter(|p| !skip(p))
                .or_else(|| view.routable().find(|p| !skip(p)));
            match next {
                Some(p) => forward(p, ForwardKind::Placement),
                None => Route::Local,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::Snapshot;
    use crate::cluster::membership::fixtures::peer;
    use proptest::prelude::*;

    fn view(peers: &[(&str, PeerState)]) -> View {
        View::new(Snapshot {
            peers: peers.iter().map(|(u, s)| peer(u, *s)).collect(),
        })
    }

    fn me(uid: &str) -> Me<'_> {
        Me {
            uid,
            home: HomeToken::for_pod(uid),
            draining: false,
        }
    }

    fn session(id: &str, home: &str, held: bool) -> Target<'static> {
        Target::Session {
            id: Box::leak(id.to_owned().into_boxed_str()),
            home: HomeToken::for_pod(home),
            held,
        }
    }

    fn forwarded_to(r: &Route) -> Option<(&str, ForwardKind)> {
        match r {
            Route::Forward { peer, kind } => Some((peer.uid.as_str(), *kind)),
            _ => None,
        }
    }

    const R: PeerState = PeerState::Routable;
    const D: PeerState = PeerState::Draining;
    const G: PeerState = PeerState::Gone;

    #[test]
    fn a_session_moved_from_here_is_never_answered_here() {
        let snapshot = Snapshot {
            peers: [("a", R), ("b", R), ("c", G)]
                .iter()
                .map(|(u, st)| peer(u, *st))
                .collect(),
        };
        let health = PeerHealth::new();
        let router = Router::new(
            MembershipSink::new(snapshot, Arc::default()),
            Arc::clone(&health),
            "127.0.0.1:8080".parse().unwrap(),
            "a".into(),
            KeyRing::from_bytes(*b"0123456789abcdef"),
        );
        let fresh = Hop::default();
        assert_eq!(router.moved_to("b", &fresh).unwrap().uid, "b");
        // The new holder gone from membership: the session went with it.
        assert_eq!(
            router.moved_to("c", &fresh).unwrap_err(),
            Rejection::SessionNotFound(NotFound::NoHolder)
        );
        // Out of the hop budget.
        let spent = Hop {
            count: MAX_HOPS,
            visited: vec![],
        };
        assert_eq!(
            router.moved_to("b", &spent).unwrap_err(),
            Rejection::SessionNotFound(NotFound::HopLimit)
        );
        // Refused or broken connections: its sidecar is gone, and the session with it (a pod
        // that kept a copy pushes it again).
        health.mark_down("b", Down::Refused, std::time::Instant::now());
        assert_eq!(
            router.moved_to("b", &fresh).unwrap_err(),
            Rejection::SessionNotFound(NotFound::NoHolder)
        );
        // Alive but not answering (an adopter stalled by load): 503, the session may survive.
        health.mark_down("b", Down::Unresponsive, std::time::Instant::now());
        assert_eq!(
            router.moved_to("b", &fresh).unwrap_err(),
            Rejection::PeerUnavailable
        );
    }

    #[test]
    fn held_or_homed_here_is_local() {
        let v = view(&[("a", R), ("b", R)]);
        let h = Hop::default();
        assert_eq!(
            route(&v, &me("a"), session("s", "b", true), &h, &|_| None),
            Route::Local
        );
        assert_eq!(
            route(&v, &me("a"), session("s", "a", false), &h, &|_| None),
            Route::Local
        );
    }

    #[test]
    fn a_live_home_gets_the_request_even_when_draining() {
        let h = Hop::default();
        for state in [R, D] {
            let v = view(&[("a", R), ("b", state)]);
            let r = route(&v, &me("a"), session("s", "b", false), &h, &|_| None);
            assert_eq!(forwarded_to(&r), Some(("b", ForwardKind::Home)));
        }
    }

    #[test]
    fn a_draining_home_is_asked_through_the_owner_it_hands_its_sessions_to() {
        let v = view(&[("a", R), ("b", D), ("c", R)]);
        let mut via_owner = 0;
        for i in 0..50 {
            let id = format!("sess-{i}");
            let owner = v.owner(&id).unwrap().uid.clone();
            let at_entry = route(
                &v,
                &me("a"),
                session(&id, "b", false),
                &Hop::default(),
                &|_| None,
            );
            if owner == "c" {
                via_owner += 1;
                assert_eq!(forwarded_to(&at_entry), Some(("c", ForwardKind::Walk)));
                // The owner does not hold it (yet): it asks the home.
                let at_owner = route(
                    &v,
                    &me("c"),
                    session(&id, "b", false),
                    &Hop::default().next("a"),
                    &|_| None,
                );
                assert_eq!(forwarded_to(&at_owner), Some(("b", ForwardKind::Home)));
            } else {
                assert_eq!(forwarded_to(&at_entry), Some(("b", ForwardKind::Home)));
            }
        }
        assert!(via_owner > 10, "{via_owner}");
    }

    #[test]
    fn a_gone_home_sends_the_request_to_the_owner_then_down_the_ranking() {
        let v = view(&[("a", R), ("b", G), ("c", R), ("d", R)]);
        for i in 0..50 {
            let id = format!("sess-{i}");
            let owner = v.owner(&id).unwrap().uid.clone();
            let entry = if owner == "a" { "c" } else { "a" };
            let r = route(
                &v,
                &me(entry),
                session(&id, "b", false),
                &Hop::default(),
                &|_| None,
            );
            assert_eq!(forwarded_to(&r), Some((owner.as_str(), ForwardKind::Walk)));
            // At the owner, which does not hold it: the next ranked pod not visited.
            let hop = Hop::default().next(entry);
            let r = route(&v, &me(&owner), session(&id, "b", false), &hop, &|_| None);
            let expected = v
                .ranked(&id)
                .find(|p| p.uid != owner && p.uid != entry)
                .map(|p| p.uid.clone());
            assert_eq!(forwarded_to(&r).map(|(u, _)| u.to_owned()), expected);
        }
    }

    #[test]
    fn the_hop_limit_ends_in_404() {
        let v = view(&[("a", R), ("b", R), ("c", R)]);
        let hop = (0..MAX_WALK_HOPS).fold(Hop::default(), |h, i| h.next(&format!("x{i}")));
        assert_eq!(
            route(&v, &me("a"), session("s", "b", false), &hop, &|_| None),
            Route::NotFound(NotFound::HopLimit)
        );
        // Nothing left to visit: no holder.
        let lonely = view(&[("a", R), ("b", G)]);
        assert_eq!(
            route(
                &lonely,
                &me("a"),
                session("s", "b", false),
                &Hop::default(),
                &|_| None
            ),
            Route::NotFound(NotFound::NoHolder)
        );
    }

    #[test]
    fn a_down_home_is_skipped_like_a_visited_one() {
        let v = view(&[("a", R), ("b", R), ("c", R)]);
        let at_a = |down: &dyn Fn(&str) -> Option<Down>, home: &str, id: &str| {
            route(
                &v,
                &me("a"),
                session(id, home, false),
                &Hop::default(),
                down,
            )
        };
        let refused = |uid: &str| (uid == "b").then_some(Down::Refused);
        // Not to the dead home: the walk goes on to c.
        assert_eq!(
            forwarded_to(&at_a(&refused, "b", "s")),
            Some(("c", ForwardKind::Walk))
        );
        let all_refused = |uid: &str| (uid != "a").then_some(Down::Refused);
        assert_eq!(
            at_a(&all_refused, "b", "s"),
            Route::NotFound(NotFound::NoHolder)
        );
        // A stalled home keeps its sessions: retry later, never 404.
        let stalled = |uid: &str| (uid == "b").then_some(Down::Unresponsive);
        assert_eq!(at_a(&stalled, "b", "s"), Route::Unavailable);
        // Home "z" is unknown (gone): a stalled owner most likely holds the session (handoffs
        // move it there), so 503; a stalled candidate after the owner is skipped.
        let stalled_c = |uid: &str| (uid == "c").then_some(Down::Unresponsive);
        let (mut owned_by_c, mut walked) = (0, 0);
        for i in 0..20 {
            let key = format!("k{i}");
            let r = at_a(&stalled_c, "z", &key);
            if v.owner(&key).is_some_and(|o| o.uid == "c") {
                assert_eq!(r, Route::Unavailable, "{key}");
                owned_by_c += 1;
            } else {
                assert_eq!(forwarded_to(&r), Some(("b", ForwardKind::Walk)), "{key}");
                walked += 1;
            }
        }
        assert!(owned_by_c > 0 && walked > 0, "{owned_by_c} {walked}");
        // Every candidate left stalled (an adopter slowed down by load may hold it): 503.
        let stalled_all = |uid: &str| (uid != "a").then_some(Down::Unresponsive);
        assert_eq!(at_a(&stalled_all, "z", "s"), Route::Unavailable);
        // One stalled and one refused: the stalled one may still hold it.
        let mixed = |uid: &str| match uid {
            "b" => Some(Down::Refused),
            "c" => Some(Down::Unresponsive),
            _ => None,
        };
        assert_eq!(at_a(&mixed, "z", "s"), Route::Unavailable);
    }

    #[test]
    fn a_request_sent_back_to_this_pod_is_answered_here() {
        let v = view(&[("a", D), ("b", R), ("c", R)]);
        let back = Hop::default().next("a");
        assert_eq!(
            route(&v, &me("a"), session("s", "b", false), &back, &|_| None),
            Route::NotFound(NotFound::NoHolder)
        );
        assert_eq!(
            route(
                &v,
                &me("a"),
                Target::Placement { nonce: "n" },
                &back,
                &|_| None
            ),
            Route::Local
        );
    }

    #[test]
    fn placement_stays_local_unless_this_pod_drains() {
        let v = view(&[("a", R), ("b", R), ("c", D)]);
        let h = Hop::default();
        assert_eq!(
            route(&v, &me("a"), Target::Placement { nonce: "n" }, &h, &|_| {
                None
            }),
            Route::Local
        );
        let mut draining = me("a");
        draining.draining = true;
        let r = route(&v, &draining, Target::Placement { nonce: "n" }, &h, &|_| {
            None
        });
        assert_eq!(forwarded_to(&r), Some(("b", ForwardKind::Placement)));
        // Marked draining by membership, and never onto a draining peer.
        let r = route(&v, &me("c"), Target::Placement { nonce: "n" }, &h, &|_| {
            None
        });
        assert!(matches!(forwarded_to(&r), Some(("a" | "b", _))));
        // No routable peer: served here rather than refused.
        let alone = view(&[("a", D)]);
        assert_eq!(
            route(
                &alone,
                &me("a"),
                Target::Placement { nonce: "n" },
                &h,
                &|_| None
            ),
            Route::Local
        );
    }

    /// A request about a task goes to the pod its id names, draining or not; a pod that is gone
    /// or refuses connections leaves it to this pod (which answers the task's not-found
    /// error), one that does not answer in time is 503 (it may still hold the task).
    #[test]
    fn a_task_request_goes_to_the_tasks_pod_whatever_its_state() {
        let v = view(&[("a", R), ("b", D), ("c", G)]);
        let h = Hop::default();
        let task = |pod: &str| Target::Issued {
            home: HomeToken::for_pod(pod),
        };
        let mut draining = me("b");
        draining.draining = true;
        assert_eq!(route(&v, &draining, task("b"), &h, &|_| None), Route::Local);
        let r = route(&v, &me("a"), task("b"), &h, &|_| None);
        assert_eq!(forwarded_to(&r), Some(("b", ForwardKind::Home)));
        for gone in ["c", "zz"] {
            assert_eq!(
                route(&v, &me("a"), task(gone), &h, &|_| None),
                Route::NotFound(NotFound::NoHolder)
            );
        }
        assert_eq!(
            route(&v, &me("a"), task("b"), &h, &|_| Some(Down::Refused)),
            Route::NotFound(NotFound::NoHolder)
        );
        assert_eq!(
            route(&v, &me("a"), task("b"), &h, &|_| Some(Down::Unresponsive)),
            Route::Unavailable
        );
        assert_eq!(
            route(&v, &me("a"), task("b"), &Hop::default().next("a"), &|_| {
                None
            }),
            Route::NotFound(NotFound::NoHolder),
            "sent back here: answered here"
        );
    }

    fn any_state() -> impl Strategy<Value = PeerState> {
        prop_oneof![Just(R), Just(D), Just(G)]
    }

    proptest! {
        /// Membership disagreement (`docs/design/routing.md#membership`): every pod has its own
        /// view of five pods; following the forwards from any entry always ends (at a holder, a
        /// local 404 or a routing 404) within [`MAX_WALK_HOPS`] hops and never visits a pod twice.
        #[test]
        fn disagreeing_views_never_loop(
            views in proptest::collection::vec(proptest::collection::vec(any_state(), 5), 5),
            known in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 5), 5),
            home in 0usize..6,
            holder in proptest::option::of(0usize..5),
            entry in 0usize..5,
            id in "[a-z0-9]{8}",
        ) {
            let uid = |i: usize| format!("pod-{i}");
            let views: Vec<View> = (0..5)
                .map(|p| View::new(Snapshot {
                    peers: (0..5)
                        .filter(|&q| q == p || known[p][q])
                        .map(|q| peer(&uid(q), views[p][q]))
                        .collect(),
                }))
                .collect();
            let home_uid = uid(home); // pod-5 exists in no view
            let mut at = entry;
            let mut hop = Hop::default();
            let mut seen = vec![entry];
            loop {
                let target = session(&id, &home_uid, holder == Some(at));
                match route(&views[at], &me(&uid(at)), target, &hop, &|_| None) {
                    Route::Local | Route::NotFound(_) | Route::Unavailable => break,
                    Route::Forward { peer, .. } => {
                        let next: usize = peer.uid[4..].parse().unwrap();
                        prop_assert!(!seen.contains(&next), "visited {next} twice: {seen:?}");
                        hop = hop.next(&uid(at));
                        prop_assert!(hop.count <= MAX_WALK_HOPS);
                        seen.push(next);
                        at = next;
                    }
                }
            }
        }
    }
}
