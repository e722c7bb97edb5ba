//! Replication (`docs/design/replication.md`), the replica pod's side: the replicas holders
//! send are kept ([`Handoff::keep_replicas`], `POST /v2/replicas`); a request for a session
//! this pod does not hold promotes the replica kept here once its holder is gone, and a pod
//! that lost a session it held (its sidecar restarted) claims it back from its replica pod
//! ([`Handoff::recover`], `POST /v2/claim`, answered by [`Handoff::hand_back`]). Either way
//! the session is taken at the replica's epoch plus one, and each request that was running on
//! the lost holder ends with a JSON-RPC error (`data.reason` = `holder_lost`).

mod carry;
pub(crate) mod decide;
#[cfg(test)]
mod holder_tests;
mod send;
mod store;
#[cfg(test)]
mod tests;
mod write_ahead;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tether_crds::Replication;

use super::metrics::TakeOver;
use super::{Handoff, image};
use crate::cluster::membership::Peer;
use crate::mcp::home::HomeToken;
use crate::peer::CLAIM_PATH;
use crate::peer::hop::Hop;
use crate::peer::wire::{ClaimAnswer, ClaimQuery, ReplicaOutcome, ReplicasAnswer, ReplicasPush};
use crate::session::Session;
use crate::stream::WriterLost;
use decide::{Absent, Here};
pub(crate) use send::{INTERVAL, Replicating};
pub(crate) use store::Replicas;
use store::Taken;
pub(crate) use write_ahead::Ahead;

/// How long a claim waits for the replica pod's answer; without one the request is routed as
/// before replication (a session nobody else holds is 404).
const CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Most pods one claim asks.
const MAX_CLAIMED: usize = 3;

/// The gates of the promotions and claims under way, by session id.
type Gates = parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// One request's handle on the gate of a session's promotion or claim; when the last handle
/// goes — done, or its request cancelled — the gate leaves the table.
struct Gate<'a> {
    gates: &'a Gates,
    id: &'a str,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> Gate<'a> {
    fn join(gates: &'a Gates, id: &'a str, gate: Arc<tokio::sync::Mutex<()>>) -> Self {
        Self { gates, id, gate }
    }

    /// Waits for the turn: the promotion or claim under way is done.
    async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.gate.lock().await
    }
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        let mut gates = self.gates.lock();
        // Nobody else holds it (the table's handle and this one): the gate goes.
        if Arc::strong_count(&self.gate) == 2 {
            gates.remove(self.id);
        }
    }
}

/// What became of a request for a session this pod neither holds nor handed off.
#[derive(Debug)]
pub(crate) enum Recovered {
    /// The session is held here now (promoted or claimed back): enter it.
    Held,
    /// Its replica pod holds it: forward the request there.
    At(Peer),
    /// 503 + `Retry-After`: its holder may be lost without membership knowing yet.
    Unavailable,
    /// Nothing to recover: route it as any request.
    Route,
}

impl Handoff {
    /// Drops the replicas their holder did not send for the session idle timeout (a holder
    /// sends each of its sessions again far more often); counts what stays.
    pub(crate) fn expire_replicas(&self, now: std::time::Instant) {
        let dropped = self.replicas.expire(now, self.broker.cfg().idle_timeout);
        if dropped > 0 {
            tracing::debug!(dropped, "replicas expired");
        }
        self.metrics.replicas(self.replicas.len());
    }

    /// The holder of the replica of session `id` kept here, if one is.
    pub(crate) fn replica_holder(&self, id: &str) -> Option<String> {
        self.replicas.holder(id)
    }

