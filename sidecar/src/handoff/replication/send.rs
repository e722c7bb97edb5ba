//! Replication, the holder's side (`docs/design/replication.md#keeping-a-replica-current`).
//!
//! Every [`INTERVAL`] ([`Handoff::replicate`]) the holder looks at the sessions held here whose
//! replica may be out of date: those whose change feed told of a change since, a session new
//! here, one whose retry pause is over, and every session once per [`SCAN_EVERY`] intervals and
//! whenever membership changed. It sends each whose replica mark
//! ([`crate::session::Session::replica_mark`]) changed, whose replica pod changed, or whose
//! replica was not sent for a third of the idle timeout (the replica pod drops a replica not
//! sent for the idle timeout), to its replica pod ([`decide::replica_pod`]) — one message per
//! replica pod and round — and tells a pod that keeps a copy no longer wanted (the session
//! ended or moved away, or its replica pod is another now) to drop it, every round until it
//! answers ([`Replicating::unacked`]). A session goes as the
//! change since the copy its replica pod acknowledged (what that copy holds is [`Shipped`]:
//! only new or changed streams, new retry records, and what was forgotten), or whole when that
//! copy is not known: new here, another replica pod, or the last send not kept. Every pod
//! keeping a replica gets a message at least once per scan (empty when nothing changed): an
//! answer from another incarnation of its replica store than before means its sidecar
//! restarted, and every session placed there goes again, whole ([`Replicating::answered_by`]).
//!
//! What the holder knows of one session's replica ([`Replica`]; [`plan`] and [`after`] are its
//! pure steps, the round is the I/O shell):
//!
//! ```text
//!              send: kept                   mark changed · refresh due · another replica pod
//!   Unplaced ───────────────▶ Current ───────────────────────────────────────▶ send again
//!      ▲                       │  ▲
//!      │ no replica pod: drop  │  │ send: kept
//!      └───────────────────────┤  │
//!                              ▼  │
//!              send: refused or unanswered ──▶ Retrying (pause 50 ms, doubling to 2 s)
//! ```
//!
//! A replica pod that answers `stale_epoch` holds the session at a later epoch (it promoted
//! it while this pod was thought lost): the copy here is stale, and requests for it are sent
//! there ([`Handoff::supersede`]). When the pod's drain ends, every replica it placed is dropped
//! and none is sent again ([`Handoff::withdraw_replicas`]): what stays ends with the pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tether_crds::Replication;

use super::carry;
use super::decide;
use super::write_ahead::{Standing, Waiting};
use crate::cluster::membership::{Peer, View};
use crate::handoff::metrics::ReplicaSent;
use crate::handoff::{Handoff, MESSAGE_OVERHEAD, image};
use crate::mcp::jsonrpc::RequestKey;
use crate::peer::REPLICAS_PATH;
use crate::peer::wire::{ReplicaDrop, ReplicaOutcome, ReplicaUpdate, ReplicasAnswer, ReplicasPush};
use crate::retained::{Charge, Kind};
use crate::session::{Session, Shipped, ShippedChange, Subscription};

/// The replication interval: how long changes gather before they are sent.
pub(crate) const INTERVAL: Duration = Duration::from_millis(50);
/// Every this many intervals every session held here is looked at, changed or not (a replica
/// due for its refresh, a stream forgotten by the retry window, which its feed does not tell).
pub(super) const SCAN_EVERY: u64 = 20;
/// Longest pause before a refused or unanswered replica is sent again.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// How long a round waits for a replica pod's answers: one that does not answer in time (it
/// may be gone without membership knowing yet) holds up no other.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What the holder knows of one session's replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Replica {
    /// No replica acknowledged: the session is new here, or has no replica pod.
    Unplaced,
    /// `pod` keeps the replica of mark `mark`, sent at `sent`.
    Current {
        pod: String,
        mark: u64,
        sent: Instant,
    },
    /// The last send to `pod` was refused or not answered (it may keep an earlier copy): sent
    /// again from `until`; `pause` doubles up to [`MAX_PAUSE`].
    Retrying {
        pod: String,
        until: Instant,
        pause: Duration,
    },
}

impl Replica {
    /// The pod that keeps, or may keep, a copy sent from here.
    fn kept_at(&self) -> Option<&str> {
        match self {
            Self::Unplaced => None,
            Self::Current { pod, .. } | Self::Retrying { pod, .. } => Some(pod),
        }
    }
}

