//! A client session held by this pod (`docs/design/architecture.md#sessions`).
//!
//! A [`Session`] maps the client's session id (minted by the sidecar) to the upstream's, and
//! is made of typed parts, each a state machine with its diagram and tests in its module:
//! - [`ledger`]: its streams, the retry records that de-duplicate retried requests, answered
//!   records and tombstones, within the retry window and the session's budget;
//! - [`holding`]: where it is in a handoff (held → moving → moved), the requests entering, the
//!   epoch; a move has one handle, [`Transfer`];
//! - [`upstream_link`]: the upstream session and its rebuild (live, needs rebuild, rebuilding);
//! - [`credentials`]: its clients' credentials, its binding, the credentials the MCP server
//!   accepted;
//! - [`journal`]: what its upstream session is rebuilt from;
//! - [`feed`]: the change feed any number of subscribers follow ([`Session::subscribe`]).
//!
//! Besides them it holds the standalone GET stream and the time of the last activity (for
//! `session.idleTimeout`); [`Session::snapshot`] exports it all for a peer. The pod's sessions
//! are found in the [`Registry`].

mod bounded;
mod credentials;
mod feed;
#[cfg(test)]
pub(crate) mod fixtures;
mod held;
mod holding;
pub(crate) mod journal;
mod ledger;
mod registry;
mod replica;
mod takeovers;
mod upstream_link;

pub(crate) use feed::Subscription;
pub(crate) use holding::HandoffState;
pub(crate) use ledger::{Buried, Dedupe, RetryRecord, RetryRoom, RetryWindow};
pub(crate) use registry::{Adopted, NoRoom, Refused, Registry};
pub(crate) use replica::{Shipped, ShippedChange};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName};
use parking_lot::Mutex;
use serde_json::Value;
use tether_crds::ProtocolVersion;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::keys::Key;
use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::{Message, RequestKey};
use crate::mcp::principal::{Binding, Principal};
use crate::mcp::rejection::Rejection;
use crate::retained::{BufferAccount, Charge, Kind, Retained};
use crate::session::journal::{Journal, JournalError, MAX_SUBSCRIPTIONS};
use crate::stream::StoredReply;
use crate::stream::buffer::{BufferLimits, Evictions};
use crate::stream::{Stream, StreamKind, StreamSnapshot};
use credentials::Credentials;
use feed::Feed;
use holding::Holding;
use ledger::RetryLedger;
use upstream_link::UpstreamLink;

/// The session's standalone GET stream (spec T-09).
#[derive(Clone, Debug)]
pub(crate) enum Standalone {
    /// Not opened upstream yet.
    None,
    /// Open: every client GET without `Last-Event-ID` reads this stream.
    Open(Arc<Stream>),
    /// The upstream offers none; its answer (405) is replayed to every GET (boxed: most
    /// sessions never hold one).
    Unsupported(Box<StoredReply>),
}

/// A copy of a session's state for another pod (a handoff): everything a pod needs to serve a
/// session it did not create.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SessionSnapshot {
    /// The client session id.
    pub(crate) id: String,
    /// The negotiated protocol version.
    pub(crate) version: ProtocolVersion,
    /// The journal the upstream session is rebuilt from (`migration: Replay`).
    pub(crate) journal: Journal,
    /// Retry records, oldest first.
    pub(crate) records: Vec<RetryRecord>,
    /// Every stream the session keeps (live ones, completed ones and tombstones), oldest first.
    pub(crate) streams: Vec<StreamSnapshot>,
    /// The upstream's answer to a standalone `GET` when it offers none (replayed to clients).
    pub(crate) standalone_unsupported: Option<StoredReply>,
    /// Its clients presented credentials (`spec.auth.forwardHeaders`); the credentials
    /// themselves never leave the pod, so the receiver rebuilds the upstream session with
    /// those of the session's next request instead of in the background without any.
    pub(crate) credentialed: bool,
    /// The principal it is bound to (`spec.auth.binding`), if any.
    pub(crate) binding: Option<Binding>,
    /// Credentials (keyed digests) the MCP server accepted for the session, with how long ago,
    /// oldest first.
    pub(crate) accepted: Vec<(Principal, Duration)>,
    /// Its handoff epoch (`docs/design/handoff.md#one-holder-per-session`).
    pub(crate) epoch: u64,
    /// The requests it answered and forgot ([`ledger::Buried`]).
    pub(crate) tombstones: Option<Buried>,
}

#[derive(Debug)]
struct State {
    /// Its streams, retry records and tombstones.
    ledger: RetryLedger,
    standalone: Standalone,
    last_activity: Instant,
    busy: u32,
    journal: Journal,
    /// The journal's bytes, counted in the pod's tally.
    journal_charge: Charge,
    /// The SSE stream that answered `initialize`, until it is spent and the session's next
    /// message arrived ([`Session::forget_initialize_stream`]).
    initialize_stream: Option<StreamKey>,
    /// Where the session is in a handoff, its requests entering, its epoch.
    holding: Holding,
    /// The pod's activity (the registry's): woken when a request of this session ends or one
    /// of its streams completes.
    activity: Option<Arc<Notify>>,
}

/// What a request finds when it enters a session held here ([`Session::enter`]).
#[derive(Debug)]
pub(crate) enum Entry {
    /// Served here; keep the guard until the request registered its stream.
    Entered(EnterGuard),
    /// Being handed off: wait ([`Session::settled`]) and ask again.
    Moving,
    /// Handed to the peer with this UID.
    Moved(String),
}

/// Counts a request between admission and the registration of its stream, so a handoff never
/// snapshots a session halfway through a request. Dropping it ends the count.
#[derive(Debug)]
pub(crate) struct EnterGuard(Arc<Session>);

impl EnterGuard {
    /// The session entered.
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.0
    }
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        if !self.0.state.lock().holding.entered() {
            return;
        }
        self.0.entered.notify_waiters();
        self.0.feed.tell();
    }
}

/// The one handle of a move under way ([`Session::begin_move`]): [`Transfer::moved`] ends it
/// acknowledged; dropped unfinished, the session is served here again. Either way the waiters
/// of the session's requests are woken.
#[derive(Debug)]
pub(crate) struct Transfer {
    session: Arc<Session>,
    done: bool,
}

impl Transfer {
    /// The session moved.
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The peer `to` acknowledged the session: requests for it go there.
    pub(crate) fn moved(mut self, to: String) {
        self.done = true;
        self.session.finish_move(Some(to));
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        if !self.done {
            self.session.finish_move(None);
        }
    }
}

/// One client session held by this pod.
#[derive(Debug)]
pub(crate) struct Session {
    id: String,
    /// The key that minted the id: it keys the session's digests (its log digest, principal,
    /// accepted credentials), which therefore never change with a rotation.
    key: Arc<Key>,
    digest: String,
    version: ProtocolVersion,
    cancel: CancellationToken,
    state: Mutex<State>,
    /// Serialises opening the upstream standalone GET stream ([`Session::open_standalone_once`]).
    standalone_open: tokio::sync::Mutex<()>,
    /// The upstream session and whether it must be rebuilt before next use.
    upstream: UpstreamLink,
    /// Woken when a handoff ends (acknowledged or refused).
    handoff_settled: Notify,
    /// Tells its subscribers of every change ([`Session::subscribe`]).
    feed: Feed,
    /// Woken when the last request admitted and not yet registered is ([`EnterGuard`]).
    entered: Notify,
    /// Take-overs of its streams by GETs in the current second (`--max-takeovers`).
    takeovers: Mutex<takeovers::Takeovers>,
    /// Its clients' credentials, its binding and the credentials the MCP server accepted.
    credentials: Credentials,
    /// Its place in the registry's sweep schedule ([`registry::Registry::schedule`]).
    pub(super) sweep_at: Mutex<Option<(Instant, u64)>>,
    /// When it was created here, or adopted (the least time between two rebalancing moves
    /// counts from it).
    arrived: Instant,
    /// What its streams' buffers count against: the pod's budget and the session's share.
    account: BufferAccount,
}

