//! Session handoff between sidecars: moving a session to its new holder when this pod drains,
//! or when a session adopted here follows `owner(S)` to another routable pod; following the
//! streams still running here ([`follow`]); and, with `migration: Pin` or `--handoff false`,
//! keeping sessions until [`Handoff::cut`] ends what still runs at the drain deadline. The steps
//! (moving, acknowledged, moved; the tail; the rebuild at the target) and the peer protocol:
//! `docs/design/handoff.md#moving-one-session`.

pub(crate) mod adopt;
mod decide;
#[cfg(test)]
pub(crate) mod fixtures;
mod follow;
#[cfg(fuzzing)]
pub(crate) mod fuzzing;
mod image;
pub(crate) mod listener;
pub(crate) mod metrics;
pub(crate) mod replication;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Semaphore;

use serde_json::Value;

use crate::broker::{Broker, CancelRelay, Here};
use crate::cluster::membership::{Peer, PeerState};
use crate::cluster::peer_health::Down;
use crate::cluster::routing::Router;
use crate::handoff::metrics::{HandoffFailure, HandoffMetrics};
use crate::lifecycle::Lifecycle;
use crate::mcp::jsonrpc::RequestKey;
use crate::peer::client::{Destination, PeerLink, SendError};
use crate::peer::wire::{CancelPush, Credentials, HeldAnswer, HeldQuery, SessionPush};
use crate::peer::{CANCEL_PATH, HELD_PATH, SESSIONS_PATH};
use crate::session::{Session, Transfer};
use decide::{AfterPush, Held};
use follow::Followed;

/// Sessions pushed at the same time.
pub(crate) const MAX_PARALLEL_MOVES: usize = 64;
/// Candidates tried for one session (the owner, then the next routable pods of `ranked(S)`).
pub(crate) const MAX_CANDIDATES: usize = 3;
/// Waits between attempts at one candidate.
pub(crate) const BACKOFF: [Duration; 2] = [Duration::from_millis(50), Duration::from_millis(250)];
/// How long a move waits for requests admitted before it to register their streams.
pub(crate) const ENTERING_WAIT: Duration = Duration::from_secs(2);
/// The range of the `retry:` hint given to clients whose stream closes because their session
/// moved (each stream draws its own, so the clients of a draining pod do not all reconnect in
/// the same millisecond).
pub(crate) const MOVED_RETRY_HINT: std::ops::Range<u64> = 100..500;
/// Most sessions one rebalancing round (`docs/design/handoff.md#adopted-sessions-follow-the-owner`,
/// every second) moves: following the owner is never urgent, so it is paced and does not pile onto
/// the work of a drain that starts when the same pod joins.
pub(crate) const REBALANCE_PER_ROUND: usize = 32;
/// Room kept in a message for everything but event data, in bytes.
const MESSAGE_OVERHEAD: usize = 256 * 1024;

/// Why a session did not move.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MoveError {
    /// A move of this session is already under way or done, or the session ended meanwhile.
    #[error("the session is already being moved, or ended")]
    Busy,
    /// No routable peer to move to.
    #[error("no routable peer")]
    NoTarget,
    /// Every candidate failed; the last error.
    #[error("every candidate failed, last: {0}")]
    Failed(SendError),
    /// A push got no answer and the target could not say whether it took the session: no other
    /// pod is tried (that could make two holders); the session stays here, at an epoch after
    /// the one in doubt.
    #[error("the target may hold the session; none other is tried")]
    InDoubt,
    /// A candidate holds the session at a later epoch (or handed it on since): the copy here is
    /// stale (a copy kept or taken back after another pod moved the session on). It is dropped
    /// and requests for it are sent to that candidate; no other pod is tried (that could make
    /// two holders).
    #[error("a peer holds the session at a later epoch; the copy here is dropped")]
    Superseded,
    /// The drain's deadline passed while the session waited for a push slot: it stays here, and
    /// the drain ends on time (a pod stopped past its grace period is killed mid-push).
    #[error("the drain's deadline passed before the session's turn")]
    Deadline,
}