/// What to do with one session's replica this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Nothing.
    Keep,
    /// Send the session to `to` (a change, or whole); tell `drop_at` (its previous replica pod)
    /// to drop its copy.
    Send { to: String, drop_at: Option<String> },
    /// Tell `at` to drop its copy: the session has no replica pod now.
    Drop { at: String },
}

/// What to do with a session whose replica is `replica`, whose replica pod is `target` now and
/// whose replica mark is `mark`, at `now`; a replica is sent again after `refresh` at the latest.
pub(super) fn plan(
    replica: &Replica,
    target: Option<&str>,
    mark: u64,
    now: Instant,
    refresh: Duration,
) -> Plan {
    let due = match replica {
        Replica::Unplaced => true,
        Replica::Current { mark: m, sent, .. } => {
            *m != mark || now.saturating_duration_since(*sent) >= refresh
        }
        Replica::Retrying { until, .. } => now >= *until,
    };
    let at = replica.kept_at();
    match target {
        None => at.map_or(Plan::Keep, |at| Plan::Drop { at: at.to_owned() }),
        Some(to) if at.is_some_and(|at| at != to) => Plan::Send {
            to: to.to_owned(),
            drop_at: at.map(str::to_owned),
        },
        Some(to) if due => Plan::Send {
            to: to.to_owned(),
            drop_at: None,
        },
        Some(_) => Plan::Keep,
    }
}

/// The replica after a send of mark `mark` to `to` at `now` was answered `outcome` (`None`: no
/// acknowledged answer).
pub(super) fn after(
    replica: &Replica,
    to: &str,
    mark: u64,
    outcome: Option<ReplicaOutcome>,
    now: Instant,
) -> Replica {
    if outcome == Some(ReplicaOutcome::Kept) {
        return Replica::Current {
            pod: to.to_owned(),
            mark,
            sent: now,
        };
    }
    let pause = match replica {
        Replica::Retrying { pod, pause, .. } if pod == to => (*pause * 2).min(MAX_PAUSE),
        _ => INTERVAL,
    };
    Replica::Retrying {
        pod: to.to_owned(),
        until: now + pause,
        pause,
    }
}

/// One session held here, as the replicator follows it.
struct Tracked {
    session: Arc<Session>,
    changes: Subscription,
    replica: Replica,
    /// What the replica pod's copy holds, when it acknowledged the last send (`Current`): the
    /// next send is the change since; without, the session is sent whole.
    shipped: Option<Shipped>,
    /// [`Shipped`]'s bytes, in `tether_retained_bytes{kind="replicas"}`.
    charge: Charge,
    /// Looked at this round whatever its feed says (new here).
    fresh: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.session.unfollow_replica();
    }
}

impl Tracked {
    /// Records what the replica pod holds now (`None`: not known).
    fn shipped(&mut self, shipped: Option<Shipped>) {
        self.charge
            .resize(shipped.as_ref().map_or(0, Shipped::bytes));
        self.shipped = shipped;
    }
}

/// The holder's replication state: every session held here and what its replica pod has.
#[derive(Default)]
pub(crate) struct Replicating {
    tracked: HashMap<String, Tracked>,
    view: Option<Arc<View>>,
    /// Rounds begun, and those of them the interval started (every [`SCAN_EVERY`]th of those
    /// is a scan).
    rounds: u64,
    ticks: u64,
    /// Whether the sessions' feeds are followed for their events too (`replication: Events`).
    events: bool,
    /// The incarnation of each replica pod's store, as its last answer gave it.
    incarnations: HashMap<String, u64>,
    /// The pod's drain ended: nothing is replicated any more ([`Handoff::withdraw_replicas`]).
    withdrawn: bool,
    /// The drops no replica pod acknowledged yet, by replica pod: each goes again every round
    /// until a message carrying it is answered — a copy of a session that ended here must not
    /// be promoted, nor make its replica pod answer 503 for it — its pod leaves the view, or
    /// the idle timeout passed (the replica pod has expired the copy itself by then).
    unacked: HashMap<String, Vec<PendingDrop>>,
    /// [`Replicating::unacked`]'s bytes, in `tether_retained_bytes{kind="replicas"}`.
    unacked_charge: Option<Charge>,
    /// Requests waiting for their records to be kept before they are dispatched.
    pub(super) waiting: Waiting,
}

