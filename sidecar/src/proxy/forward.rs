//! Forwarding decisions, as plain functions of what happened and what membership says
//! (`docs/design/routing.md#forwarding`): what a request on its way to a peer sidecar
//! does after a connection failed or broke ([`after_failure`]: the same peer again, the next
//! candidate, this pod's own listener, or an answer), and which error a failed exchange is
//! answered with ([`failed_answer`]). The pingora callbacks in [`super`] only gather the facts
//! and carry the decision out.

use pingora::ErrorType;

use crate::cluster::membership::{Peer, View};
use crate::cluster::peer_health::Down;
use crate::cluster::routing::{ForwardKind, Hop, Me, Route, Target, route};
use crate::mcp::home::HomeToken;
use crate::mcp::rejection::{NotFound, Rejection};

/// Most peers a forward tries to connect to before it gives up (each failure marks the peer
/// down, so later requests skip it without trying).
pub(crate) const MAX_CONNECT_ATTEMPTS: usize = 3;

/// A request on its way to a peer sidecar.
#[derive(Debug)]
pub(crate) struct Forwarding {
    /// The peer it goes to.
    pub(crate) peer: Peer,
    /// Why.
    pub(crate) kind: ForwardKind,
    /// Where it has been before this pod (the hop headers it arrived with).
    pub(crate) hop: Hop,
    /// Its session id, if any (part of the hop MAC and the ring key).
    pub(crate) session_id: Option<String>,
    /// The session's home token, for re-routing after a connect failure.
    pub(crate) target_home: Option<HomeToken>,
    /// Peers that could not be reached, skipped by the re-route.
    pub(crate) unreachable: Vec<String>,
    /// The answer when no candidate is left after connect failures.
    pub(crate) fallback: Option<Rejection>,
    /// The request was sent back to this pod's own listener after every candidate failed.
    pub(crate) to_self: bool,
    /// The request may run at most once: it is sent again only after a connection that was
    /// never made, never after one that broke (a 2026-07-28 POST, which nobody de-duplicates).
    pub(crate) at_most_once: bool,
}

impl Forwarding {
    /// A forward of a request that arrived with `hop` to `peer`, for `kind`.
    pub(crate) fn new(
        peer: Peer,
        kind: ForwardKind,
        hop: Hop,
        session_id: Option<String>,
        target_home: Option<HomeToken>,
    ) -> Self {
        Self {
            peer,
            kind,
            hop,
            session_id,
            target_home,
            unreachable: Vec::new(),
            fallback: None,
            to_self: false,
            at_most_once: false,
        }
    }

    /// The hop state with the peers found unreachable counted as visited, so neither this pod
    /// nor the next one tries them again.
    pub(crate) fn hop_so_far(&self) -> Hop {
        let mut hop = self.hop.clone();
        hop.visited.extend(self.unreachable.iter().cloned());
        hop
    }
}

/// What went wrong on the way to the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection: refused (nobody listens there), or not made in time or otherwise failed
    /// (the pod may be stalled).
    Connect {
        /// The peer refused the connection.
        refused: bool,
    },
    /// The exchange broke after the connection was made.
    Broken {
        /// The request can be sent again as it was (pingora still holds its body).
        replayable: bool,
        /// Part of the peer's answer already reached the client.
        answered: bool,
        /// A read or write timed out: the peer may still be running the request.
        timed_out: bool,
        /// The connection came from the pool: the peer may merely have closed an idle one.
        reused_connection: bool,
    },
}

/// What the proxy does after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send the request to the same peer again, on a fresh connection.
    SameAgain,
    /// Send it to the next candidate, now in [`Forwarding::peer`].
    Retry,
    /// Stop: answer [`Forwarding::fallback`] when the decision set one, else the error's own
    /// answer ([`failed_answer`]).
    GiveUp,
}

/// A decision of [`after_failure`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// What to do.
    pub(crate) next: Next,
    /// The peer given up on and why, to mark down in peer health (never this pod).
    pub(crate) mark_down: Option<(String, Down)>,
    /// Whether the peer that failed was given up on (the re-route ran; counted as a
    /// `connect_error` forward).
    pub(crate) rerouted: bool,
}