impl Session {
    /// A new session whose id `key` minted (its keyed digest stands for the id in logs);
    /// `journal` starts with the `initialize` request sent upstream; what the session retains
    /// is counted in `retained` (the caller checked the pod had room for the journal).
    pub(crate) fn new(
        id: String,
        key: Arc<Key>,
        upstream_id: Option<String>,
        version: ProtocolVersion,
        journal: Journal,
        retained: &Retained,
    ) -> Arc<Self> {
        let mut journal_charge = retained.charge(Kind::Journal);
        journal_charge.resize(journal.bytes() as u64);
        Arc::new(Self {
            digest: key.log_digest(&id),
            id,
            key,
            version,
            cancel: CancellationToken::new(),
            state: Mutex::new(State {
                ledger: RetryLedger::new(retained),
                standalone: Standalone::None,
                last_activity: Instant::now(),
                busy: 0,
                journal,
                journal_charge,
                initialize_stream: None,
                holding: Holding::at(0),
                activity: None,
            }),
            standalone_open: tokio::sync::Mutex::new(()),
            upstream: UpstreamLink::live(upstream_id),
            handoff_settled: Notify::new(),
            feed: Feed::new(),
            entered: Notify::new(),
            takeovers: Mutex::default(),
            sweep_at: Mutex::new(None),
            account: retained.account(),
            credentials: Credentials::default(),
            arrived: Instant::now(),
        })
    }

    /// A session handed over by pod `from` (`docs/design/handoff.md`): its streams, retry
    /// records and journal as they were there; incomplete streams keep following `from`. Its
    /// upstream session is rebuilt from the journal before first use
    /// ([`Session::needs_rebuild`]); when a standalone stream was open at `from`, the rebuild
    /// opens one here too ([`Session::take_reopen_standalone`]).
    pub(crate) fn from_parts(
        snapshot: SessionSnapshot,
        key: Arc<Key>,
        from: &str,
        limits: BufferLimits,
        retained: &Retained,
    ) -> Arc<Self> {
        let SessionSnapshot {
            id,
            version,
            journal,
            records,
            streams,
            standalone_unsupported,
            credentialed,
            binding,
            accepted,
            epoch,
            tombstones,
        } = snapshot;
        let session = Self::new(id, key, None, version, journal, retained);
        session.credentials.adopt(credentialed, accepted);
        session.state.lock().holding = Holding::at(epoch);
        session.bind(binding);
        let standalone_open = streams
            .iter()
            .any(|s| s.kind == StreamKind::Standalone && !s.complete);
        session.upstream.adopt(standalone_open);
        if let Some(reply) = standalone_unsupported {
            session.state.lock().standalone = Standalone::Unsupported(Box::new(reply));
        }
        session.import(&streams, &records, from, limits);
        if let Some(buried) = &tombstones {
            session
                .state
                .lock()
                .ledger
                .adopt_buried(buried, std::time::Instant::now());
        }
        session
    }

    /// Applies streams and retry records sent by pod `from`: known streams take the new
    /// events and state, unknown ones are created; records of known request ids are kept.
    /// Returns how many events were new.
    pub(crate) fn import(
        &self,
        streams: &[StreamSnapshot],
        records: &[RetryRecord],
        from: &str,
        limits: BufferLimits,
    ) -> usize {
        let mut added = 0;
        let mut st = self.state.lock();
        for snapshot in streams {
            if st.ledger.is_answered(&snapshot.key) {
                // Answered in full here already: a later copy has nothing new.
                continue;
            }
            match st.ledger.stream(&snapshot.key) {
                Some(stream) => added += stream.apply(snapshot),
                None => {
                    let stream = Stream::from_snapshot(
                        snapshot,
                        limits,
                        self.account.clone(),
                        self.cancel.child_token(),
                        from,
                    );
                    added += snapshot.events.len();
                    self.insert_stream(&mut st, &stream);
                }
            }
        }
        st.ledger.adopt_records(records);
        // A request the writer did not carry out is no retry's outcome here either.
        for snapshot in streams.iter().filter(|s| s.withdrawn) {
            st.ledger.forget_records_of(&snapshot.key);
        }
        added
    }

    /// A copy of the session with at most `max_bytes` of event data in all (each stream gets
    /// at least its oldest unsent event). Returns the copy and, per stream, the sequence the
    /// receiver will be at (the follower sends the rest).
    pub(crate) fn snapshot(&self, max_bytes: usize) -> (SessionSnapshot, HashMap<StreamKey, u64>) {
        let st = self.state.lock();
        let (streams, positions) = st.ledger.snapshot(max_bytes);
        let records = st.ledger.records(None);
        (
            self.snapshot_of(&st, records, streams, usize::MAX),
            positions,
        )
    }

    /// A copy of the session (its state `st`, locked) with `records` and `streams`.
    fn snapshot_of(
        &self,
        st: &State,
        records: Vec<RetryRecord>,
        streams: Vec<StreamSnapshot>,
        max_buried_ids: usize,
    ) -> SessionSnapshot {
        SessionSnapshot {
            id: self.id.clone(),
            version: self.version,
            journal: st.journal.clone(),
            records,
            streams,
            standalone_unsupported: match &st.standalone {
                Standalone::Unsupported(reply) => Some(StoredReply::clone(reply)),
                _ => None,
            },
            credentialed: self.is_credentialed(),
            binding: self.binding(),
            accepted: self.credentials.accepted_ages(),
            epoch: st.holding.epoch(),
            tombstones: st.ledger.buried(std::time::Instant::now(), max_buried_ids),
        }
    }

    /// Retry records of the streams `keys` (new streams sent in a tail message).
    pub(crate) fn records_of(&self, keys: &[StreamKey]) -> Vec<RetryRecord> {
        self.state.lock().ledger.records(Some(keys))
    }

    /// Runs `work` (a rebuild of the upstream session from the journal) while no other rebuild
    /// of this session runs; callers check again inside whether one is still needed.
    pub(crate) async fn rebuild_once<F: Future>(&self, work: F) -> F::Output {
        self.upstream.rebuild_once(work).await
    }

    /// Runs `work` (opening the upstream standalone GET stream) while no other opening of this
    /// session's runs; callers check again inside whether the stream is still missing.
    pub(crate) async fn open_standalone_once<F: Future>(&self, work: F) -> F::Output {
        let _opening = self.standalone_open.lock().await;
        work.await
    }

    /// Whether the upstream session must be rebuilt from the journal before first use (the
    /// session came from a peer).
    pub(crate) fn needs_rebuild(&self) -> bool {
        self.upstream.needs_rebuild()
    }

    /// Records that the upstream session was rebuilt.
    pub(crate) fn rebuilt(&self) {
        self.upstream.rebuilt();
    }

    /// Records a rebuild the MCP server was not ready for: the next request tries again.
    /// Returns how long rebuilds have been failing so (since the first of the row).
    pub(crate) fn defer_rebuild(&self) -> Duration {
        self.upstream.defer()
    }