/// A drop on its way to a replica pod, written at `since`.
#[derive(Clone, Debug)]
struct PendingDrop {
    drop: ReplicaDrop,
    since: Instant,
}

impl PendingDrop {
    /// Bytes it holds, as counted.
    fn bytes(&self) -> u64 {
        (self.drop.session.len() + std::mem::size_of::<Self>()) as u64
    }
}

impl Replicating {
    /// Rounds begun.
    pub(super) fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Whether the pod's drain ended (nothing is replicated any more).
    pub(super) fn withdrawn(&self) -> bool {
        self.withdrawn
    }

    /// Where the copy of session `id` stands for a request waiting for `requests` to be kept.
    fn standing(&self, id: &str, requests: &[RequestKey]) -> Standing {
        match self.tracked.get(id) {
            None => Standing::Untracked,
            Some(Tracked {
                replica: Replica::Current { .. },
                shipped: Some(shipped),
                session,
                ..
            }) if session.shipped_has(shipped, requests) => Standing::Written,
            Some(_) => Standing::Unwritten,
        }
    }

    /// Records that replica pod `pod` answered from its replica store `incarnation`: when it
    /// answered from another before (its sidecar restarted, its memory is empty), nothing
    /// placed there is kept any more, and every session whose replica was there is placed
    /// again, whole.
    fn answered_by(&mut self, pod: &str, incarnation: u64) {
        let before = self.incarnations.insert(pod.to_owned(), incarnation);
        if before.is_none_or(|b| b == incarnation) {
            return;
        }
        let mut lost = 0;
        for t in self.tracked.values_mut() {
            if t.replica.kept_at() == Some(pod) {
                t.replica = Replica::Unplaced;
                t.shipped(None);
                t.fresh = true;
                lost += 1;
            }
        }
        tracing::info!(
            pod,
            lost,
            "a replica pod restarted; its replicas are placed again"
        );
    }

    /// Stops following every session; the drops of the copies they have on replica pods, with
    /// those still unacknowledged (at `now`, over `view`).
    fn drop_all(&mut self, view: &View, now: Instant, ttl: Duration) -> HashMap<String, Letter> {
        let mut letters = self.unacked_letters(view, now, ttl);
        for (_, t) in self.tracked.drain() {
            if let Some(at) = t.replica.kept_at() {
                letters
                    .entry(at.to_owned())
                    .or_default()
                    .drop_copy(&t.session, now);
            }
        }
        letters
    }

    /// Letters with the drops still unacknowledged at `now`: those to pods of `view` written
    /// less than `ttl` ago (the replica pod expires a copy not sent for `ttl` itself). They
    /// stay counted until [`Replicating::count_unacked`] counts what is left of them.
    fn unacked_letters(
        &mut self,
        view: &View,
        now: Instant,
        ttl: Duration,
    ) -> HashMap<String, Letter> {
        let mut letters: HashMap<String, Letter> = HashMap::new();
        for (pod, drops) in self.unacked.drain() {
            if view.peer(&pod).is_none() {
                continue;
            }
            let due = drops
                .into_iter()
                .filter(|d| now.saturating_duration_since(d.since) < ttl);
            letters.entry(pod).or_default().drops.extend(due);
        }
        let on_their_way = letters
            .values()
            .flat_map(|l| &l.drops)
            .map(PendingDrop::bytes)
            .sum();
        if let Some(charge) = &mut self.unacked_charge {
            charge.resize(on_their_way);
        }
        letters
    }

    /// Keeps `drops`, which `pod` did not acknowledge, for the next round.
    fn unacknowledged(&mut self, pod: &str, drops: Vec<PendingDrop>) {
        if !drops.is_empty() {
            self.unacked
                .entry(pod.to_owned())
                .or_default()
                .extend(drops);
        }
    }

    /// Counts the drops still unacknowledged once the letters were delivered.
    fn count_unacked(&mut self, retained: &crate::retained::Retained) {
        let bytes = self
            .unacked
            .values()
            .flatten()
            .map(PendingDrop::bytes)
            .sum();
        self.unacked_charge
            .get_or_insert_with(|| retained.charge(Kind::Replicas))
            .resize(bytes);
    }
}