/// What a decision needs to know about the endpoint: the membership view, this pod, the peers
/// down now, this pod's own listener as a peer, and a random nonce that spreads placements.
pub(crate) struct World<'a> {
    /// The current membership view.
    pub(crate) view: &'a View,
    /// This pod.
    pub(crate) me: Me<'a>,
    /// The peers peer health finds down now.
    pub(crate) down: &'a dyn Fn(&str) -> Option<Down>,
    /// This pod's own MCP listener, as a forward target.
    pub(crate) own: &'a Peer,
    /// Any random string (placements of requests without a session).
    pub(crate) nonce: &'a str,
    /// The holder of the replica this pod keeps of a session, if it keeps one
    /// (`docs/design/replication.md`).
    pub(crate) replica_of: &'a dyn Fn(&str) -> Option<String>,
}

/// Decides what a forward does after `failure` and updates `f` accordingly:
///
/// - a broken exchange that cannot be sent again as it was (not replayable, partly answered,
///   or timed out: the peer may still be running it) is given up; the error answers;
/// - a broken exchange on a pooled connection goes to the same peer again on a fresh one (the
///   peer merely closed an idle connection);
/// - otherwise the peer is given up on: marked down (refused, or unresponsive after a connect
///   timeout; a broken fresh connection counts as refused: the peer is stopping) and the
///   request re-routed ([`reroute`]).
///
/// Sending a request again is safe even for a POST of a session: the holder de-duplicates a
/// retried request by its JSON-RPC id and body, so it never runs twice. A 2026-07-28 POST has
/// nobody to do that ([`Forwarding::at_most_once`]): any broken exchange gives it up.
pub(crate) fn after_failure(f: &mut Forwarding, failure: Failure, world: &World<'_>) -> Decision {
    let cause = match failure {
        Failure::Connect { refused: true } => Down::Refused,
        Failure::Connect { refused: false } => Down::Unresponsive,
        Failure::Broken {
            replayable,
            answered,
            timed_out,
            ..
        } if !replayable || answered || timed_out || f.at_most_once => {
            return Decision {
                next: Next::GiveUp,
                mark_down: None,
                rerouted: false,
            };
        }
        Failure::Broken {
            reused_connection: true,
            ..
        } => {
            return Decision {
                next: Next::SameAgain,
                mark_down: None,
                rerouted: false,
            };
        }
        Failure::Broken { .. } => Down::Refused,
    };
    reroute(f, cause, world)
}

/// Picks the next candidate after `f.peer` failed with `cause`: the route over the current
/// view, with the failed peer and every one found unreachable before counted as visited (and
/// the failed one as down), at most [`MAX_CONNECT_ATTEMPTS`] peers in all. When the route has
/// nobody left, the request goes once to this pod's own listener, where the body can be read (an
/// `initialize` with a stale session id starts a new session; a draining pod serves a new
/// session itself); the hop headers name the peers to skip. When that fails too, or this pod
/// was the one that failed: 404 `no_holder` for a session, 503 without. A session request whose
/// candidate did not connect in time (connection or TLS handshake) is 503 at once, wherever the
/// walk stood: the candidate may hold it, stalled by load, and a 404 from the pods after it would
/// make the client drop a session that survives.
fn reroute(f: &mut Forwarding, cause: Down, world: &World<'_>) -> Decision {
    let failed_self = f.peer.uid == world.me.uid;
    let mark_down = (!failed_self).then(|| (f.peer.uid.clone(), cause));
    f.unreachable.push(f.peer.uid.clone());
    let decided = |next| Decision {
        next,
        mark_down: mark_down.clone(),
        rerouted: true,
    };
    if cause == Down::Refused
        && !failed_self
        && f.session_id
            .as_deref()
            .and_then(world.replica_of)
            .is_some_and(|holder| holder == f.peer.uid)
    {
        // This pod keeps the session's replica and its holder refuses connections: it may be
        // restarting (it claims the session back) or lost (the replica is promoted here once
        // membership drops it). The pods after it know nothing of the session: 503, not 404.
        f.fallback = Some(Rejection::PeerUnavailable);
        return decided(Next::GiveUp);
    }
    if cause == Down::Unresponsive && f.target_home.is_some() && !failed_self {
        // A connection or TLS handshake not made in time: the peer may be the holder, slowed
        // down by load; the pods after it would answer 404 and the client drop the session.
        f.fallback = Some(Rejection::PeerUnavailable);
        return decided(Next::GiveUp);
    }
    let next = if failed_self || f.unreachable.len() >= MAX_CONNECT_ATTEMPTS {
        None
    } else {
        let hop = f.hop_so_far();
        let target = match (f.session_id.as_deref(), f.target_home) {
            (Some(id), Some(home)) => Target::Session {
                id,
                home,
                held: false,
            },
            (None, Some(home)) => Target::Issued { home },
            _ => Target::Placement { nonce: world.nonce },
        };
        let down = |uid: &str| match &mark_down {
            Some((failed, cause)) if failed == uid => Some(*cause),
            _ => (world.down)(uid),
        };
        match route(world.view, &world.me, target, &hop, &down) {
            Route::Forward { peer, kind } => Some((peer, kind)),
            Route::Unavailable => {
                f.fallback = Some(Rejection::PeerUnavailable);
                return decided(Next::GiveUp);
            }
            Route::Local | Route::NotFound(_) => None,
        }
    };
    match next {
        Some((peer, kind)) => {
            f.peer = peer;
            f.kind = kind;
            decided(Next::Retry)
        }
        None if !failed_self && !f.to_self => {
            f.peer = world.own.clone();
            f.kind = ForwardKind::Fallback;
            f.to_self = true;
            decided(Next::Retry)
        }
        None => {
            f.fallback = Some(match f.session_id {
                Some(_) => Rejection::SessionNotFound(NotFound::NoHolder),
                None => Rejection::PeerUnavailable,
            });
            decided(Next::GiveUp)
        }
    }
}