    /// Keeps the replicas `push` carries and drops those it names.
    pub(crate) fn keep_replicas(&self, push: ReplicasPush) -> ReplicasAnswer {
        let now = std::time::Instant::now();
        // A replica is promoted once its holder is absent from this pod's membership: one of a
        // holder this pod does not know yet would be promoted at once.
        let member = self
            .router
            .view()
            .peer(&push.from)
            .is_some_and(|p| p.state.is_alive());
        for drop in &push.drops {
            self.replicas
                .drop_replica(&push.from, &drop.session, drop.epoch);
        }
        let results = push
            .replicas
            .into_iter()
            .map(|update| {
                let image = &update.image;
                if self.broker.genuine(&image.id).is_none() {
                    ReplicaOutcome::Invalid
                } else if self.broker.held(&image.id).is_some_and(|s| !s.is_moving()) {
                    // Held here (handed here, or promoted): the sender's copy is the stale one.
                    ReplicaOutcome::StaleEpoch
                } else if self.lifecycle.is_draining() {
                    // Also a session this pod is moving to the sender: the sender adopted it
                    // and replicates it before the move is acknowledged here.
                    ReplicaOutcome::Draining
                } else if self.broker.ended_here(&image.id) {
                    ReplicaOutcome::Ended
                } else if self.broker.took(&image.id, image.epoch.saturating_add(1)) {
                    // Held here (or handed on from here) at a later epoch: the sender's copy
                    // is the stale one.
                    ReplicaOutcome::StaleEpoch
                } else if !member {
                    ReplicaOutcome::NotMember
                } else {
                    self.replicas.keep(&push.from, update, now)
                }
            })
            .collect();
        ReplicasAnswer {
            results,
            incarnation: self.replicas.incarnation(),
        }
    }

    /// Answers a restarted holder's claim: the replica it sent, which it takes back, or that
    /// this pod holds the session itself.
    pub(crate) fn hand_back(&self, query: &ClaimQuery) -> ClaimAnswer {
        if self.broker.held(&query.session).is_some() {
            return ClaimAnswer {
                session: None,
                held: true,
            };
        }
        let session = self
            .replicas
            .take(&query.session, |holder| holder == query.from)
            .map(|taken| taken.image);
        if session.is_some() {
            tracing::info!(
                session = self.broker.log_digest(&query.session),
                holder = %query.from,
                "replica handed back to its restarted holder"
            );
            return ClaimAnswer {
                session,
                held: false,
            };
        }
        // Another pod asks (the session lives there now: its owner once the holder is gone):
        // the replica is promoted here, and that pod sends the session's requests here.
        let view = self.router.view();
        let gone = |holder: &str| decide::left(&view, holder);
        let held = self
            .replicas
            .take(&query.session, gone)
            .is_some_and(|taken| self.take_over(taken, TakeOver::Promoted));
        ClaimAnswer {
            session: None,
            held,
        }
    }

    /// Recovers session `id`, homed on the pod of `home`, which this pod neither holds nor
    /// handed off, for a request that came with `hop` ([`decide::absent`]).
    pub(crate) async fn recover(&self, id: &str, home: HomeToken, hop: &Hop) -> Recovered {
        let replica_of = self.replicas.holder(id);
        // A promotion or claim of the session under way here (looked for after the replica:
        // one that took it since holds the gate until the session is registered): what it took
        // is entered once it is done.
        let under_way = self.claims.lock().get(id).cloned();
        if let Some(gate) = under_way {
            let gate = Gate::join(&self.claims, id, gate);
            drop(gate.turn().await);
            drop(gate);
            if self.broker.held(id).is_some() {
                return Recovered::Held;
            }
        }
        let view = self.router.view();
        let here = Here {
            uid: self.router.uid(),
            home: home == self.router.me(false).home,
            home_alive: view.home(&home).is_some_and(|p| p.state.is_alive()),
            replicating: self.broker.cfg().replication != Replication::None,
        };
        let now = std::time::Instant::now();
        let down = |uid: &str| self.router.health().down(uid, now);
        match decide::absent(here, id, replica_of.as_deref(), &view, hop, &down) {
            Absent::Promote => {
                self.one_at_a_time(id, async {
                    let gone = |holder: &str| decide::left(&view, holder);
                    let taken = self.replicas.take(id, gone);
                    if taken.is_some_and(|taken| self.take_over(taken, TakeOver::Promoted)) {
                        Recovered::Held
                    } else {
                        Recovered::Route
                    }
                })
                .await
            }
            Absent::Claim(pod) => self.one_at_a_time(id, self.ask_around(id, pod)).await,
            Absent::Unavailable => Recovered::Unavailable,
            Absent::Route => Recovered::Route,
        }
    }