/// What the replica pod's copy of a session holds once it kept a send: all of it, or a change
/// of what it held (a change since that copy, the records written ahead).
enum Holds {
    Exactly(Shipped),
    Change(ShippedChange),
}

/// What one replica pod gets in a round: the replicas (whole or changes; beside each, its
/// session's id, its mark and what the replica pod holds once it kept it) and the drops.
#[derive(Default)]
struct Letter {
    sent: Vec<(String, u64, Holds)>,
    updates: Vec<ReplicaUpdate>,
    drops: Vec<PendingDrop>,
}

impl Letter {
    fn drop_copy(&mut self, session: &Session, now: Instant) {
        self.drops.push(PendingDrop {
            drop: ReplicaDrop {
                session: session.id().to_owned(),
                epoch: session.epoch(),
            },
            since: now,
        });
    }
}

impl Handoff {
    /// One round of the holder's side of replication (module docs), as the interval starts it.
    #[cfg(test)]
    pub(crate) async fn replicate(self: &Arc<Self>) {
        self.replicate_round(true).await;
    }

    /// One round: `ticked` when the interval started it, else a request waits for its record
    /// ([`super::write_ahead`]); then the waiting requests are looked at.
    pub(crate) async fn replicate_round(self: &Arc<Self>, ticked: bool) {
        let letters = self.write_letters(Instant::now(), ticked);
        self.deliver(letters).await;
        self.release_waiters(&mut self.replicating.lock(), false);
    }

    /// Releases the requests waiting for their records that may go: only those whose record
    /// is kept while the round's answers still come (`written_only`), else every one the
    /// round judged ([`super::write_ahead::release`]).
    fn release_waiters(&self, st: &mut Replicating, written_only: bool) {
        if st.waiting.is_empty() {
            return;
        }
        let round = st.rounds;
        let mut waiting = std::mem::take(&mut st.waiting);
        waiting.after_round(
            round,
            written_only,
            |id, requests| st.standing(id, requests),
            |id| self.broker.held(id).is_some(),
        );
        st.waiting = waiting;
    }

    /// Resolves when a request waits for its record to be kept: a round is due at once.
    pub(crate) async fn round_wanted(&self) {
        self.replicate_now.notified().await;
    }

    /// The pod stops (its drain ended): every replica it placed is dropped and none is sent
    /// again. A session still here (`migration: Pin`, no peer to take it) ends with the pod,
    /// never promoted elsewhere; one handed off is replicated by its new holder.
    pub(crate) async fn withdraw_replicas(self: &Arc<Self>) {
        let view = self.router.view();
        let ttl = self.broker.cfg().idle_timeout;
        let letters = {
            let mut st = self.replicating.lock();
            st.withdrawn = true;
            st.drop_all(&view, Instant::now(), ttl)
        };
        self.deliver(letters).await;
    }