/// Waits before each question whether a push in doubt was taken.
const CONFIRM_BACKOFF: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Sends cancellations to the pod running the request (a weak handle: no reference cycle with
/// the broker).
struct Relay(Weak<Handoff>);

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Relay")
    }
}

impl CancelRelay for Relay {
    fn relay(
        &self,
        writer: String,
        session: String,
        request: RequestKey,
        notification: Value,
        credentials: http::HeaderMap,
    ) {
        let Some(handoff) = self.0.upgrade() else {
            return;
        };
        let Some(peer) = handoff.router.view().peer(&writer).cloned() else {
            return;
        };
        let credentials = Credentials(
            credentials
                .iter()
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .collect(),
        );
        let push = CancelPush {
            from: handoff.router.uid().to_owned(),
            session,
            request,
            notification,
            credentials,
        };
        let Ok(body) = serde_json::to_vec(&push) else {
            return;
        };
        tokio::spawn(async move {
            let to = handoff.destination(&peer);
            if let Err(e) = handoff
                .client
                .post(to, CANCEL_PATH, Bytes::from(body))
                .await
            {
                tracing::warn!(peer = %peer.name, error = %e, "cannot relay a cancellation");
            }
        });
    }
}

/// The handoff machinery of one pod.
pub(crate) struct Handoff {
    broker: Arc<Broker>,
    router: Router,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<HandoffMetrics>,
    client: Arc<dyn PeerLink>,
    peer_port: u16,
    max_message_bytes: usize,
    enabled: bool,
    moves: Semaphore,
    /// How long the tail of a moved session is sent again while its new holder takes nothing
    /// (`spec.drain.timeout`).
    patience: Duration,
    /// How long a pod is routable before adopted sessions follow it, and the least time
    /// between two such moves of one session (`--rebalance-dwell`).
    dwell: Duration,
    /// The replicas peers keep here (`docs/design/replication.md`).
    replicas: replication::Replicas,
    /// What the replica pods have of the sessions held here.
    replicating: parking_lot::Mutex<replication::Replicating>,
    /// Notified when a request waits for its record to be kept: a replication round is due.
    replicate_now: tokio::sync::Notify,
    /// Claims of sessions back from their replica pod under way, by session id.
    claims: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Handoff {
    /// The handoff of `broker`'s pod: targets from `router`'s membership, messages through
    /// `client` (the signed [`crate::peer::client::PeerClient`] in production) to peers' listeners on
    /// `peer_port`, of at most `max_message_bytes`,
    /// tails retried for up to `patience` (`spec.drain.timeout`), adopted sessions following a new
    /// owner routable for `dwell`; `enabled` false never moves a session (`--handoff false`,
    /// `migration: Pin`) but still adopts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        broker: Arc<Broker>,
        router: Router,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<HandoffMetrics>,
        client: Arc<dyn PeerLink>,
        peer_port: u16,
        max_message_bytes: usize,
        enabled: bool,
        patience: Duration,
        dwell: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            router,
            lifecycle,
            metrics,
            client,
            peer_port,
            max_message_bytes,
            enabled,
            moves: Semaphore::new(MAX_PARALLEL_MOVES),
            patience,
            dwell,
            replicas: replication::Replicas::new(broker.retained().clone()),
            replicating: parking_lot::Mutex::default(),
            replicate_now: tokio::sync::Notify::new(),
            claims: parking_lot::Mutex::default(),
            broker,
        })
    }

    /// Installs this handoff as `broker`'s relay of cancellations for requests still running on
    /// the pod a session came from (`POST /v2/cancel`), and as its write-ahead wait (a request
    /// is dispatched once its replica pod keeps its record).
    pub(crate) fn attach_to_broker(self: &Arc<Self>) {
        self.broker
            .set_cancel_relay(Arc::new(Relay(Arc::downgrade(self))));
        self.broker
            .set_write_ahead(Arc::new(replication::Ahead(Arc::downgrade(self))));
    }

    /// Whether sessions are moved at all.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    fn peer_addr(&self, peer: &Peer) -> SocketAddr {
        SocketAddr::new(peer.address.ip(), peer.peer_port.unwrap_or(self.peer_port))
    }

    /// Where a message to `peer` goes.
    fn destination<'a>(&self, peer: &'a Peer) -> Destination<'a> {
        Destination {
            uid: &peer.uid,
            addr: self.peer_addr(peer),
        }
    }

    /// Where session `id` may go, best first: `owner(S)` over the preferred set, then routable
    /// pods in `ranked(S)` order; never this pod or a peer that is down.
    fn candidates(&self, id: &str) -> Vec<Peer> {
        let view = self.router.view();
        let now = Instant::now();
        let usable = |p: &Peer| {
            p.uid != self.router.uid()
                && p.state == PeerState::Routable
                && self.router.health().down(&p.uid, now).is_none()
        };
        let mut out: Vec<Peer> = Vec::with_capacity(MAX_CANDIDATES);
        for p in view.owner(id).into_iter().chain(view.ranked(id)) {
            if out.len() == MAX_CANDIDATES {
                break;
            }
            if usable(p) && !out.iter().any(|c| c.uid == p.uid) {
                out.push(p.clone());
            }
        }
        out
    }

    /// Moves `session` to a peer (module docs, steps 1–3); returns the new holder's UID. A move
    /// that gets its push slot only after `deadline` (a drain's) does not start.
    ///
    /// # Errors
    /// [`MoveError`]; the session then stays here, served as before.
    pub(crate) async fn move_session(
        self: &Arc<Self>,
        session: Arc<Session>,
        deadline: Option<Instant>,
    ) -> Result<String, MoveError> {
        let candidates = self.candidates(session.id());
        if candidates.is_empty() {
            self.metrics.handoff_failed(HandoffFailure::NoTarget);
            return Err(MoveError::NoTarget);
        }
        let _slot = self.moves.acquire().await;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            self.metrics.handoff_failed(HandoffFailure::Deadline);
            return Err(MoveError::Deadline);
        }
        // Dropped on every path that does not end in an acknowledgement: the session is then
        // served here again.
        let Some(transfer) = session.begin_move() else {
            return Err(MoveError::Busy);
        };
        let started = Instant::now();
        session.all_entered(ENTERING_WAIT).await;
        if !self.broker.holds(&session) {
            // A request that entered before the move ended the session (its DELETE): an ended
            // session is never pushed, or it would live on at the target.
            return Err(MoveError::Busy);
        }
        let budget = self
            .max_message_bytes
            .saturating_sub(MESSAGE_OVERHEAD)
            .max(1);
        let (snapshot, positions) = session.snapshot(budget);
        let mut push = SessionPush {
            from: self.router.uid().to_owned(),
            session: image::session_image(&snapshot),
        };
        let imaged = follow::imaged(&snapshot, &positions);
        let mut last = None;
        for target in candidates {
            // Each candidate gets a later epoch than any before: a copy an earlier attempt left
            // anywhere is stale against it.
            let epoch = session.advance_epoch();
            push.session.epoch = epoch;
            let body = match serde_json::to_vec(&push) {
                Ok(body) => Bytes::from(body),
                Err(e) => {
                    return Err(MoveError::Failed(SendError::Unreachable(e.to_string())));
                }
            };
            match self.push_to(&target, &body, session.id(), epoch).await {
                Ok(()) => {
                    self.moved(transfer, &target, imaged, started);
                    return Ok(target.uid);
                }
                Err(MoveError::Superseded) => {
                    tracing::warn!(session = session.digest(), peer = %target.name, "a peer holds the session at a later epoch; the copy here is dropped");
                    self.metrics.handoff_failed(HandoffFailure::Superseded);
                    self.superseded(transfer, &target.uid).await;
                    return Err(MoveError::Superseded);
                }
                Err(MoveError::Failed(e)) => {
                    tracing::warn!(session = session.digest(), peer = %target.name, error = %e, "handoff to peer failed");
                    self.metrics.handoff_failed(HandoffFailure::from(&e));
                    last = Some(e);
                }
                Err(e) => {
                    tracing::warn!(session = session.digest(), peer = %target.name, error = %e, "handoff to peer in doubt; the session stays here");
                    self.metrics.handoff_failed(HandoffFailure::InDoubt);
                    return Err(e);
                }
            }
        }
        Err(last.map_or(MoveError::NoTarget, MoveError::Failed))
    }

    /// The session of `transfer` is held by `holder` at a later epoch: the copy here is
    /// dropped and requests for it are sent there.
    async fn superseded(&self, transfer: Transfer, holder: &str) {
        let session = Arc::clone(transfer.session());
        transfer.moved(holder.to_owned());
        self.broker.mark_moved(&session, holder);
        self.broker.release_departed(&session, None).await;
    }

    /// Pushes the body of session `session` (at `epoch`) to one peer, retrying transient
    /// failures with backoff ([`decide::after_push`]). A push that may have arrived but got no
    /// valid answer is settled by asking the peer whether it took the session
    /// ([`Handoff::confirm`]) before another pod is tried.
    ///
    /// # Errors
    /// [`MoveError::Failed`] when the peer did not take it (another may be tried);
    /// [`MoveError::Superseded`] when it holds the session at a later epoch;
    /// [`MoveError::InDoubt`] when nobody can say.
    async fn push_to(
        &self,
        target: &Peer,
        body: &Bytes,
        session: &str,
        epoch: u64,
    ) -> Result<(), MoveError> {
        let to = self.destination(target);
        let mut attempt = 0;
        loop {
            let error = match self.client.post(to, SESSIONS_PATH, body.clone()).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            match decide::after_push(&error, attempt, &BACKOFF) {
                AfterPush::Again(pause) => {
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                AfterPush::Superseded => return Err(MoveError::Superseded),
                AfterPush::NextCandidate { down } => {
                    if down {
                        self.router
                            .health()
                            .mark_down(&target.uid, Down::Refused, Instant::now());
                    }
                    return Err(MoveError::Failed(error));
                }
                AfterPush::Ask => {
                    return match self.confirm(to, session, epoch).await {
                        Some(true) => {
                            tracing::info!(peer = %target.name, "a push without an answer was taken");
                            Ok(())
                        }
                        Some(false) => Err(MoveError::Failed(error)),
                        None => Err(MoveError::InDoubt),
                    };
                }
            }
        }
    }

    /// Asks `to` whether it took `session` at `epoch` (`POST /v2/held`), a few times
    /// ([`decide::after_question`]): its acknowledged answer; `Some(false)` when it cannot be
    /// reached (a pod that accepts no connection holds nothing) or does not acknowledge (it is
    /// no peer); `None` when it never answers.
    async fn confirm(&self, to: Destination<'_>, session: &str, epoch: u64) -> Option<bool> {
        let query = HeldQuery {
            from: self.router.uid().to_owned(),
            session: session.to_owned(),
            epoch,
        };
        let body = Bytes::from(serde_json::to_vec(&query).ok()?);
        let mut reached = false;
        for pause in CONFIRM_BACKOFF {
            tokio::time::sleep(pause).await;
            let outcome = self
                .client
                .ask(to, HELD_PATH, body.clone())
                .await
                .map(|answer| {
                    serde_json::from_slice::<HeldAnswer>(&answer)
                        .ok()
                        .map(|a| a.held)
                });
            match decide::after_question(&outcome) {
                Held::Known(held) => return Some(held),
                Held::InDoubt => return None,
                Held::Unknown { reached: r } => reached |= r,
            }
        }
        decide::never_answered(reached)
    }

    /// The target acknowledged: forward requests there, close ≥ 2025-11-25 readers with
    /// `retry:`, follow the streams still running.
    fn moved(
        self: &Arc<Self>,
        transfer: Transfer,
        target: &Peer,
        imaged: HashMap<crate::mcp::cursor::StreamKey, follow::Sent>,
        started: Instant,
    ) {
        let session = Arc::clone(transfer.session());
        transfer.moved(target.uid.clone());
        self.broker.mark_moved(&session, &target.uid);
        self.metrics.handoff_took(started.elapsed());
        tracing::info!(session = session.digest(), to = %target.name, "session handed off");
        if session.primes() {
            for stream in session.streams() {
                let hint = Duration::from_millis(rand::random_range(MOVED_RETRY_HINT));
                stream.close_readers_for_move(hint);
            }
        }
        let handoff = Arc::clone(self);
        let target = target.clone();
        tokio::spawn(async move {
            match follow::follow(&handoff, &session, &target, imaged).await {
                Followed::Done => {
                    // While this pod drains it keeps the copy: should the new holder leave, the
                    // session is pushed again instead of lost.
                    let keep = handoff
                        .lifecycle
                        .is_draining()
                        .then_some(target.uid.as_str());
                    handoff.broker.release_departed(&session, keep).await;
                }
                Followed::HolderLost => {
                    tracing::warn!(session = session.digest(), peer = %target.name, "the new holder left or lost the session; pushing it again");
                    handoff.push_again(session.id(), &target.uid).await;
                }
                Followed::Ended => {
                    // The client ended it there (or it expired): it ends here too.
                    tracing::info!(session = session.digest(), peer = %target.name, "the session ended at its new holder");
                    handoff.broker.release_departed(&session, None).await;
                }
                Followed::GaveUp => {
                    // Its calls still run here: the upstream session stays until the pod
                    // stops (the drain's cut ends what is left).
                    tracing::warn!(session = session.digest(), peer = %target.name, "tail forwarding stopped");
                    handoff.metrics.handoff_failed(HandoffFailure::Tail);
                }
                Followed::Reclaimed => {}
            }
        });
    }

    /// Takes back session `id`, handed off from here to `lost`, which is gone, and moves it to
    /// another pod (at a later epoch); `false` when this pod has no copy of it, or moved it on
    /// from `lost` already.
    pub(crate) async fn push_again(self: &Arc<Self>, id: &str, lost: &str) -> bool {
        if !self.broker.reclaim(id, lost) {
            return false;
        }
        // Counted whichever found the holder gone: the rebalance, or a request for the session.
        self.metrics.handoff_failed(HandoffFailure::HolderLost);
        let Some(session) = self.broker.held(id) else {
            return true;
        };
        if let Err(e) = self.move_session(session, None).await {
            tracing::warn!(error = %e, "a session taken back could not move; it is served here");
        }
        true
    }

    /// Whether the pod `uid` that took a session from here is gone: out of membership, or its
    /// address refuses connections.
    fn holder_gone(&self, uid: &str) -> bool {
        let alive = self
            .router
            .view()
            .peer(uid)
            .is_some_and(|p| p.state.is_alive());
        !alive || self.router.health().down(uid, Instant::now()) == Some(Down::Refused)
    }

    /// Moves every session held here, in parallel (bounded), until none is left, none can move,
    /// or `deadline`. Returns how many moved and how many could not.
    pub(crate) async fn move_all(self: &Arc<Self>, deadline: Instant) -> (usize, usize) {
        let (mut moved, mut failed) = (0, 0);
        if !self.enabled {
            return (moved, failed);
        }
        loop {
            let sessions = self.broker.sessions();
            if sessions.is_empty() || Instant::now() >= deadline {
                return (moved, failed);
            }
            let tasks: Vec<_> = sessions
                .into_iter()
                .map(|s| {
                    let h = Arc::clone(self);
                    tokio::spawn(async move { h.move_session(s, Some(deadline)).await })
                })
                .collect();
            let mut progress = false;
            for task in tasks {
                match task.await {
                    Ok(Ok(_) | Err(MoveError::Superseded)) => {
                        moved += 1;
                        progress = true;
                    }
                    Ok(Err(MoveError::Busy)) => {}
                    _ => failed += 1,
                }
            }
            if !progress {
                return (moved, failed);
            }
        }
    }

    /// Sessions handed off whose streams are still being forwarded.
    pub(crate) fn following(&self) -> usize {
        self.broker.departed_count()
    }

    /// Ends every request still running here (held or handed-off sessions) with a JSON-RPC
    /// error (`data.reason` = `drain_deadline`); returns how many.
    pub(crate) fn cut(&self) -> u64 {
        let mut cut = 0;
        for session in self
            .broker
            .sessions()
            .into_iter()
            .chain(self.broker.departed())
        {
            for stream in session.streams() {
                let pending = stream.pending();
                if pending.is_empty() {
                    continue;
                }
                stream.fail_pending(
                    &pending,
                    "the pod stopped before the request finished",
                    "drain_deadline",
                );
                cut += pending.len() as u64;
            }
        }
        self.metrics.requests_cut(cut);
        cut
    }

    /// Adopted sessions follow the owner
    /// (`docs/design/handoff.md#adopted-sessions-follow-the-owner`): sessions adopted here whose
    /// home is gone move to `owner(S)` when that is another routable pod, at most
    /// [`REBALANCE_PER_ROUND`] per call (the rest in the next rounds), and none while a peer
    /// drains. Also ends followed streams whose writer died, and expires replicas.
    pub(crate) async fn rebalance(self: &Arc<Self>) {
        let view = self.router.view();
        let now = Instant::now();
        self.metrics.membership_age(self.router.membership_age(now));
        let alive = |uid: &str| {
            view.peer(uid).is_some_and(|p| p.state.is_alive())
                && self.router.health().down(uid, now) != Some(Down::Refused)
        };
        adopt::abandon_orphans(&self.broker, &alive);
        self.expire_replicas(now);
        for (session, lost) in self.broker.kept_lost(&|uid| self.holder_gone(uid)) {
            tracing::warn!(
                session = session.digest(),
                "the pod a session was handed to left; pushing it again"
            );
            let h = Arc::clone(self);
            tokio::spawn(async move { h.push_again(session.id(), &lost).await });
        }
        // A drain's handoffs come first: while a peer drains, its pushes go to the pods these
        // sessions would follow, which have no time to spare.
        if !self.enabled || self.lifecycle.is_draining() || view.count(PeerState::Draining) > 0 {
            return;
        }
        let mut tasks = Vec::new();
        for session in self.broker.sessions() {
            let Ok((home, Here::Held(_))) = self.broker.locate(session.id()) else {
                continue;
            };
            // Home sessions never move while their home lives; a session whose streams still
            // follow the pod that handed it here moves once they are complete.
            if view.home(&home).is_some_and(|h| h.state.is_alive())
                || session.streams().iter().any(|s| s.following().is_some())
            {
                continue;
            }
            // Hysteresis: a pod that just became routable (it may flap) is not followed yet, and
            // a session that just arrived does not move again.
            let settled = |uid: &str| view.is_settled(uid);
            if now.saturating_duration_since(session.arrived()) < self.dwell {
                continue;
            }
            let owner = view.owner(session.id());
            if owner.is_some_and(|o| o.uid != self.router.uid() && alive(&o.uid) && settled(&o.uid))
            {
                let h = Arc::clone(self);
                tasks.push(tokio::spawn(
                    async move { h.move_session(session, None).await },
                ));
                if tasks.len() == REBALANCE_PER_ROUND {
                    break;
                }
            }
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}