    /// Records a rebuild the MCP server refused for the caller's credentials: the next request
    /// tries again with its own. Not bounded by `--rebuild-retry-for` (each attempt is a
    /// client's request; an idle session still expires), and it ends a streak of the server
    /// not being ready.
    pub(crate) fn await_credentials(&self) {
        // The MCP server answered: a streak of it not being ready is over.
        self.rebuild_on_next_use();
    }

    /// Records that the session has no upstream session: its next request rebuilds one from
    /// the journal (a session taken back after this pod ended its upstream session).
    pub(crate) fn rebuild_on_next_use(&self) {
        self.upstream.rebuild_on_next_use();
    }

    /// Whether the rebuilt upstream session needs a standalone stream at once (the sender had
    /// one open); `true` only once.
    pub(crate) fn take_reopen_standalone(&self) -> bool {
        self.upstream.take_reopen_standalone()
    }

    /// Admits a request into the session, unless a handoff is moving or moved it.
    pub(crate) fn enter(self: &Arc<Self>) -> Entry {
        match self.state.lock().holding.enter() {
            Ok(()) => Entry::Entered(EnterGuard(Arc::clone(self))),
            Err(HandoffState::Moved(to)) => Entry::Moved(to),
            Err(_) => Entry::Moving,
        }
    }

    /// Starts a handoff: the one [`Transfer`] that ends it; `None` when one is under way or
    /// done.
    pub(crate) fn begin_move(self: &Arc<Self>) -> Option<Transfer> {
        self.state.lock().holding.begin().then(|| Transfer {
            session: Arc::clone(self),
            done: false,
        })
    }

    /// Takes back the session from a peer that acknowledged it and left: served here again.
    pub(crate) fn reclaim(&self) {
        self.state.lock().holding.reclaim();
        self.handoff_settled.notify_waiters();
        self.feed.tell();
    }

    /// Requests admitted and not registered yet.
    pub(crate) fn entering(&self) -> u32 {
        self.state.lock().holding.entering()
    }

    /// When it was created here, or adopted.
    pub(crate) fn arrived(&self) -> Instant {
        self.arrived
    }

    /// Its handoff epoch (`docs/design/handoff.md#one-holder-per-session`).
    pub(crate) fn epoch(&self) -> u64 {
        self.state.lock().holding.epoch()
    }

    /// Whether a move of it from here is under way (`Moving`: a peer may hold it already).
    pub(crate) fn is_moving(&self) -> bool {
        self.state.lock().holding.state() == &HandoffState::Moving
    }

    /// The epoch of a new push of the session: one more than any before, so a copy an earlier
    /// push may have left at a peer is stale against it.
    pub(crate) fn advance_epoch(&self) -> u64 {
        self.state.lock().holding.advance_epoch()
    }

    /// Ends a handoff: acknowledged by `to`, or refused everywhere (`None`: served here again).
    fn finish_move(&self, to: Option<String>) {
        self.state.lock().holding.finish(to);
        self.handoff_settled.notify_waiters();
        self.feed.tell();
    }

    /// Waits until every request admitted into the session registered its stream (a move
    /// images the session only then), at most `bound`; returns whether they all did.
    pub(crate) async fn all_entered(&self, bound: Duration) -> bool {
        let wait = async {
            loop {
                let entered = self.entered.notified();
                if self.state.lock().holding.entering() == 0 {
                    return;
                }
                entered.await;
            }
        };
        tokio::time::timeout(bound, wait).await.is_ok()
    }

    /// Waits until a handoff under way ends, at most `bound`; returns whether it did.
    pub(crate) async fn settled(&self, bound: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.handoff_settled.notified();
                if self.state.lock().holding.state() != &HandoffState::Moving {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(bound, wait).await.is_ok()
    }

    /// Wakes every waiter of `activity` when a request of the session ends or one of its
    /// streams, present and future, completes.
    pub(super) fn report_to(&self, activity: &Arc<Notify>) {
        let mut st = self.state.lock();
        st.activity = Some(Arc::clone(activity));
        for stream in st.ledger.streams() {
            stream.report_to(activity);
        }
    }

    /// A new follower of the session's changes (see [`feed`]); with `events`, of every event
    /// too.
    pub(crate) fn subscribe(&self, events: bool) -> Subscription {
        self.feed.subscribe(events)
    }

    /// The client session id (never log it; use [`Session::digest`]).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The keyed digest that stands for the id in logs.
    pub(crate) fn digest(&self) -> &str {
        &self.digest
    }

    /// The key that minted the id, which keys the session's digests.
    pub(crate) fn key(&self) -> &Arc<Key> {
        &self.key
    }

    /// Keeps the headers `names` of a client request of the session (`spec.auth.forwardHeaders`)
    /// as its credentials, when it carries any; a request without them changes nothing.
    pub(crate) fn remember_credentials(&self, request: &HeaderMap, names: &[HeaderName]) {
        self.credentials.remember(request, names);
    }

    /// `headers` with the session's credentials (the latest a client request presented) in
    /// place of any the headers had.
    pub(crate) fn with_credentials(&self, headers: HeaderMap) -> HeaderMap {
        self.credentials.apply(headers)
    }

    /// Binds the session to `binding` (once, before it is used; `None` leaves it unbound).
    ///
    /// What the session pins (its journal, tombstones and unsent events) counts in its
    /// principal's share from then on (`--max-principal-retained-bytes`).
    pub(crate) fn bind(&self, binding: Option<Binding>) {
        let Some(binding) = binding else { return };
        if !self.credentials.bind(binding) {
            return;
        }
        if let Some(principal) = binding.principal {
            let share = self.account.pod().share(principal);
            self.account.attribute(&share);
            let mut st = self.state.lock();
            st.journal_charge.attribute(&share);
            st.ledger.attribute(&share);
        }
    }

    /// Records that the MCP server accepted credential `key` for the session just now.
    pub(crate) fn accept_credential(&self, key: Principal) {
        self.credentials.accept(key);
    }

    /// Forgets that the MCP server accepted credential `key` (it refused it since).
    pub(crate) fn withdraw_credential(&self, key: Principal) {
        self.credentials.withdraw(key);
    }

    /// Whether the MCP server accepted credential `key` for the session within `window`.
    pub(crate) fn credential_accepted(&self, key: Principal, window: Duration) -> bool {
        self.credentials.accepted(key, window)
    }

    /// The principal the session is bound to, if any.
    pub(crate) fn binding(&self) -> Option<Binding> {
        self.credentials.binding()
    }

    /// Whether some client request of the session presented credentials, here or (as its
    /// handoff image says) on an earlier holder.
    pub(crate) fn is_credentialed(&self) -> bool {
        self.credentials.is_credentialed()
    }

    /// The upstream's session id (it changes when the session is rebuilt).
    pub(crate) fn upstream_id(&self) -> Option<String> {
        self.upstream.id()
    }

    /// Switches to a rebuilt upstream session.
    pub(crate) fn set_upstream_id(&self, id: Option<String>) {
        self.upstream.set_id(id);
    }

    /// Records a client message in the journal if it belongs there, within the session's
    /// `max_bytes` and the pod's journal budget.
    ///
    /// # Errors
    /// [`Rejection::JournalFull`] (413) over the session's bounds, [`Rejection::PodFull`]
    /// (429) over the pod's; the journal is unchanged then.
    pub(crate) fn record(
        &self,
        message: &Message,
        raw: &Value,
        max_bytes: usize,
    ) -> Result<(), Rejection> {
        let mut st = self.state.lock();
        let State {
            journal,
            journal_charge,
            ..
        } = &mut *st;
        let admit = |bytes: usize| journal_charge.try_resize(bytes as u64).is_ok();
        let changed = journal
            .record(message, raw, max_bytes, admit)
            .map_err(journal_rejection)?;
        drop(st);
        if changed {
            self.feed.tell();
        }
        Ok(())
    }

    /// Whether `entries` could be recorded in the journal now ([`Session::record`] of each, in
    /// order), changing nothing: a request is refused before it is sent when its journal entry
    /// would not fit, and recorded once the MCP server accepted it.
    ///
    /// # Errors
    /// As [`Session::record`].
    pub(crate) fn check_journal(
        &self,
        entries: &[(Message, Value)],
        max_bytes: usize,
    ) -> Result<(), Rejection> {
        if entries.is_empty() {
            return Ok(());
        }
        let st = self.state.lock();
        let mut journal = st.journal.clone();
        for (message, raw) in entries {
            let admit = |bytes: usize| st.journal_charge.fits(bytes as u64);
            journal
                .record(message, raw, max_bytes, admit)
                .map_err(journal_rejection)?;
        }
        Ok(())
    }

    /// A copy of the journal.
    pub(crate) fn journal(&self) -> Journal {
        self.state.lock().journal.clone()
    }

    /// The negotiated protocol version.
    pub(crate) fn version(&self) -> ProtocolVersion {
        self.version
    }

    /// Whether clients of this session get priming events (negotiated ≥ 2025-11-25, R-05).
    pub(crate) fn primes(&self) -> bool {
        self.version >= ProtocolVersion::V2025_11_25
    }

    /// Keeps the session's event buffers within its share (`--max-session-buffer-bytes`): the
    /// events clients were sent go, the oldest completed streams' first, then those of streams
    /// still running; events no client was sent stay (their upstream tasks wait). Returns how
    /// many were evicted.
    pub(crate) fn evict_for_share(&self) -> u64 {
        if !self.account.session_over() {
            return 0;
        }
        let streams: Vec<Arc<Stream>> = {
            let st = self.state.lock();
            st.ledger.streams_in_order().cloned().collect()
        };
        let mut evicted = 0;
        for complete in [true, false] {
            for stream in streams.iter().filter(|s| s.is_complete() == complete) {
                if !self.account.session_over() {
                    return evicted;
                }
                evicted += stream.evict_sent();
            }
        }
        evicted
    }

    /// What a new stream's buffer counts against: the pod's budget and this session's share.
    pub(crate) fn account(&self) -> BufferAccount {
        self.account.clone()
    }

    /// A child token for a new stream's upstream task; cancelled when the session ends.
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.cancel.child_token()
    }