    /// Sends `letters`, one per replica pod at once, and applies what became of each replica.
    async fn deliver(self: &Arc<Self>, letters: HashMap<String, Letter>) {
        if letters.is_empty() {
            return;
        }
        let view = self.router.view();
        let (letters, orphans): (Vec<_>, Vec<_>) = letters
            .into_iter()
            .partition(|(pod, _)| view.peer(pod).is_some());
        self.unanswered(orphans);
        let sends = letters.into_iter().filter_map(|(pod, letter)| {
            let peer = view.peer(&pod)?.clone();
            Some(async move {
                let Letter {
                    sent,
                    updates,
                    mut drops,
                } = letter;
                // A copy sent now supersedes an earlier drop of its session there (one not
                // acknowledged then would remove the new copy).
                drops.retain(|d| !sent.iter().any(|(id, ..)| *id == d.drop.session));
                let words = drops.iter().map(|d| d.drop.clone()).collect();
                let send = self.send_letter(&peer, updates, words);
                let (outcomes, incarnation, dropped) = tokio::time::timeout(SEND_TIMEOUT, send)
                    .await
                    .unwrap_or_else(|_| (vec![None; sent.len()], None, false));
                let unacked = if dropped { Vec::new() } else { drops };
                (peer, sent, outcomes, incarnation, unacked)
            })
        });
        // Each pod's answer is applied as it comes: a replica pod that does not answer holds up
        // no request waiting for another one.
        let mut answers: futures::stream::FuturesUnordered<_> = sends.collect();
        let mut superseded = Vec::new();
        while let Some((peer, sent, outcomes, incarnation, unacked)) = answers.next().await {
            let now = Instant::now();
            let mut st = self.replicating.lock();
            if let Some(incarnation) = incarnation {
                st.answered_by(&peer.uid, incarnation);
            }
            st.unacknowledged(&peer.uid, unacked);
            for ((id, mark, shipped), outcome) in sent.into_iter().zip(outcomes) {
                self.metrics
                    .replica_sent(outcome.map_or(ReplicaSent::Unanswered, ReplicaSent::from));
                let Some(t) = st.tracked.get_mut(&id) else {
                    continue;
                };
                if outcome == Some(ReplicaOutcome::StaleEpoch) {
                    superseded.push((Arc::clone(&t.session), peer.uid.clone()));
                }
                t.replica = after(&t.replica, &peer.uid, mark, outcome, now);
                // What the replica pod holds is known only once it kept the replica.
                let holds = match (outcome, shipped, t.shipped.take()) {
                    (Some(ReplicaOutcome::Kept), Holds::Exactly(holds), _) => Some(holds),
                    (Some(ReplicaOutcome::Kept), Holds::Change(change), Some(mut holds)) => {
                        holds.apply(change);
                        Some(holds)
                    }
                    _ => None,
                };
                t.shipped(holds);
            }
            self.count_unreplicated(&st);
            st.count_unacked(self.broker.retained());
            self.release_waiters(&mut st, true);
        }
        for (session, holder) in superseded {
            self.supersede(session, &holder).await;
        }
    }

    /// Letters whose replica pod left the view before they were sent: what they carried is not
    /// known to be kept there, so each of their sessions is sent again, whole.
    fn unanswered(&self, orphans: Vec<(String, Letter)>) {
        if orphans.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut st = self.replicating.lock();
        for (pod, letter) in orphans {
            for (id, mark, _) in letter.sent {
                if let Some(t) = st.tracked.get_mut(&id) {
                    t.replica = after(&t.replica, &pod, mark, None, now);
                    t.shipped(None);
                }
            }
        }
    }

    /// Looks at the sessions (module docs) and writes what each replica pod gets this round.
    fn write_letters(&self, now: Instant, ticked: bool) -> HashMap<String, Letter> {
        let cfg = self.broker.cfg();
        let mut st = self.replicating.lock();
        if st.withdrawn || cfg.replication == Replication::None {
            // No round will keep a record: nobody waits for one.
            st.waiting.release_all();
        }
        if st.withdrawn {
            return HashMap::new();
        }
        if !ticked && cfg.replication != Replication::None {
            st.rounds += 1;
            return self.write_ahead_letters(&mut st, now);
        }
        let view = self.router.view();
        if cfg.replication == Replication::None {
            self.metrics.sessions_unreplicated(0);
            return st.drop_all(&view, now, cfg.idle_timeout);
        }
        let mut letters = st.unacked_letters(&view, now, cfg.idle_timeout);
        let events = cfg.replication == Replication::Events;
        let refresh = cfg.idle_timeout / 3;
        let scan = (ticked && st.ticks.is_multiple_of(SCAN_EVERY))
            || st.view.as_ref().is_none_or(|v| !Arc::ptr_eq(v, &view));
        st.rounds += 1;
        st.ticks += u64::from(ticked);
        st.view = Some(Arc::clone(&view));
        if st.events != events {
            // With `Events` each event changes a replica; without, only what else it carries.
            st.events = events;
            for t in st.tracked.values_mut() {
                t.changes = t.session.subscribe(events);
                t.fresh = true;
            }
        }
        for session in self.broker.sessions() {
            if !st.tracked.contains_key(session.id()) {
                let id = session.id().to_owned();
                let tracked = self.track(session, events);
                st.tracked.insert(id, tracked);
            }
        }
        let me = self.router.uid();
        let budget = self.replica_budget();
        st.tracked.retain(|_, t| {
            let held = !t.session.is_ended() && self.broker.holds(&t.session);
            if !held {
                if let Some(at) = t.replica.kept_at() {
                    letters
                        .entry(at.to_owned())
                        .or_default()
                        .drop_copy(&t.session, now);
                }
                return false;
            }
            let retry_due = matches!(t.replica, Replica::Retrying { until, .. } if now >= until);
            if !(scan || t.fresh || retry_due || t.changes.has_changed()) {
                return true;
            }
            t.fresh = false;
            t.changes.look();
            let id = t.session.id();
            let mark = t.session.replica_mark(events);
            let target = self.replica_target(&view, id, me, now);
            match plan(&t.replica, target, mark, now, refresh) {
                Plan::Keep => {}
                Plan::Drop { at } => {
                    letters.entry(at).or_default().drop_copy(&t.session, now);
                    t.replica = Replica::Unplaced;
                    t.shipped(None);
                }
                Plan::Send { to, drop_at } => {
                    if let Some(at) = drop_at {
                        letters.entry(at).or_default().drop_copy(&t.session, now);
                    }
                    // The change since the copy `to` acknowledged, or the session whole.
                    let base = match (&t.replica, &t.shipped) {
                        (Replica::Current { pod, mark, .. }, Some(shipped)) if *pod == to => {
                            Some((*mark, shipped))
                        }
                        _ => None,
                    };
                    let scope =
                        base.map_or(Scope::Whole, |(mark, shipped)| Scope::Since(mark, shipped));
                    let (update, holds) = replica_update(&t.session, events, budget, mark, scope);
                    let letter = letters.entry(to).or_default();
                    letter.sent.push((id.to_owned(), mark, holds));
                    letter.updates.push(update);
                }
            }
            true
        });
        if scan {
            // Every pod keeping a replica of a session held here gets a message at least once
            // per scan, empty when nothing changed: its answer tells whether it restarted.
            st.incarnations.retain(|uid, _| view.peer(uid).is_some());
            for t in st.tracked.values() {
                if let Some(at) = t.replica.kept_at() {
                    letters.entry(at.to_owned()).or_default();
                }
            }
        }
        self.count_unreplicated(&st);
        letters
    }