    /// Runs `take` (a promotion, or a claim of the session back from its replica pod) unless
    /// the session is held here by then: concurrent requests for session `id` wait for the
    /// first one's, so the replica is taken once and none of them finds the session absent
    /// meanwhile.
    async fn one_at_a_time(&self, id: &str, take: impl Future<Output = Recovered>) -> Recovered {
        let gate = Arc::clone(self.claims.lock().entry(id.to_owned()).or_default());
        let gate = Gate::join(&self.claims, id, gate);
        let _turn = gate.turn().await;
        if self.broker.held(id).is_some() {
            Recovered::Held
        } else {
            take.await
        }
    }

    /// Claims session `id` from `pod`, its replica pod as placed in this pod's view, then from
    /// the other pods of its routing walk ([`MAX_CLAIMED`] in all): the replica may have been
    /// placed in a view without this pod (a replacement that joined since).
    async fn ask_around(&self, id: &str, pod: Peer) -> Recovered {
        let view = self.router.view();
        let me = self.router.uid();
        let others = view
            .walk(id)
            .filter(|p| p.uid != me && p.uid != pod.uid && p.state.is_alive())
            .cloned()
            .collect::<Vec<_>>();
        for peer in std::iter::once(pod).chain(others).take(MAX_CLAIMED) {
            match self.ask_back(id, peer).await {
                Recovered::Route => continue,
                found => return found,
            }
        }
        Recovered::Route
    }

    /// One claim of session `id` from `pod`.
    async fn ask_back(&self, id: &str, pod: Peer) -> Recovered {
        let query = ClaimQuery {
            from: self.router.uid().to_owned(),
            session: id.to_owned(),
        };
        let Ok(body) = serde_json::to_vec(&query) else {
            return Recovered::Route;
        };
        let ask = self
            .client
            .ask(self.destination(&pod), CLAIM_PATH, Bytes::from(body));
        let answer = tokio::time::timeout(CLAIM_TIMEOUT, ask)
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|answer| serde_json::from_slice::<ClaimAnswer>(&answer).ok());
        match answer {
            Some(ClaimAnswer { held: true, .. }) => Recovered::At(pod),
            Some(ClaimAnswer {
                session: Some(image),
                ..
            }) => {
                let taken = Taken {
                    holder: self.router.uid().to_owned(),
                    image,
                };
                if self.take_over(taken, TakeOver::Claimed) {
                    Recovered::Held
                } else {
                    Recovered::Route
                }
            }
            None | Some(ClaimAnswer { session: None, .. }) => Recovered::Route,
        }
    }

    /// A replica pod holds `session` at a later epoch (it answered a replica `stale_epoch`:
    /// it promoted the session while this pod was thought lost): the copy here is dropped and
    /// requests for it are sent there. Nothing happens while a move of it is under way.
    async fn supersede(&self, session: Arc<Session>, holder: &str) {
        let Some(transfer) = session.begin_move() else {
            return;
        };
        tracing::warn!(
            session = session.digest(),
            holder,
            "a replica pod holds the session at a later epoch; the copy here is dropped"
        );
        self.superseded(transfer, holder).await;
    }

    /// Holds the session of a replica taken out of a store (here or at the replica pod) at
    /// its epoch plus one; the requests that were running on its holder end with
    /// `holder_lost`. Whether it is held here now.
    fn take_over(&self, taken: Taken, how: TakeOver) -> bool {
        let Taken { holder, mut image } = taken;
        let Some(genuine) = self.broker.genuine(&image.id) else {
            return false;
        };
        image.epoch = image.epoch.saturating_add(1);
        let restored = image::restore_session(
            &image,
            genuine.key,
            &holder,
            self.broker.buffer_limits(),
            self.broker.retained(),
        );
        let session = match restored {
            Ok(session) => session,
            Err(why) => {
                tracing::warn!(session = self.broker.log_digest(&image.id), %why, "unusable replica");
                return false;
            }
        };
        if self
            .broker
            .adopt_session(std::sync::Arc::clone(&session))
            .is_err()
        {
            return false;
        }
        let mut interrupted = 0;
        for stream in session.streams() {
            if stream.following().is_some() {
                stream.abandon_following(WriterLost::Holder);
                interrupted += 1;
            }
        }
        self.metrics.replica_taken_over(how);
        tracing::info!(
            session = session.digest(),
            how = how.label(),
            holder = %holder,
            epoch = session.epoch(),
            interrupted,
            "session taken over from its replica"
        );
        true
    }
}