    /// Whether the session has ended.
    pub(crate) fn is_ended(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Marks a request being handled; the session is not idle while the guard lives.
    pub(crate) fn busy(self: &Arc<Self>) -> BusyGuard {
        let mut st = self.state.lock();
        st.busy += 1;
        st.last_activity = Instant::now();
        BusyGuard(Arc::clone(self))
    }

    /// Whether the request ids of a POST are new to the session (or reuse answered ids): what
    /// [`Session::claim`] would register rather than join, replay or refuse, as of now.
    pub(crate) fn is_new(&self, ids: &[RequestKey], digest: [u8; 32]) -> bool {
        self.state.lock().ledger.is_new(ids, digest)
    }

    /// Classifies the request ids of a POST against the session's retry records and, when they
    /// are new and fit in `room`, registers `stream` for them, atomically (concurrent retries
    /// dispatch once): [`RetryLedger::claim`].
    pub(crate) fn claim(
        &self,
        ids: &[RequestKey],
        digest: [u8; 32],
        stream: &Arc<Stream>,
        room: RetryRoom,
    ) -> Dedupe {
        let mut st = self.state.lock();
        if self.is_ended() {
            // [`Session::end`] cancels, then ends the streams it holds: a stream registered
            // now would never be ended, and its client would wait for ever.
            return Dedupe::Ended;
        }
        let verdict = st.ledger.claim(ids, digest, stream, room);
        if matches!(verdict, Dedupe::New | Dedupe::Reused) {
            self.listen_to(&st, stream);
        }
        verdict
    }

    /// Keeps `reply` as the answer of `stream` (which completes) and makes room for it within
    /// the session's `budget` (`--max-session-retry-bytes`) by forgetting spent streams; a
    /// reply nobody was handed yet is kept even over the budget (later requests get 413).
    pub(crate) fn keep_reply(&self, stream: &Stream, reply: StoredReply, budget: u64) {
        stream.store_reply(reply);
        self.shed_retry_state(budget);
    }

    /// Keeps the session within its retry window, then forgets spent streams and records of
    /// streams no longer held until its retry state takes at most `target` bytes; whether it
    /// does.
    pub(crate) fn shed_retry_state(&self, target: u64) -> bool {
        self.state
            .lock()
            .ledger
            .shed_retry_state(target, Instant::now())
    }

    /// The session's spent streams ([`Stream::is_spent`]) at `now`, with their creation
    /// times: what the pod forgets first when its retry budget is over.
    pub(crate) fn spent_streams(&self, now: Instant) -> Vec<(Instant, StreamKey)> {
        self.state.lock().ledger.spent_streams(now)
    }

    /// Forgets stream `key` if it is still spent at `now` ([`RetryLedger::forget_spent`]).
    pub(crate) fn forget_spent(&self, key: &StreamKey, now: Instant) {
        self.state.lock().ledger.forget_spent(key, now);
    }

    /// Ends a POST whose requests were not carried out (refused for the caller, or never
    /// received by the MCP server) with `reply` ([`Stream::withdraw`]): their records go, so
    /// a retry dispatches them again. The stream stays until it is spent, so a follower of a
    /// handoff under way tells the new holder; like [`Session::keep_reply`], room is made for
    /// `reply` within `budget`.
    pub(crate) fn withdraw_post(&self, stream: &Stream, reply: StoredReply, budget: u64) {
        self.state.lock().ledger.forget_records_of(stream.key());
        stream.withdraw(reply);
        self.shed_retry_state(budget);
    }

    /// Replaces `stream` by a compact answered record once its client was handed its complete
    /// reply ([`Stream::handed_answer`]): a retry of its request replays the reply, at a
    /// fraction of a stream's memory (`docs/design/buffering.md#retries`). Only while the
    /// session is held here (a handoff under way follows live streams).
    pub(crate) fn settle(&self, stream: &Stream) {
        let Some(reply) = stream.handed_answer() else {
            return;
        };
        let mut st = self.state.lock();
        if st.holding.is_held() {
            st.ledger.settle(stream, &reply);
        }
    }

    /// Registers the stream that answered `initialize` (no retry record leads to it).
    pub(crate) fn register_stream(&self, stream: &Arc<Stream>) {
        let mut st = self.state.lock();
        st.initialize_stream = Some(stream.key().clone());
        self.insert_stream(&mut st, stream);
    }

    /// Forgets the stream that answered `initialize` once it is spent (every event handed to
    /// a client, or older than the TTL): called on the session's next messages, which show the
    /// client has its answer. An idle session keeps no stream so (its resume would get 400
    /// `unknown_cursor`, never another stream's events).
    pub(crate) fn forget_initialize_stream(&self) {
        let mut st = self.state.lock();
        let Some(key) = st.initialize_stream.as_ref() else {
            return;
        };
        if st
            .ledger
            .stream(key)
            .is_none_or(|s| s.is_spent(Instant::now()))
            && let Some(key) = st.initialize_stream.take()
        {
            st.ledger.forget_stream(&key);
        }
    }

    /// Registers `stream` in the ledger, followed by the session's change feed and the pod's
    /// activity.
    fn insert_stream(&self, st: &mut State, stream: &Arc<Stream>) {
        st.ledger.insert_stream(stream);
        self.listen_to(st, stream);
    }

    /// Listens to `stream`, just registered: its changes go out on the session's change feed,
    /// its completion wakes the pod's activity.
    fn listen_to(&self, st: &State, stream: &Stream) {
        stream.feed_into(self.feed.teller());
        if let Some(activity) = &st.activity {
            stream.report_to(activity);
        }
        self.feed.tell();
    }

    /// The stream with `key`, if this session has it.
    pub(crate) fn stream(&self, key: &StreamKey) -> Option<Arc<Stream>> {
        self.state.lock().ledger.stream(key).cloned()
    }

    /// The stream that carries the response to request `id`.
    pub(crate) fn stream_of_request(&self, id: &RequestKey) -> Option<Arc<Stream>> {
        self.state.lock().ledger.stream_of_request(id).cloned()
    }

    /// The first standalone stream registered after stream `key` (the chain a client's
    /// standalone GET follows across handoffs: the old holder's, then each new holder's).
    pub(crate) fn next_standalone(&self, key: &StreamKey) -> Option<Arc<Stream>> {
        self.state.lock().ledger.next_standalone(key).cloned()
    }

    /// Counts a GET taking over one of the session's streams from another connection; `false`
    /// when more than `max` did in the current second (see [`takeovers`]).
    pub(crate) fn admit_takeover(&self, max: std::num::NonZeroU32) -> bool {
        self.takeovers.lock().admit(Instant::now(), max)
    }

    /// The standalone stream state.
    pub(crate) fn standalone(&self) -> Standalone {
        self.state.lock().standalone.clone()
    }

    /// Sets the standalone stream state (an open stream is also registered for resumes). A
    /// stream opened while the session ended is complete at once: [`Session::end`] did not
    /// see it, and its reader must not wait for ever.
    pub(crate) fn set_standalone(&self, standalone: Standalone) {
        let mut st = self.state.lock();
        if let Standalone::Open(stream) = &standalone {
            self.insert_stream(&mut st, stream);
            if self.is_ended() {
                stream.complete();
            }
        }
        st.standalone = standalone;
        self.feed.tell();
    }

    /// Forgets the standalone stream `stream` (its upstream gave up); the next GET reopens one.
    pub(crate) fn clear_standalone(&self, stream: &Stream) {
        let mut st = self.state.lock();
        if matches!(&st.standalone, Standalone::Open(s) if s.key() == stream.key()) {
            st.standalone = Standalone::None;
            self.feed.tell();
        }
    }

    /// Whether nothing happened for `idle` at `now`: no request being handled, no attached
    /// reader, no POST waiting for its response.
    pub(crate) fn is_idle(&self, now: Instant, idle: Duration) -> bool {
        let st = self.state.lock();
        st.busy == 0
            && now.saturating_duration_since(st.last_activity) >= idle
            && st.ledger.streams().all(|s| !s.is_active())
    }

    /// Whether a request of the session is being handled or a POST waits for its response.
    pub(crate) fn in_flight(&self) -> bool {
        let st = self.state.lock();
        st.busy > 0
            || st
                .ledger
                .streams()
                .any(|s| s.kind().answers_requests() && !s.is_complete())
    }

    /// Evicts expired events of every stream, forgets answered streams spent for the TTL (the
    /// oldest ones, in creation order: the walk stops at the first younger one) and expired
    /// tombstones.
    pub(crate) fn evict_expired(&self, now: Instant) -> Evictions {
        self.state.lock().ledger.expire(now);
        let streams = self.streams();
        let mut total = Evictions::default();
        for s in streams {
            total += s.evict_expired(now);
        }
        total
    }

    /// Every stream of the session.
    pub(crate) fn streams(&self) -> Vec<Arc<Stream>> {
        self.state.lock().ledger.streams().cloned().collect()
    }

    /// When the sweeper should look at the session next, once it was swept at `now`: when it
    /// turns idle (`idle` after its last activity; a quarter of `idle` from now while a request
    /// or a reader keeps it busy), or when the first thing it holds expires — and no later
    /// than `ttl` from now, after which anything it takes from now on expires. Expiries that
    /// passed without an eviction (events a reader still needs) wait for one of the others.
    pub(crate) fn next_sweep(&self, now: Instant, idle: Duration, ttl: Duration) -> Instant {
        let st = self.state.lock();
        let busy = st.busy > 0 || st.ledger.streams().any(|s| s.is_active());
        let idle_at = if busy {
            now + idle / 4
        } else {
            st.last_activity + idle
        };
        let first = idle_at.min(now + ttl);
        st.ledger.next_expiry(now).map_or(first, |at| first.min(at))
    }

    /// Ends the session: upstream tasks stop; a POST still waiting for its answer gets `gone`
    /// (the 404 of a lost session), requests already streaming get a JSON-RPC error; readers
    /// drain what is buffered and end.
    pub(crate) fn end(&self, gone: &StoredReply) {
        self.cancel.cancel();
        for s in self.streams() {
            s.end_with_session(gone);
        }
    }
}

/// Keeps a session from being idle while a request is handled.
#[derive(Debug)]
pub(crate) struct BusyGuard(Arc<Session>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let activity = {
            let mut st = self.0.state.lock();
            st.busy -= 1;
            st.last_activity = Instant::now();
            st.activity.clone()
        };
        if let Some(activity) = activity {
            activity.notify_waiters();
        }
    }
}