    /// A round a waiting request asked for (`super::write_ahead`): for each session with
    /// requests waiting, the streams and records of those requests added to the copy its
    /// replica pod acknowledged; a session without such a copy (new here, a send not kept) goes
    /// as the round every interval would send it, when it is due. Nothing else is looked at.
    fn write_ahead_letters(&self, st: &mut Replicating, now: Instant) -> HashMap<String, Letter> {
        let cfg = self.broker.cfg();
        let events = cfg.replication == Replication::Events;
        let refresh = cfg.idle_timeout / 3;
        let budget = self.replica_budget();
        let view = self.router.view();
        let me = self.router.uid();
        let mut letters: HashMap<String, Letter> = HashMap::new();
        for (id, requests) in st.waiting.wanted() {
            if !st.tracked.contains_key(&id) {
                let Some(session) = self.broker.held(&id) else {
                    continue;
                };
                let tracked = self.track(session, events);
                st.tracked.insert(id.clone(), tracked);
            }
            let Some(t) = st.tracked.get_mut(&id) else {
                continue;
            };
            let target = self.replica_target(&view, &id, me, now);
            let (update, mark, holds, to) = match (&t.replica, &t.shipped, target) {
                (Replica::Current { pod, mark, .. }, Some(_), Some(to)) if pod == to => {
                    let scope = Scope::Requests(*mark, &requests);
                    let (update, holds) = replica_update(&t.session, events, budget, *mark, scope);
                    (update, *mark, holds, to.to_owned())
                }
                _ => {
                    let mark = t.session.replica_mark(events);
                    let Plan::Send { to, drop_at } = plan(&t.replica, target, mark, now, refresh)
                    else {
                        continue;
                    };
                    if let Some(at) = drop_at {
                        letters.entry(at).or_default().drop_copy(&t.session, now);
                    }
                    let (update, holds) =
                        replica_update(&t.session, events, budget, mark, Scope::Whole);
                    (update, mark, holds, to)
                }
            };
            // A copy sent now supersedes a drop of the session there not acknowledged yet.
            if let Some(drops) = st.unacked.get_mut(&to) {
                drops.retain(|d| d.drop.session != id);
            }
            let letter = letters.entry(to).or_default();
            letter.sent.push((id, mark, holds));
            letter.updates.push(update);
        }
        letters
    }

    /// Most bytes of events one replica carries: what a message holds besides its envelope.
    fn replica_budget(&self) -> usize {
        self.max_message_bytes
            .saturating_sub(MESSAGE_OVERHEAD)
            .max(1)
    }