/// The answer to an exchange that failed with `error` before anything was written to the
/// client, when no decision set one: 413 for a body over `max_body_bytes`, 504 for a timeout,
/// 503 when a peer sidecar broke the exchange (it is stopping: the session lives on elsewhere,
/// so the client retries rather than blaming the MCP server) or no connection could be made
/// (the request never left), else 502 (it may have run).
pub(crate) fn failed_answer(
    error: &ErrorType,
    forwarded: bool,
    max_body_bytes: usize,
) -> Rejection {
    match error {
        ErrorType::HTTPStatus(413) => Rejection::PayloadTooLarge(max_body_bytes),
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            Rejection::UpstreamTimeout
        }
        _ if forwarded => Rejection::PeerUnavailable,
        ErrorType::ConnectRefused | ErrorType::ConnectNoRoute | ErrorType::ConnectError => {
            Rejection::UpstreamUnavailable
        }
        _ => Rejection::UpstreamLost,
    }
}

/// Whether `error` means the peer could not be connected to.
pub(crate) fn is_connect_error(error: &ErrorType) -> bool {
    matches!(
        error,
        ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectError
            | ErrorType::ConnectNoRoute
            | ErrorType::TLSHandshakeFailure
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::fixtures::peer;
    use crate::cluster::membership::{PeerState, Snapshot};

    const R: PeerState = PeerState::Routable;
    const D: PeerState = PeerState::Draining;
    const G: PeerState = PeerState::Gone;

    fn refused() -> Failure {
        Failure::Connect { refused: true }
    }

    fn connect_timeout() -> Failure {
        Failure::Connect { refused: false }
    }

    fn broken(replayable: bool, answered: bool, timed_out: bool, reused: bool) -> Failure {
        Failure::Broken {
            replayable,
            answered,
            timed_out,
            reused_connection: reused,
        }
    }

    /// One row: pod `a` (routable, or draining) forwards a request for a session homed on
    /// `home` (`None`: no session) to `to`; `failure` happens.
    struct Row {
        name: &'static str,
        pods: &'static [(&'static str, PeerState)],
        draining: bool,
        home: Option<&'static str>,
        to: &'static str,
        kind: ForwardKind,
        hops: u8,
        unreachable: &'static [&'static str],
        to_self: bool,
        down: &'static [(&'static str, Down)],
        failure: Failure,
        next: Next,
        /// The peer the request goes to next (for Retry/SameAgain).
        then: Option<&'static str>,
        fallback: Option<Rejection>,
        marked: Option<(&'static str, Down)>,
        /// A 2026-07-28 POST ([`Forwarding::at_most_once`]).
        at_most_once: bool,
        /// The holder of the replica this pod keeps of the session.
        replica_of: Option<&'static str>,
    }

    fn run(row: &Row) {
        let view = View::new(Snapshot {
            peers: row.pods.iter().map(|(u, s)| peer(u, *s)).collect(),
        });
        let own = peer("a", R);
        let down = |uid: &str| {
            row.down
                .iter()
                .find(|(u, _)| *u == uid)
                .map(|(_, cause)| *cause)
        };
        let world = World {
            view: &view,
            me: Me {
                uid: "a",
                home: HomeToken::for_pod("a"),
                draining: row.draining,
            },
            down: &down,
            own: &own,
            nonce: "n",
            replica_of: &|_: &str| row.replica_of.map(str::to_owned),
        };
        let mut hop = Hop::default();
        for i in 0..row.hops {
            hop = hop.next(&format!("entry-{i}"));
        }
        let mut f = Forwarding::new(
            peer(row.to, R),
            row.kind,
            hop,
            row.home.map(|_| "sess-1".to_owned()),
            row.home.map(HomeToken::for_pod),
        );
        f.unreachable = row.unreachable.iter().map(|u| (*u).to_owned()).collect();
        f.to_self = row.to_self;
        f.at_most_once = row.at_most_once;
        let decision = after_failure(&mut f, row.failure, &world);
        assert_eq!(decision.next, row.next, "{}: next", row.name);
        if let Some(then) = row.then {
            assert_eq!(f.peer.uid, then, "{}: next peer", row.name);
        }
        assert_eq!(f.fallback, row.fallback, "{}: answer", row.name);
        assert_eq!(
            decision.mark_down,
            row.marked.map(|(u, c)| (u.to_owned(), c)),
            "{}: marked down",
            row.name
        );
        if row.next == Next::Retry && row.then == Some("a") {
            assert!(f.to_self, "{}: sent back to this pod", row.name);
            assert_eq!(f.kind, ForwardKind::Fallback, "{}", row.name);
        }
    }

    fn row(name: &'static str) -> Row {
        Row {
            name,
            pods: &[("a", R), ("b", R), ("c", R)],
            draining: false,
            home: Some("b"),
            to: "b",
            kind: ForwardKind::Home,
            hops: 0,
            unreachable: &[],
            to_self: false,
            down: &[],
            failure: refused(),
            next: Next::Retry,
            then: None,
            fallback: None,
            marked: None,
            at_most_once: false,
            replica_of: None,
        }
    }

    #[test]
    fn forwarding_after_a_failure_follows_the_table() {
        let stateless = || Row {
            home: None,
            kind: ForwardKind::Placement,
            draining: true,
            at_most_once: true,
            ..row("")
        };
        let rows = [
            Row {
                name: "the holder of a session whose replica this pod keeps refuses: 503, never a walk to a 404",
                replica_of: Some("b"),
                next: Next::GiveUp,
                fallback: Some(Rejection::PeerUnavailable),
                marked: Some(("b", Down::Refused)),
                ..row("")
            },
            Row {
                name: "a replica of another holder's: the walk goes on",
                replica_of: Some("c"),
                then: Some("c"),
                marked: Some(("b", Down::Refused)),
                ..row("")
            },
            Row {
                name: "a 2026-07-28 POST whose peer refused the connection: placed on c",
                then: Some("c"),
                marked: Some(("b", Down::Refused)),
                ..stateless()
            },
            Row {
                name: "a 2026-07-28 POST broken on a fresh connection: given up, never sent twice",
                failure: broken(true, false, false, false),
                next: Next::GiveUp,
                ..stateless()
            },
            Row {
                name: "a 2026-07-28 POST broken on a pooled connection: given up as well",
                failure: broken(true, false, false, true),
                next: Next::GiveUp,
                ..stateless()
            },
            Row {
                then: Some("c"),
                marked: Some(("b", Down::Refused)),
                ..row("refused by the live home: marked down, the walk goes on to c")
            },
            Row {
                failure: connect_timeout(),
                next: Next::GiveUp,
                fallback: Some(Rejection::PeerUnavailable),
                marked: Some(("b", Down::Unresponsive)),
                ..row("connect timeout at the live home: it may be stalled, 503 and never 404")
            },
            Row {
                failure: broken(true, false, false, false),
                then: Some("c"),
                marked: Some(("b", Down::Refused)),
                ..row("broken before an answer on a fresh connection: the peer is stopping")
            },
            Row {
                failure: broken(true, false, false, true),
                next: Next::SameAgain,
                then: Some("b"),
                ..row("broken on a pooled connection: the same peer on a fresh one")
            },
            Row {
                failure: broken(true, false, true, false),
                next: Next::GiveUp,
                then: Some("b"),
                ..row("timed out: the peer may still run it, no retry (504)")
            },
            Row {
                failure: broken(true, true, false, false),
                next: Next::GiveUp,
                ..row("broken after part of the answer reached the client: no retry")
            },
            Row {
                failure: broken(false, false, false, false),
                next: Next::GiveUp,
                ..row("a body that cannot be sent again: no retry")
            },
            Row {
                hops: crate::cluster::routing::MAX_WALK_HOPS,
                then: Some("a"),
                marked: Some(("b", Down::Refused)),
                ..row("hop budget spent: nobody left, this pod answers through its listener")
            },
            Row {
                to_self: true,
                unreachable: &["c"],
                pods: &[("a", R), ("b", R), ("c", G)],
                next: Next::GiveUp,
                fallback: Some(Rejection::SessionNotFound(NotFound::NoHolder)),
                marked: Some(("b", Down::Refused)),
                ..row("own listener already tried, nobody left: 404 no_holder for a session")
            },
            Row {
                to: "a",
                to_self: true,
                kind: ForwardKind::Fallback,
                next: Next::GiveUp,
                fallback: Some(Rejection::SessionNotFound(NotFound::NoHolder)),
                ..row("this pod's own listener failed: never marked down, 404 no_holder")
            },
            Row {
                home: None,
                draining: true,
                to: "a",
                to_self: true,
                kind: ForwardKind::Fallback,
                next: Next::GiveUp,
                fallback: Some(Rejection::PeerUnavailable),
                ..row("no session and this pod's own listener failed: 503")
            },
            Row {
                home: None,
                draining: true,
                kind: ForwardKind::Placement,
                pods: &[("a", D), ("b", R), ("c", R)],
                then: Some("c"),
                marked: Some(("b", Down::Refused)),
                ..row("a placement refused: the next routable peer")
            },
            Row {
                unreachable: &["x", "y"],
                then: Some("a"),
                marked: Some(("b", Down::Refused)),
                ..row("three peers tried: no more candidates, this pod answers")
            },
            Row {
                home: Some("g"),
                to: "c",
                kind: ForwardKind::Moved,
                pods: &[("a", R), ("b", R), ("c", R)],
                down: &[("b", Down::Unresponsive)],
                next: Next::GiveUp,
                fallback: Some(Rejection::PeerUnavailable),
                marked: Some(("c", Down::Refused)),
                ..row("holder refused, the only other candidate stalled: 503, it may hold it")
            },
            Row {
                home: Some("g"),
                to: "c",
                kind: ForwardKind::Walk,
                failure: connect_timeout(),
                next: Next::GiveUp,
                fallback: Some(Rejection::PeerUnavailable),
                marked: Some(("c", Down::Unresponsive)),
                ..row("walk candidate stalled (home gone): 503, the pods after it would say 404")
            },
            Row {
                home: None,
                draining: true,
                kind: ForwardKind::Placement,
                pods: &[("a", D), ("b", R), ("c", R)],
                failure: connect_timeout(),
                then: Some("c"),
                marked: Some(("b", Down::Unresponsive)),
                ..row("a placement stalled: the next routable peer, no session to lose")
            },
            Row {
                home: Some("g"),
                to: "c",
                kind: ForwardKind::Moved,
                pods: &[("a", R), ("c", G)],
                then: Some("a"),
                marked: Some(("c", Down::Refused)),
                ..row("holder left membership: nobody to walk to, this pod answers (then 404)")
            },
            Row {
                home: Some("g"),
                to: "c",
                kind: ForwardKind::Walk,
                pods: &[("a", R), ("b", R), ("c", R)],
                down: &[("b", Down::Refused)],
                then: Some("a"),
                marked: Some(("c", Down::Refused)),
                ..row("walk candidate refused, the other one refused before: this pod answers")
            },
        ];
        for row in &rows {
            run(row);
        }
    }

    #[test]
    fn a_failed_exchange_is_answered_by_its_cause() {
        let cases = [
            (
                ErrorType::HTTPStatus(413),
                false,
                Rejection::PayloadTooLarge(9),
            ),
            (ErrorType::ConnectTimedout, true, Rejection::UpstreamTimeout),
            (ErrorType::ReadTimedout, false, Rejection::UpstreamTimeout),
            (ErrorType::WriteTimedout, true, Rejection::UpstreamTimeout),
            (
                ErrorType::ConnectionClosed,
                true,
                Rejection::PeerUnavailable,
            ),
            (
                ErrorType::ConnectRefused,
                false,
                Rejection::UpstreamUnavailable,
            ),
            (ErrorType::ConnectionClosed, false, Rejection::UpstreamLost),
        ];
        for (error, forwarded, expected) in cases {
            assert_eq!(failed_answer(&error, forwarded, 9), expected, "{error:?}");
        }
        assert!(is_connect_error(&ErrorType::ConnectRefused));
        assert!(!is_connect_error(&ErrorType::ReadTimedout));
    }
}