/// The rejection of a journal entry that does not fit.
fn journal_rejection(e: JournalError) -> Rejection {
    match e {
        JournalError::TooLarge(limit) => Rejection::JournalFull(format!(
            "its journal would exceed {limit} bytes (--max-journal-bytes)"
        )),
        JournalError::TooManySubscriptions => Rejection::JournalFull(format!(
            "it holds {MAX_SUBSCRIPTIONS} resource subscriptions"
        )),
        JournalError::PodFull => Rejection::PodFull,
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{ANY_ROOM, key, limits, session, stream};
    use super::*;
    use crate::stream::Head;

    #[test]
    fn a_journal_check_changes_nothing_and_refuses_what_recording_would() {
        let s = session();
        let entry = |method: &str, params: serde_json::Value| {
            let raw =
                serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
            let message = Message::Request {
                id: crate::mcp::jsonrpc::RequestKey::of(&raw["id"]),
                method: method.to_owned(),
            };
            (message, raw)
        };
        let level = entry("logging/setLevel", serde_json::json!({"level": "debug"}));
        let before = s.journal();
        s.check_journal(std::slice::from_ref(&level), 1 << 20)
            .unwrap();
        assert_eq!(s.journal(), before, "checked, not recorded");
        let big = entry(
            "resources/subscribe",
            serde_json::json!({"uri": "u", "pad": "x".repeat(2_000)}),
        );
        let refused = s.check_journal(&[level.clone(), big.clone()], before.bytes() + 100);
        assert!(
            matches!(refused, Err(Rejection::JournalFull(_))),
            "{refused:?}"
        );
        assert_eq!(
            s.record(&big.0, &big.1, before.bytes() + 100)
                .map_err(|r| r.reason()),
            Err("journal_full"),
            "what the check refuses, recording refuses"
        );
        s.record(&level.0, &level.1, 1 << 20).unwrap();
        assert_ne!(s.journal(), before);
    }

    #[test]
    fn the_next_sweep_is_when_the_session_turns_idle_or_something_of_it_expires() {
        let s = session();
        let now = Instant::now();
        let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3_600));
        let idle_at = s.state.lock().last_activity + minute;
        assert_eq!(s.next_sweep(now, minute, hour), idle_at, "idle first");
        assert_eq!(
            s.next_sweep(now, hour, minute),
            now + minute,
            "what it takes expires"
        );
        let st = stream(&s, &[key(1)]);
        assert!(matches!(
            s.claim(&[key(1)], [1; 32], &st, ANY_ROOM),
            Dedupe::New
        ));
        assert_eq!(
            s.next_sweep(now, hour, hour),
            st.created() + ANY_ROOM.window.ttl,
            "an answer leaves the retry window"
        );
        let busy = s.busy();
        assert_eq!(
            s.next_sweep(now + Duration::from_secs(9), minute, hour),
            now + Duration::from_secs(9) + minute / 4,
            "a busy session is looked at again in a quarter of the idle timeout"
        );
        drop(busy);
    }

    #[test]
    fn retries_attach_and_conflicts_are_refused() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        assert!(matches!(s.claim(&ids, [1; 32], &st, ANY_ROOM), Dedupe::New));
        let other = stream(&s, &ids);
        match s.claim(&ids, [1; 32], &other, ANY_ROOM) {
            Dedupe::Retry(found) => assert_eq!(found.key(), st.key()),
            v => panic!("expected a retry, got {v:?}"),
        }
        assert!(matches!(
            s.claim(&ids, [2; 32], &other, ANY_ROOM),
            Dedupe::Conflict
        ));
        assert!(matches!(
            s.claim(&[key(1), key(2)], [1; 32], &other, ANY_ROOM),
            Dedupe::Conflict
        ));
        s.withdraw_post(&st, refused(), u64::MAX);
        assert!(matches!(
            s.claim(&ids, [1; 32], &other, ANY_ROOM),
            Dedupe::New
        ));
    }

    /// A 401 of the MCP server.
    fn refused() -> StoredReply {
        StoredReply {
            status: http::StatusCode::UNAUTHORIZED,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
        }
    }

    #[tokio::test]
    async fn every_subscriber_follows_the_session_its_streams_and_its_moves() {
        let s = session();
        let mut subscribers = [s.subscribe(true), s.subscribe(true)];
        async fn told(subscribers: &mut [Subscription]) -> bool {
            let mut all = true;
            for sub in subscribers {
                let wait = tokio::time::timeout(Duration::from_millis(20), sub.changed());
                all &= wait.await.is_ok();
                sub.look();
            }
            all
        }
        assert!(!told(&mut subscribers).await, "nothing changed yet");
        let st = stream(&s, &[key(1)]);
        assert!(matches!(
            s.claim(&[key(1)], [1; 32], &st, ANY_ROOM),
            Dedupe::New
        ));
        assert!(told(&mut subscribers).await, "a stream registered");
        st.append(
            None,
            bytes::Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            Instant::now(),
        );
        assert!(told(&mut subscribers).await, "its answer");
        let transfer = s.begin_move().expect("held");
        drop(transfer);
        assert!(told(&mut subscribers).await, "a move ended");
        assert!(!told(&mut subscribers).await, "told once per change");
    }

    #[tokio::test]
    async fn a_request_withdrawn_at_the_sender_after_the_handoff_image_is_withdrawn_at_the_receiver()
     {
        let sender = session();
        let ids = [key(1)];
        let st = stream(&sender, &ids);
        assert!(matches!(
            sender.claim(&ids, [1; 32], &st, ANY_ROOM),
            Dedupe::New
        ));
        // The image is taken while the request is at the MCP server.
        let (image, positions) = sender.snapshot(usize::MAX);
        let pod = Retained::new(u64::MAX);
        let receiver =
            Session::from_parts(image, crate::keys::test_key(), "sender", limits(), &pod);
        let other = stream(&receiver, &ids);
        let Dedupe::Retry(joined) = receiver.claim(&ids, [1; 32], &other, ANY_ROOM) else {
            panic!("the imported request is a retry's");
        };
        assert!(!joined.is_withdrawn());
        // Then the MCP server refuses it: the follower still finds the stream and sends that.
        sender.withdraw_post(&st, refused(), u64::MAX);
        let tail: Vec<StreamSnapshot> = sender
            .streams()
            .iter()
            .filter(|s| s.key() == st.key())
            .map(|s| s.snapshot(positions[st.key()], usize::MAX).0)
            .collect();
        assert_eq!(tail.len(), 1, "the withdrawn stream stays for the follower");
        assert!(tail[0].withdrawn && tail[0].complete);
        receiver.import(&tail, &[], "sender", limits());
        match joined.wait_head().await {
            Head::Stored(reply) => assert_eq!(reply.status, http::StatusCode::UNAUTHORIZED),
            Head::Sse(_) => panic!("the refusal answers whoever waited"),
        }
        assert!(joined.is_withdrawn());
        assert!(
            matches!(receiver.claim(&ids, [1; 32], &other, ANY_ROOM), Dedupe::New),
            "a retry on the receiver is dispatched again"
        );
    }

    /// What a repeated id means, by where its first request stands and what the second sends.
    #[tokio::test]
    async fn a_repeated_id_is_a_retry_with_its_body_and_a_new_request_once_answered() {
        let (room, reply) = window_of(2, u64::MAX);
        // (first request answered?, second body the same?, expected verdict)
        let table: [(bool, bool, &str); 4] = [
            (false, true, "Retry"),
            (false, false, "Conflict"),
            (true, true, "Answered"),
            (true, false, "Reused"),
        ];
        for (answered, same, expected) in table {
            let s = session();
            let first = stream(&s, &[key(1)]);
            assert!(matches!(
                s.claim(&[key(1)], [1; 32], &first, room),
                Dedupe::New
            ));
            if answered {
                s.keep_reply(&first, reply.clone(), u64::MAX);
                assert!(matches!(first.wait_head().await, Head::Stored(_)));
                s.settle(&first);
            }
            let second = stream(&s, &[key(1)]);
            let digest = if same { [1; 32] } else { [2; 32] };
            let verdict = s.claim(&[key(1)], digest, &second, room);
            let name = format!("{verdict:?}");
            assert!(
                name.starts_with(expected),
                "answered {answered}, same body {same}: {name}"
            );
            if expected == "Reused" {
                // The id now leads to the new request: its retry joins it, the old body is
                // another body under a running id.
                let third = stream(&s, &[key(1)]);
                assert!(matches!(
                    s.claim(&[key(1)], [2; 32], &third, room),
                    Dedupe::Retry(found) if found.key() == second.key()
                ));
                assert!(matches!(
                    s.claim(&[key(1)], [1; 32], &third, room),
                    Dedupe::Conflict
                ));
            }
        }
    }

    #[tokio::test]
    async fn a_forgotten_id_is_expired_unless_the_session_reuses_ids() {
        let (room, reply) = window_of(1, u64::MAX);
        let answer = |s: &Arc<Session>, id: i64, digest: u8| {
            let st = stream(s, &[key(id)]);
            let verdict = s.claim(&[key(id)], [digest; 32], &st, room);
            s.keep_reply(&st, reply.clone(), u64::MAX);
            (verdict, st)
        };
        for reuser in [false, true] {
            let s = session();
            for id in 1..=3 {
                let (_, st) = answer(&s, id, 1);
                assert!(matches!(st.wait_head().await, Head::Stored(_)));
            }
            if reuser {
                let (verdict, st) = answer(&s, 3, 2);
                assert!(matches!(verdict, Dedupe::Reused), "{verdict:?}");
                assert!(matches!(st.wait_head().await, Head::Stored(_)));
            }
            // Id 1 was answered and forgotten (the window keeps one): its tombstone keeps no
            // body, so only a session that reuses ids runs it again.
            let (verdict, _) = answer(&s, 1, 9);
            match reuser {
                false => assert!(matches!(verdict, Dedupe::Expired(_)), "{verdict:?}"),
                true => assert!(matches!(verdict, Dedupe::Reused), "{verdict:?}"),
            }
        }
    }

    #[tokio::test]
    async fn retry_state_stays_in_its_budget_by_forgetting_spent_streams_oldest_first() {
        let pod = Retained::new(u64::MAX);
        let s = Session::new(
            "id".into(),
            crate::keys::test_key(),
            None,
            ProtocolVersion::V2025_06_18,
            Journal::new(Value::Null),
            &pod,
        );
        let room = RetryRoom {
            session_bytes: 3_000,
            ..ANY_ROOM
        };
        let reply = StoredReply {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from(vec![b'x'; 1_000]),
        };
        let retry_bytes =
            || pod.bytes(Kind::Records) + pod.bytes(Kind::Replies) + pod.bytes(Kind::Tombstones);
        let claim = |i: i64, room| {
            let st = stream(&s, &[key(i)]);
            (s.claim(&[key(i)], [i as u8; 32], &st, room), st)
        };
        for i in 1..=10 {
            let (verdict, st) = claim(i, room);
            assert!(matches!(verdict, Dedupe::New), "request {i}: {verdict:?}");
            s.keep_reply(&st, reply.clone(), 3_000);
            assert!(matches!(st.wait_head().await, Head::Stored(_)), "served");
            drop(st);
            assert!(
                retry_bytes() <= 3_000,
                "request {i}: {} bytes",
                retry_bytes()
            );
        }
        assert!(
            matches!(claim(10, room).0, Dedupe::Retry(_)),
            "the newest answer is still replayed"
        );
        assert!(
            matches!(claim(1, room).0, Dedupe::Expired(_)),
            "the oldest answer was forgotten; a retry learns so rather than run it twice"
        );
        // Answers nobody was handed are kept: two of them and the records leave no room for a
        // third.
        let (_, unserved_a) = claim(11, room);
        s.keep_reply(&unserved_a, reply.clone(), 3_000);
        let (_, unserved_b) = claim(12, room);
        s.keep_reply(&unserved_b, reply.clone(), 3_000);
        let (_, unserved_c) = claim(13, room);
        s.keep_reply(&unserved_c, reply.clone(), 3_000);
        assert!(matches!(claim(14, room).0, Dedupe::SessionFull(3_000)));
        assert!(matches!(unserved_a.wait_head().await, Head::Stored(_)));
        drop(unserved_a);
        assert!(
            matches!(claim(14, room).0, Dedupe::New),
            "once an answer was served its room is taken back"
        );
        drop((unserved_b, unserved_c, s));
        assert_eq!(
            retry_bytes(),
            0,
            "everything is given back with the session"
        );
    }

    #[test]
    fn credentials_are_the_latest_a_request_presented_and_replace_a_requests_own() {
        use http::header::{ACCEPT, AUTHORIZATION};
        let s = session();
        let names = [AUTHORIZATION, HeaderName::from_static("x-api-key")];
        s.remember_credentials(&HeaderMap::new(), &names);
        assert!(
            !s.is_credentialed(),
            "an anonymous request presents nothing"
        );
        let mut request = HeaderMap::new();
        request.insert(AUTHORIZATION, "Bearer one".parse().unwrap());
        request.insert(ACCEPT, "text/event-stream".parse().unwrap());
        s.remember_credentials(&request, &names);
        let mut own = HeaderMap::new();
        own.insert(AUTHORIZATION, "Bearer stale".parse().unwrap());
        own.insert(ACCEPT, "application/json".parse().unwrap());
        let sent = s.with_credentials(own);
        assert_eq!(sent[AUTHORIZATION], "Bearer one");
        assert_eq!(
            sent[ACCEPT], "application/json",
            "only credential headers are taken"
        );
        s.remember_credentials(&HeaderMap::new(), &names);
        assert_eq!(
            s.with_credentials(HeaderMap::new())[AUTHORIZATION],
            "Bearer one",
            "a request without credentials keeps the latest"
        );
        let (snapshot, _) = s.snapshot(0);
        assert!(
            snapshot.credentialed,
            "the image says so, without the credentials"
        );
    }

    #[test]
    fn idle_only_without_activity() {
        let s = session();
        let later = Instant::now() + Duration::from_secs(10);
        assert!(s.is_idle(later, Duration::from_secs(5)));
        let guard = s.busy();
        assert!(!s.is_idle(later, Duration::from_secs(5)));
        drop(guard);
        let st = stream(&s, &[key(1)]);
        s.claim(&[key(1)], [0; 32], &st, ANY_ROOM);
        assert!(
            !s.is_idle(
                Instant::now() + Duration::from_secs(10),
                Duration::from_secs(5)
            ),
            "a POST waiting for its response keeps the session"
        );
        st.complete();
        assert!(s.is_idle(
            Instant::now() + Duration::from_secs(10),
            Duration::from_secs(5)
        ));
    }

    #[test]
    fn ending_a_session_completes_its_streams() {
        let s = session();
        let st = stream(&s, &[key(1)]);
        s.claim(&[key(1)], [0; 32], &st, ANY_ROOM);
        st.mark_sse(http::HeaderMap::new());
        s.end(&StoredReply {
            status: http::StatusCode::NOT_FOUND,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
        });
        assert!(st.is_complete());
        assert!(
            st.pending().is_empty(),
            "the pending request got an error event"
        );
        assert!(st.cancel_token().is_cancelled());
    }

    #[tokio::test]
    async fn the_initialize_stream_goes_once_its_answer_was_read() {
        let s = session();
        let init = stream(&s, &[]);
        init.append(None, bytes::Bytes::from_static(b"{}"), Instant::now());
        init.complete();
        s.register_stream(&init);
        s.forget_initialize_stream();
        assert_eq!(s.streams().len(), 1, "nobody read its answer yet");
        let mut feed = init.attach(
            crate::stream::Start::After(0),
            true,
            false,
            Duration::from_secs(1),
        );
        assert!(matches!(
            feed.next().await,
            crate::stream::FeedItem::Data(_)
        ));
        drop(feed);
        s.forget_initialize_stream();
        assert!(s.streams().is_empty(), "an idle session keeps no stream");
    }

    /// Room within a retry window of `requests` and `bytes` (60 s), and a small JSON answer.
    fn window_of(requests: usize, bytes: u64) -> (RetryRoom, StoredReply) {
        let room = RetryRoom {
            window: RetryWindow {
                requests,
                bytes,
                ttl: Duration::from_secs(60),
            },
            ..ANY_ROOM
        };
        let reply = StoredReply {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"{}"),
        };
        (room, reply)
    }

    #[tokio::test]
    async fn a_handed_answer_becomes_a_compact_record_that_retries_and_handoffs_replay() {
        let s = session();
        let (room, reply) = window_of(8, u64::MAX);
        let ids = [key(1)];
        let st = stream(&s, &ids);
        assert!(matches!(s.claim(&ids, [1; 32], &st, room), Dedupe::New));
        s.keep_reply(&st, reply.clone(), u64::MAX);
        s.settle(&st);
        assert_eq!(s.streams().len(), 1, "not handed to its client yet");
        assert!(matches!(st.wait_head().await, Head::Stored(_)));
        s.settle(&st);
        assert!(s.streams().is_empty(), "the stream gave way to its record");
        drop(st);
        let retry = |s: &Arc<Session>, digest| {
            let other = stream(s, &ids);
            s.claim(&ids, digest, &other, room)
        };
        match retry(&s, [1; 32]) {
            Dedupe::Answered(again) => assert_eq!(again, reply),
            v => panic!("expected the answer again, got {v:?}"),
        }
        // A handoff image carries the record as a complete stream with its reply.
        let (image, _) = s.snapshot(usize::MAX);
        let pod = Retained::new(u64::MAX);
        let receiver =
            Session::from_parts(image, crate::keys::test_key(), "sender", limits(), &pod);
        match retry(&receiver, [1; 32]) {
            Dedupe::Retry(copy) => {
                assert!(copy.is_complete());
                assert!(matches!(copy.wait_head().await, Head::Stored(r) if r == reply));
            }
            v => panic!("expected the copied stream, got {v:?}"),
        }
        // The TTL forgets the record.
        s.evict_expired(Instant::now() + Duration::from_secs(61));
        assert!(matches!(retry(&s, [1; 32]), Dedupe::Expired(_)));
    }

    #[tokio::test]
    async fn a_handoff_under_way_keeps_streams_live() {
        let s = session();
        let (room, reply) = window_of(8, u64::MAX);
        let st = stream(&s, &[key(1)]);
        s.claim(&[key(1)], [1; 32], &st, room);
        s.keep_reply(&st, reply, u64::MAX);
        drop(st.wait_head().await);
        let transfer = s.begin_move().expect("a held session moves");
        s.settle(&st);
        assert_eq!(s.streams().len(), 1, "the follower still sees the stream");
        drop(transfer);
        s.settle(&st);
        assert!(s.streams().is_empty());
    }

    #[test]
    fn streams_registered_after_the_session_ended_never_wait() {
        let s = session();
        s.end(&StoredReply {
            status: http::StatusCode::NOT_FOUND,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
        });
        // A request that raced the end: nothing registered, so nothing waits unanswered.
        let late = stream(&s, &[key(1)]);
        assert!(matches!(
            s.claim(&[key(1)], [0; 32], &late, ANY_ROOM),
            Dedupe::Ended
        ));
        assert!(s.streams().is_empty());
        let standalone = stream(&s, &[]);
        s.set_standalone(Standalone::Open(Arc::clone(&standalone)));
        assert!(
            standalone.is_complete(),
            "its reader ends instead of waiting"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_mover_waits_for_admitted_requests_to_register() {
        let s = session();
        assert!(
            s.all_entered(Duration::from_secs(2)).await,
            "nothing admitted"
        );
        let Entry::Entered(guard) = s.enter() else {
            panic!("a held session admits requests")
        };
        assert!(
            !s.all_entered(Duration::from_secs(2)).await,
            "a request admitted and not registered holds the mover until the bound"
        );
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.all_entered(Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        drop(guard);
        assert!(waiter.await.unwrap(), "woken when the last one registers");
    }

    #[tokio::test(start_paused = true)]
    async fn the_pods_activity_wakes_when_a_request_ends_or_a_stream_completes() {
        let registry = Registry::new(4, Retained::new(u64::MAX));
        let s = session();
        registry.insert(Arc::clone(&s)).unwrap();
        let woken = || {
            let wait = registry.activity().notified();
            async move {
                tokio::time::timeout(Duration::from_secs(1), wait)
                    .await
                    .is_ok()
            }
        };
        let busy = s.busy();
        let ended = woken();
        drop(busy);
        assert!(ended.await, "a request ended");
        let st = stream(&s, &[key(1)]);
        s.claim(&[key(1)], [0; 32], &st, ANY_ROOM);
        let completed = woken();
        st.complete();
        assert!(completed.await, "a stream completed");
        let quiet = woken();
        assert!(!quiet.await, "nothing happened");
        let left = woken();
        registry.remove(&s, crate::mcp::rejection::NotFound::Deleted);
        assert!(left.await, "a session left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_waits_for_entered_requests_and_holds_new_ones() {
        let s = session();
        let Entry::Entered(guard) = s.enter() else {
            panic!("a held session admits requests")
        };
        let transfer = s.begin_move().expect("a held session moves");
        assert!(s.begin_move().is_none(), "one move at a time");
        assert_eq!(s.entering(), 1);
        assert!(matches!(s.enter(), Entry::Moving));
        drop(guard);
        assert_eq!(s.entering(), 0);
        assert!(!s.settled(Duration::from_millis(20)).await, "still moving");
        transfer.moved("pod-b".into());
        assert!(s.settled(Duration::from_millis(20)).await);
        assert!(matches!(s.enter(), Entry::Moved(uid) if uid == "pod-b"));
        let r = Registry::new(4, Retained::new(u64::MAX));
        let kept = session();
        r.insert(Arc::clone(&kept)).unwrap();
        assert_eq!(kept.advance_epoch(), 1, "the push to pod-c is epoch 1");
        r.mark_moved(&kept, "pod-c");
        assert!(r.get("id").is_none());
        assert_eq!(r.moved_to("id").as_deref(), Some("pod-c"));
        assert!(
            r.departed("id").is_some(),
            "followed until its streams are sent"
        );
        assert!(r.took("id", 1) && !r.took("id", 2));
        r.forget_departed("id", None);
        assert!(r.departed("id").is_none());
    }

    /// A session at `epoch`.
    fn at_epoch(epoch: u64) -> Arc<Session> {
        let s = session();
        for _ in 0..epoch {
            s.advance_epoch();
        }
        s
    }

    #[test]
    fn one_holder_a_push_is_taken_by_its_epoch() {
        let r = Registry::new(4, Retained::new(u64::MAX));
        assert!(matches!(r.adopt(at_epoch(2)), Ok(Adopted::New)));
        assert!(r.took("id", 2) && !r.took("id", 3));
        assert!(
            matches!(r.adopt(at_epoch(2)), Ok(Adopted::Repeated)),
            "a repeated push is acknowledged again"
        );
        assert!(matches!(r.adopt(at_epoch(1)), Err(Refused::Stale(2))));
        let Ok(Adopted::Replaced(stale)) = r.adopt(at_epoch(3)) else {
            panic!("a later epoch replaces an earlier copy");
        };
        assert_eq!(stale.epoch(), 2);
        let held = r.get("id").unwrap();
        assert_eq!(held.epoch(), 3);
        // Handed on at epoch 4: a replay of that push or an older one is never taken again;
        // a later one (the session came back) is.
        held.advance_epoch();
        r.mark_moved(&held, "pod-b");
        assert!(matches!(r.adopt(at_epoch(4)), Err(Refused::Stale(4))));
        assert!(matches!(r.adopt(at_epoch(5)), Ok(Adopted::New)));
        // Ended here: never taken again, whatever the epoch.
        let back = r.get("id").unwrap();
        assert!(r.remove(&back, crate::mcp::rejection::NotFound::Deleted));
        assert!(matches!(r.adopt(at_epoch(9)), Err(Refused::Ended)));
    }
}