    /// The replica pod of session `id` held by `me` in `view`, unless it refuses connections
    /// at `now` (it gets no replica until it is up again).
    fn replica_target<'v>(
        &self,
        view: &'v View,
        id: &str,
        me: &str,
        now: Instant,
    ) -> Option<&'v str> {
        decide::replica_pod(view, id, me)
            .filter(|p| self.router.health().down(&p.uid, now).is_none())
            .map(|p| p.uid.as_str())
    }

    /// A session new to the replicator, followed from now on.
    fn track(&self, session: Arc<Session>, events: bool) -> Tracked {
        Tracked {
            changes: session.subscribe(events),
            session,
            replica: Replica::Unplaced,
            shipped: None,
            charge: self.broker.retained().charge(Kind::Replicas),
            fresh: true,
        }
    }

    /// `tether_sessions_unreplicated`: sessions held here without a replica kept current.
    fn count_unreplicated(&self, st: &Replicating) {
        let current = st
            .tracked
            .values()
            .filter(|t| matches!(t.replica, Replica::Current { .. }))
            .count();
        self.metrics
            .sessions_unreplicated(st.tracked.len().saturating_sub(current));
    }

    /// Sends `updates` and `drops` to `peer`, in as many messages as their size takes (halved
    /// until each fits, the drops with the first); what became of each replica, in order
    /// (`None`: no acknowledged answer), the incarnation of `peer`'s replica store its last
    /// answer gave, and whether the message with the drops was answered.
    async fn send_letter(
        &self,
        peer: &Peer,
        updates: Vec<ReplicaUpdate>,
        drops: Vec<ReplicaDrop>,
    ) -> (Vec<Option<ReplicaOutcome>>, Option<u64>, bool) {
        let mut outcomes = Vec::with_capacity(updates.len());
        let mut incarnation = None;
        let mut dropped = None;
        // Messages still to send, the next one last.
        let mut messages = vec![ReplicasPush {
            from: self.router.uid().to_owned(),
            replicas: updates,
            drops,
        }];
        while let Some(mut push) = messages.pop() {
            let body = serde_json::to_vec(&push).unwrap_or_default();
            if body.len() > self.max_message_bytes && push.replicas.len() > 1 {
                let rest = push.replicas.split_off(push.replicas.len() / 2);
                messages.push(ReplicasPush {
                    from: push.from.clone(),
                    replicas: rest,
                    drops: Vec::new(),
                });
                messages.push(push);
                continue;
            }
            let part = push.replicas.len();
            let answer = self
                .client
                .ask(self.destination(peer), REPLICAS_PATH, Bytes::from(body))
                .await
                .ok()
                .and_then(|answer| serde_json::from_slice::<ReplicasAnswer>(&answer).ok())
                .filter(|answer| answer.results.len() == part);
            // The first message sent carries the drops.
            dropped.get_or_insert(answer.is_some());
            match answer {
                Some(answer) => {
                    incarnation = Some(answer.incarnation);
                    outcomes.extend(answer.results.into_iter().map(Some));
                }
                None => outcomes.extend(std::iter::repeat_n(None, part)),
            }
        }
        (outcomes, incarnation, dropped.unwrap_or(false))
    }
}

/// What of a session a send carries.
enum Scope<'a> {
    /// All of it.
    Whole,
    /// The change since the copy of this mark, which holds this.
    Since(u64, &'a Shipped),
    /// The streams and records of these requests alone, added to the copy of this mark, whose
    /// mark stays (a write-ahead).
    Requests(u64, &'a [RequestKey]),
}

/// The replica of `session` at mark `mark`, as much as `scope` says. With `events` its streams
/// carry their buffered events (at most `budget` bytes of them), without only what
/// [`carry::sessions_only`] keeps (the answers of complete streams, which the buffer bounds).
/// Also returns what the replica pod holds once it kept it.
fn replica_update(
    session: &Session,
    events: bool,
    budget: usize,
    mark: u64,
    scope: Scope<'_>,
) -> (ReplicaUpdate, Holds) {
    let max_bytes = if events { budget } else { usize::MAX };
    let (mut snapshot, parts, base) = match scope {
        Scope::Whole => {
            let (snapshot, parts) = session.replica(events, max_bytes, None);
            (snapshot, parts, None)
        }
        Scope::Since(base, shipped) => {
            let (snapshot, parts) = session.replica(events, max_bytes, Some(shipped));
            (snapshot, parts, Some(base))
        }
        Scope::Requests(base, ids) => {
            let (snapshot, parts) = session.replica_of_requests(ids, events, max_bytes);
            (snapshot, parts, Some(base))
        }
    };
    if !events {
        snapshot.streams.iter_mut().for_each(carry::sessions_only);
    }
    let adds = matches!(scope, Scope::Requests(..));
    let holds = if parts.change {
        Holds::Change(ShippedChange {
            adds: parts.shipped,
            forgotten_streams: parts.forgotten_streams.clone(),
            forgotten_requests: parts.forgotten_requests.clone(),
        })
    } else {
        Holds::Exactly(parts.shipped)
    };
    let update = ReplicaUpdate {
        mark: if adds { base.unwrap_or(mark) } else { mark },
        base,
        image: image::session_image(&snapshot),
        forgotten_streams: parts.forgotten_streams,
        forgotten_requests: parts.forgotten_requests,
    };
    (update, holds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFRESH: Duration = Duration::from_secs(20);

    fn current(pod: &str, mark: u64, sent: Instant) -> Replica {
        Replica::Current {
            pod: pod.into(),
            mark,
            sent,
        }
    }

    fn send(to: &str, drop_at: Option<&str>) -> Plan {
        Plan::Send {
            to: to.into(),
            drop_at: drop_at.map(Into::into),
        }
    }

    #[test]
    fn a_replica_is_sent_when_it_changed_moved_or_is_due_and_dropped_when_unplaced() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(100);
        let retrying = Replica::Retrying {
            pod: "b".into(),
            until: later,
            pause: INTERVAL,
        };
        // (replica, replica pod now, mark now, now) → plan
        let table = [
            (Replica::Unplaced, Some("b"), 1, t0, send("b", None)),
            (Replica::Unplaced, None, 1, t0, Plan::Keep),
            (current("b", 1, t0), Some("b"), 1, later, Plan::Keep),
            (current("b", 1, t0), Some("b"), 2, later, send("b", None)),
            (
                current("b", 1, t0),
                Some("b"),
                1,
                t0 + REFRESH,
                send("b", None),
            ),
            (
                current("b", 1, t0),
                Some("c"),
                1,
                later,
                send("c", Some("b")),
            ),
            (
                current("b", 1, t0),
                None,
                1,
                later,
                Plan::Drop { at: "b".into() },
            ),
            (retrying.clone(), Some("b"), 1, t0, Plan::Keep),
            (retrying.clone(), Some("b"), 1, later, send("b", None)),
            (retrying.clone(), Some("c"), 1, t0, send("c", Some("b"))),
            (retrying, None, 1, t0, Plan::Drop { at: "b".into() }),
        ];
        for (i, (replica, target, mark, now, want)) in table.into_iter().enumerate() {
            assert_eq!(plan(&replica, target, mark, now, REFRESH), want, "row {i}");
        }
    }

    #[test]
    fn a_kept_replica_is_current_and_a_refused_one_retried_with_a_doubling_pause() {
        let t0 = Instant::now();
        let kept = after(&Replica::Unplaced, "b", 7, Some(ReplicaOutcome::Kept), t0);
        assert_eq!(kept, current("b", 7, t0));
        let mut replica = kept;
        let mut pauses = Vec::new();
        for outcome in [
            None,
            Some(ReplicaOutcome::Full),
            Some(ReplicaOutcome::Draining),
            None,
            None,
            None,
            None,
        ] {
            replica = after(&replica, "b", 7, outcome, t0);
            let Replica::Retrying { pause, until, .. } = &replica else {
                panic!("a refusal retries: {replica:?}");
            };
            assert_eq!(*until, t0 + *pause);
            pauses.push(pause.as_millis());
        }
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000]);
        // Another pod starts from the first pause again.
        let other = after(&replica, "c", 7, None, t0);
        assert!(matches!(
            other,
            Replica::Retrying {
                pause: INTERVAL,
                ..
            }
        ));
        assert_eq!(
            after(&replica, "b", 8, Some(ReplicaOutcome::Kept), t0),
            current("b", 8, t0)
        );
    }
}
