//! Sessions held by this pod and the registry that finds them by client session id.
//!
//! A [`Session`] maps the client's session id (minted by the sidecar) to the upstream's session
//! id, and holds the session's streams, the records that de-duplicate retried requests
//! (DESIGN.md §3.2), the standalone GET stream and the time of the last activity (for
//! `session.idleTimeout`). Memory per session is bounded: at most [`MAX_STREAMS`] streams (the
//! oldest completed ones are forgotten first) and [`MAX_REQUEST_RECORDS`] request records.

pub(crate) mod journal;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tether_crds::ProtocolVersion;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::handoff::wire::{KindImage, ReplyImage, RequestImage, SessionImage, StreamImage};
use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::{Message, RequestKey};
use crate::mcp::rejection::NotFound;
use crate::session::journal::Journal;
use crate::stream::StoredReply;
use crate::stream::buffer::{BufferLimits, Evictions, PodBudget};
use crate::stream::{Stream, StreamKind};

/// Most streams (live or tombstones) one session keeps.
pub(crate) const MAX_STREAMS: usize = 4096;
/// Most request records one session keeps for retry de-duplication.
pub(crate) const MAX_REQUEST_RECORDS: usize = 16384;
/// Most ended sessions remembered for 404 reasons.
const ENDED_LOG: usize = 16384;

/// The session's standalone GET stream (spec T-09).
#[derive(Clone, Debug)]
pub(crate) enum Standalone {
    /// Not opened upstream yet.
    None,
    /// Open: every client GET without `Last-Event-ID` reads this stream.
    Open(Arc<Stream>),
    /// The upstream offers none; its answer (405) is replayed to every GET.
    Unsupported(StoredReply),
}

#[derive(Debug)]
struct RequestRecord {
    digest: [u8; 32],
    stream: StreamKey,
}

#[derive(Debug)]
struct State {
    streams: HashMap<StreamKey, Arc<Stream>>,
    stream_order: VecDeque<StreamKey>,
    requests: HashMap<RequestKey, RequestRecord>,
    request_order: VecDeque<RequestKey>,
    standalone: Standalone,
    last_activity: Instant,
    busy: u32,
    upstream_id: Option<String>,
    journal: Journal,
    /// Requests admitted to this session that have not registered their stream yet.
    entering: u32,
    /// Where the session is in a handoff.
    handoff: HandoffState,
    /// Woken on every change of every stream (the handoff follower), new streams included.
    observer: Option<Arc<Notify>>,
}

/// Where a session is in a handoff (DESIGN.md §3.4 step 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HandoffState {
    /// Served here.
    Held,
    /// Being pushed to a peer: new requests wait until the peer acknowledged or refused.
    Moving,
    /// The peer with this UID acknowledged it: requests go there.
    Moved(String),
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
        self.0.state.lock().entering -= 1;
    }
}

/// What a POST's request ids mean for a session (retry de-duplication, DESIGN.md §3.2).
#[derive(Debug)]
pub(crate) enum Dedupe {
    /// New ids: dispatch upstream.
    New,
    /// The same ids with the same body: a retry; attach to the existing stream.
    Retry(Arc<Stream>),
    /// A known id with a different body, or ids spread over several POSTs: 400 (spec S-09).
    Conflict,
}

/// One client session held by this pod.
#[derive(Debug)]
pub(crate) struct Session {
    id: String,
    digest: String,
    version: ProtocolVersion,
    cancel: CancellationToken,
    state: Mutex<State>,
    /// Serialises opening the upstream standalone GET stream.
    pub(crate) standalone_open: tokio::sync::Mutex<()>,
    /// Serialises rebuilding the upstream session from the journal.
    pub(crate) rebuilding: tokio::sync::Mutex<()>,
    /// The session came from a peer: its upstream session is rebuilt before first use.
    needs_rebuild: AtomicBool,
    /// It came with a standalone stream open at the sender: the rebuild opens one here too.
    reopen_standalone: AtomicBool,
    /// Woken when a handoff ends (acknowledged or refused).
    handoff_settled: Notify,
}

impl Session {
    /// A new session. `digest` is the id's keyed digest, used in logs instead of the id;
    /// `journal` starts with the `initialize` request sent upstream.
    pub(crate) fn new(
        id: String,
        digest: String,
        upstream_id: Option<String>,
        version: ProtocolVersion,
        journal: Journal,
    ) -> Arc<Self> {
        Arc::new(Self {
            id,
            digest,
            version,
            cancel: CancellationToken::new(),
            state: Mutex::new(State {
                streams: HashMap::new(),
                stream_order: VecDeque::new(),
                requests: HashMap::new(),
                request_order: VecDeque::new(),
                standalone: Standalone::None,
                last_activity: Instant::now(),
                busy: 0,
                upstream_id,
                journal,
                entering: 0,
                handoff: HandoffState::Held,
                observer: None,
            }),
            standalone_open: tokio::sync::Mutex::new(()),
            rebuilding: tokio::sync::Mutex::new(()),
            needs_rebuild: AtomicBool::new(false),
            reopen_standalone: AtomicBool::new(false),
            handoff_settled: Notify::new(),
        })
    }

    /// A session handed over by pod `from` (`docs/design/handoff.md`): its streams, retry records and
    /// journal as imaged there; incomplete streams keep following `from`. Its upstream session
    /// is rebuilt from the journal before first use ([`Session::needs_rebuild`]).
    ///
    /// # Errors
    /// A message when the image names an unknown protocol version.
    pub(crate) fn restore(
        image: &SessionImage,
        digest: String,
        from: &str,
        limits: BufferLimits,
        budget: &PodBudget,
    ) -> Result<Arc<Self>, String> {
        let version = ProtocolVersion::parse(&image.version)
            .filter(|v| !v.is_stateless())
            .ok_or_else(|| format!("unknown sessionful version {:?}", image.version))?;
        let session = Self::new(
            image.id.clone(),
            digest,
            None,
            version,
            image.journal.clone(),
        );
        session.needs_rebuild.store(true, Ordering::Relaxed);
        let standalone_open = image
            .streams
            .iter()
            .any(|s| s.kind == KindImage::Standalone && !s.complete);
        session
            .reopen_standalone
            .store(standalone_open, Ordering::Relaxed);
        {
            let mut st = session.state.lock();
            if let Some(Ok(reply)) = image
                .standalone_unsupported
                .as_ref()
                .map(ReplyImage::to_reply)
            {
                st.standalone = Standalone::Unsupported(reply);
            }
        }
        session.import_streams(&image.streams, &image.requests, from, limits, budget);
        Ok(session)
    }

    /// Applies streams and retry records sent by pod `from`: known streams take the new
    /// events and state, unknown ones are created. Returns how many events were new.
    pub(crate) fn import_streams(
        &self,
        streams: &[StreamImage],
        requests: &[RequestImage],
        from: &str,
        limits: BufferLimits,
        budget: &PodBudget,
    ) -> usize {
        let mut added = 0;
        let mut st = self.state.lock();
        for image in streams {
            match st.streams.get(&image.key) {
                Some(stream) => added += stream.apply(image),
                None => {
                    let stream = Stream::restore(
                        image,
                        limits,
                        budget.clone(),
                        self.cancel.child_token(),
                        from,
                    );
                    added += image.events.len();
                    Self::insert_stream(&mut st, &stream);
                }
            }
        }
        for r in requests {
            let mut digest = [0u8; 32];
            if hex::decode_to_slice(&r.digest, &mut digest).is_ok()
                && !st.requests.contains_key(&r.id)
            {
                st.requests.insert(
                    r.id.clone(),
                    RequestRecord {
                        digest,
                        stream: r.stream.clone(),
                    },
                );
                st.request_order.push_back(r.id.clone());
            }
        }
        added
    }

    /// The session as a handoff image, with at most `max_bytes` of event data in all (each
    /// stream gets at least its oldest unsent event). Returns the image and, per stream, the
    /// sequence the receiver will be at (the follower sends the rest).
    pub(crate) fn image(&self, max_bytes: usize) -> (SessionImage, HashMap<StreamKey, u64>) {
        let st = self.state.lock();
        let mut budget = max_bytes;
        let mut positions = HashMap::with_capacity(st.streams.len());
        let mut streams = Vec::with_capacity(st.streams.len());
        for key in &st.stream_order {
            let Some(stream) = st.streams.get(key) else {
                continue;
            };
            let (image, at) = stream.image(0, budget);
            let size: usize = image.events.iter().map(|e| e.data.len()).sum();
            budget = budget.saturating_sub(size);
            positions.insert(key.clone(), at);
            streams.push(image);
        }
        let requests = Self::request_images(&st, None);
        let image = SessionImage {
            id: self.id.clone(),
            version: self.version.as_str().to_owned(),
            journal: st.journal.clone(),
            requests,
            streams,
            standalone_unsupported: match &st.standalone {
                Standalone::Unsupported(reply) => Some(ReplyImage::from(reply)),
                _ => None,
            },
        };
        (image, positions)
    }

    /// Retry records of the streams in `only` (every record with `None`).
    fn request_images(st: &State, only: Option<&[StreamKey]>) -> Vec<RequestImage> {
        st.request_order
            .iter()
            .filter_map(|id| {
                let rec = st.requests.get(id)?;
                if only.is_some_and(|keys| !keys.contains(&rec.stream)) {
                    return None;
                }
                Some(RequestImage {
                    id: id.clone(),
                    digest: hex::encode(rec.digest),
                    stream: rec.stream.clone(),
                })
            })
            .collect()
    }

    /// Retry records of the streams `keys` (new streams sent in a tail message).
    pub(crate) fn requests_of(&self, keys: &[StreamKey]) -> Vec<RequestImage> {
        Self::request_images(&self.state.lock(), Some(keys))
    }

    /// Whether the upstream session must be rebuilt from the journal before first use (the
    /// session came from a peer).
    pub(crate) fn needs_rebuild(&self) -> bool {
        self.needs_rebuild.load(Ordering::Relaxed)
    }

    /// Records that the upstream session was rebuilt.
    pub(crate) fn rebuilt(&self) {
        self.needs_rebuild.store(false, Ordering::Relaxed);
    }

    /// Whether the rebuilt upstream session needs a standalone stream at once (the sender had
    /// one open); `true` only once.
    pub(crate) fn take_reopen_standalone(&self) -> bool {
        self.reopen_standalone.swap(false, Ordering::Relaxed)
    }

    /// Admits a request into the session, unless a handoff is moving or moved it.
    pub(crate) fn enter(self: &Arc<Self>) -> Entry {
        let mut st = self.state.lock();
        match &st.handoff {
            HandoffState::Held => {
                st.entering += 1;
                Entry::Entered(EnterGuard(Arc::clone(self)))
            }
            HandoffState::Moving => Entry::Moving,
            HandoffState::Moved(to) => Entry::Moved(to.clone()),
        }
    }

    /// Starts a handoff; `false` when one is under way or done.
    pub(crate) fn begin_move(&self) -> bool {
        let mut st = self.state.lock();
        if st.handoff != HandoffState::Held {
            return false;
        }
        st.handoff = HandoffState::Moving;
        true
    }

    /// Requests admitted and not registered yet.
    pub(crate) fn entering(&self) -> u32 {
        self.state.lock().entering
    }

    /// Ends a handoff: acknowledged by `to`, or refused everywhere (`None`: served here again).
    pub(crate) fn finish_move(&self, to: Option<String>) {
        self.state.lock().handoff = match to {
            Some(uid) => HandoffState::Moved(uid),
            None => HandoffState::Held,
        };
        self.handoff_settled.notify_waiters();
    }

    /// Waits until a handoff under way ends, at most `bound`; returns whether it did.
    pub(crate) async fn settled(&self, bound: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.handoff_settled.notified();
                if self.state.lock().handoff != HandoffState::Moving {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(bound, wait).await.is_ok()
    }

    /// Wakes `observer` on every change of every stream, present and future.
    pub(crate) fn observe(&self, observer: &Arc<Notify>) {
        let mut st = self.state.lock();
        st.observer = Some(Arc::clone(observer));
        for stream in st.streams.values() {
            stream.observe(observer);
        }
    }

    /// The client session id (never log it; use [`Session::digest`]).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The keyed digest that stands for the id in logs.
    pub(crate) fn digest(&self) -> &str {
        &self.digest
    }

    /// The upstream's session id (it changes when the session is rebuilt).
    pub(crate) fn upstream_id(&self) -> Option<String> {
        self.state.lock().upstream_id.clone()
    }

    /// Switches to a rebuilt upstream session.
    pub(crate) fn set_upstream_id(&self, id: Option<String>) {
        self.state.lock().upstream_id = id;
    }

    /// Records a client message in the journal if it belongs there.
    pub(crate) fn record(&self, message: &Message, raw: &Value) {
        self.state.lock().journal.record(message, raw);
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

    /// Classifies the request ids of a POST against the session's records and, when they are
    /// new, registers `stream` for them, atomically (concurrent retries dispatch once).
    pub(crate) fn claim(
        &self,
        ids: &[RequestKey],
        digest: [u8; 32],
        stream: &Arc<Stream>,
    ) -> Dedupe {
        let mut st = self.state.lock();
        let verdict = Self::classify(&st, ids, digest);
        if matches!(verdict, Dedupe::New) {
            Self::insert_stream(&mut st, stream);
            for id in ids {
                st.requests.insert(
                    id.clone(),
                    RequestRecord {
                        digest,
                        stream: stream.key().clone(),
                    },
                );
                st.request_order.push_back(id.clone());
            }
            while st.request_order.len() > MAX_REQUEST_RECORDS {
                if let Some(old) = st.request_order.pop_front() {
                    st.requests.remove(&old);
                }
            }
        }
        verdict
    }

    fn classify(st: &State, ids: &[RequestKey], digest: [u8; 32]) -> Dedupe {
        let mut found: Option<&StreamKey> = None;
        let mut unknown = 0;
        for id in ids {
            match st.requests.get(id) {
                None => unknown += 1,
                Some(rec) if rec.digest != digest => return Dedupe::Conflict,
                Some(rec) => match found {
                    Some(key) if *key != rec.stream => return Dedupe::Conflict,
                    _ => found = Some(&rec.stream),
                },
            }
        }
        match found {
            None => Dedupe::New,
            Some(_) if unknown > 0 => Dedupe::Conflict,
            Some(key) => match st.streams.get(key) {
                Some(stream) => Dedupe::Retry(Arc::clone(stream)),
                // The stream was forgotten (over MAX_STREAMS): its events cannot be replayed.
                None => Dedupe::Conflict,
            },
        }
    }

    /// Forgets a POST the upstream never received (so a retry dispatches it again).
    pub(crate) fn unregister_post(&self, stream: &Stream, ids: &[RequestKey]) {
        let mut st = self.state.lock();
        st.streams.remove(stream.key());
        for id in ids {
            st.requests.remove(id);
        }
    }

    /// Registers a stream that no request id leads to (the `initialize` response stream).
    pub(crate) fn register_stream(&self, stream: &Arc<Stream>) {
        Self::insert_stream(&mut self.state.lock(), stream);
    }

    fn insert_stream(st: &mut State, stream: &Arc<Stream>) {
        if let Some(observer) = &st.observer {
            stream.observe(observer);
        }
        st.streams.insert(stream.key().clone(), Arc::clone(stream));
        st.stream_order.push_back(stream.key().clone());
        let mut budget = st.stream_order.len().saturating_sub(MAX_STREAMS);
        if budget == 0 {
            return;
        }
        let mut kept = VecDeque::with_capacity(st.stream_order.len());
        while let Some(key) = st.stream_order.pop_front() {
            let forget = budget > 0
                && st
                    .streams
                    .get(&key)
                    .is_none_or(|s| s.is_complete() && !s.is_active());
            if forget {
                st.streams.remove(&key);
                budget -= 1;
            } else {
                kept.push_back(key);
            }
        }
        st.stream_order = kept;
    }

    /// The stream with `key`, if this session has it.
    pub(crate) fn stream(&self, key: &StreamKey) -> Option<Arc<Stream>> {
        self.state.lock().streams.get(key).cloned()
    }

    /// The stream that carries the response to request `id`.
    pub(crate) fn stream_of_request(&self, id: &RequestKey) -> Option<Arc<Stream>> {
        let st = self.state.lock();
        let rec = st.requests.get(id)?;
        st.streams.get(&rec.stream).cloned()
    }

    /// The first standalone stream registered after stream `key` (the chain a client's
    /// standalone GET follows across handoffs: the old holder's, then each new holder's).
    pub(crate) fn next_standalone(&self, key: &StreamKey) -> Option<Arc<Stream>> {
        let st = self.state.lock();
        st.stream_order
            .iter()
            .skip_while(|k| *k != key)
            .skip(1)
            .filter_map(|k| st.streams.get(k))
            .find(|s| s.kind() == StreamKind::Standalone)
            .cloned()
    }

    /// The standalone stream state.
    pub(crate) fn standalone(&self) -> Standalone {
        self.state.lock().standalone.clone()
    }

    /// Sets the standalone stream state (an open stream is also registered for resumes).
    pub(crate) fn set_standalone(&self, standalone: Standalone) {
        let mut st = self.state.lock();
        if let Standalone::Open(stream) = &standalone {
            Self::insert_stream(&mut st, stream);
        }
        st.standalone = standalone;
    }

    /// Forgets the standalone stream `stream` (its upstream gave up); the next GET reopens one.
    pub(crate) fn clear_standalone(&self, stream: &Stream) {
        let mut st = self.state.lock();
        if matches!(&st.standalone, Standalone::Open(s) if s.key() == stream.key()) {
            st.standalone = Standalone::None;
        }
    }

    /// Whether nothing happened for `idle` at `now`: no request being handled, no attached
    /// reader, no POST waiting for its response.
    pub(crate) fn is_idle(&self, now: Instant, idle: Duration) -> bool {
        let st = self.state.lock();
        st.busy == 0
            && now.saturating_duration_since(st.last_activity) >= idle
            && st.streams.values().all(|s| !s.is_active())
    }

    /// Whether a request of the session is being handled or a POST waits for its response.
    pub(crate) fn in_flight(&self) -> bool {
        let st = self.state.lock();
        st.busy > 0
            || st
                .streams
                .values()
                .any(|s| s.kind().answers_requests() && !s.is_complete())
    }

    /// Evicts expired events of every stream.
    pub(crate) fn evict_expired(&self, now: Instant) -> Evictions {
        let streams = self.streams();
        let mut total = Evictions::default();
        for s in streams {
            let e = s.evict_expired(now);
            total.count += e.count;
            total.bytes += e.bytes;
            total.ttl += e.ttl;
            total.pod_cap += e.pod_cap;
        }
        total
    }

    /// Every stream of the session.
    pub(crate) fn streams(&self) -> Vec<Arc<Stream>> {
        self.state.lock().streams.values().cloned().collect()
    }

    /// Streams held, and events and bytes buffered over all of them.
    pub(crate) fn buffered(&self) -> (usize, usize, u64) {
        let st = self.state.lock();
        let (mut events, mut bytes) = (0, 0);
        for s in st.streams.values() {
            let (e, b) = s.buffered();
            events += e;
            bytes += b;
        }
        (st.streams.len(), events, bytes)
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
        let mut st = self.0.state.lock();
        st.busy -= 1;
        st.last_activity = Instant::now();
    }
}

/// Why a new session could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this pod holds its maximum of {0} sessions")]
pub(crate) struct TooManySessions(pub usize);

/// A bounded map that forgets its oldest entries first.
#[derive(Debug)]
struct BoundedLog<V> {
    entries: HashMap<String, V>,
    order: VecDeque<String>,
}

impl<V> Default for BoundedLog<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<V> BoundedLog<V> {
    fn insert(&mut self, key: String, value: V) {
        if self.entries.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > ENDED_LOG {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }
}

/// The sessions this pod holds, by client session id.
#[derive(Debug)]
pub(crate) struct Registry {
    sessions: RwLock<HashMap<String, Arc<Session>>>,
    /// Why sessions ended, by id digest.
    ended: Mutex<BoundedLog<NotFound>>,
    /// Where handed-off sessions went: client session id → UID of the new holder.
    moved: Mutex<BoundedLog<String>>,
    /// Handed-off sessions whose streams are still forwarded to the new holder, by id.
    departed: Mutex<HashMap<String, Arc<Session>>>,
    max_sessions: usize,
}

impl Registry {
    /// An empty registry holding at most `max_sessions`.
    pub(crate) fn new(max_sessions: usize) -> Self {
        Self {
            sessions: RwLock::new(HashMap::new()),
            ended: Mutex::new(BoundedLog::default()),
            moved: Mutex::new(BoundedLog::default()),
            departed: Mutex::new(HashMap::new()),
            max_sessions,
        }
    }

    /// Whether another session fits.
    pub(crate) fn has_room(&self) -> bool {
        self.sessions.read().len() < self.max_sessions
    }

    /// Registers a session.
    ///
    /// # Errors
    /// [`TooManySessions`] when the pod is full.
    pub(crate) fn insert(&self, session: Arc<Session>) -> Result<(), TooManySessions> {
        let mut map = self.sessions.write();
        if map.len() >= self.max_sessions {
            return Err(TooManySessions(self.max_sessions));
        }
        map.insert(session.id.clone(), session);
        Ok(())
    }

    /// The session with client id `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.read().get(id).cloned()
    }

    /// Removes a session, remembering why (for the 404 reason of later requests).
    pub(crate) fn remove(&self, session: &Session, reason: NotFound) -> bool {
        let removed = self.sessions.write().remove(&session.id).is_some();
        if removed {
            self.ended.lock().insert(session.digest.clone(), reason);
        }
        removed
    }

    /// Forgets a session a peer (`to`) acknowledged; requests for it are sent there. It stays
    /// *departed* (its streams still forwarded) until [`Registry::forget_departed`].
    pub(crate) fn mark_moved(&self, session: &Arc<Session>, to: &str) {
        self.sessions.write().remove(&session.id);
        self.moved.lock().insert(session.id.clone(), to.to_owned());
        self.departed
            .lock()
            .insert(session.id.clone(), Arc::clone(session));
    }

    /// A departed session (handed off, streams still forwarded) with client id `id`.
    pub(crate) fn departed(&self, id: &str) -> Option<Arc<Session>> {
        self.departed.lock().get(id).cloned()
    }

    /// Departed sessions.
    pub(crate) fn departed_count(&self) -> usize {
        self.departed.lock().len()
    }

    /// Every departed session.
    pub(crate) fn all_departed(&self) -> Vec<Arc<Session>> {
        self.departed.lock().values().cloned().collect()
    }

    /// The streams of a departed session are all forwarded: forget it.
    pub(crate) fn forget_departed(&self, id: &str) {
        self.departed.lock().remove(id);
    }

    /// The UID of the peer a session was handed to, if it was handed off from here.
    pub(crate) fn moved_to(&self, id: &str) -> Option<String> {
        self.moved.lock().entries.get(id).cloned()
    }

    /// Registers a session handed over by a peer; a session already held is kept (a repeated
    /// push is acknowledged again). Returns whether it was new.
    ///
    /// # Errors
    /// [`TooManySessions`] when the pod is full.
    pub(crate) fn adopt(&self, session: Arc<Session>) -> Result<bool, TooManySessions> {
        let mut map = self.sessions.write();
        if map.contains_key(&session.id) {
            return Ok(false);
        }
        if map.len() >= self.max_sessions {
            return Err(TooManySessions(self.max_sessions));
        }
        map.insert(session.id.clone(), session);
        drop(map);
        Ok(true)
    }

    /// Why a genuine id with this digest is not held: how it ended, or [`NotFound::Unknown`].
    pub(crate) fn why_missing(&self, digest: &str) -> NotFound {
        self.ended
            .lock()
            .entries
            .get(digest)
            .copied()
            .unwrap_or(NotFound::Unknown)
    }

    /// A snapshot of every session.
    pub(crate) fn all(&self) -> Vec<Arc<Session>> {
        self.sessions.read().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::StreamKind;
    use crate::stream::buffer::{BufferLimits, PodBudget};

    fn session() -> Arc<Session> {
        Session::new(
            "id".into(),
            "digest".into(),
            None,
            ProtocolVersion::V2025_06_18,
            Journal::new(Value::Null),
        )
    }

    fn stream(s: &Session, ids: &[RequestKey]) -> Arc<Stream> {
        Stream::new(
            StreamKind::Post,
            ids.to_vec(),
            BufferLimits {
                max_events: 8,
                max_bytes: 1024,
                ttl: Duration::from_secs(60),
            },
            PodBudget::new(u64::MAX),
            s.child_token(),
        )
    }

    fn key(i: i64) -> RequestKey {
        RequestKey::of(&Value::from(i))
    }

    #[test]
    fn retries_attach_and_conflicts_are_refused() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        assert!(matches!(s.claim(&ids, [1; 32], &st), Dedupe::New));
        let other = stream(&s, &ids);
        match s.claim(&ids, [1; 32], &other) {
            Dedupe::Retry(found) => assert_eq!(found.key(), st.key()),
            v => panic!("expected a retry, got {v:?}"),
        }
        assert!(matches!(s.claim(&ids, [2; 32], &other), Dedupe::Conflict));
        assert!(matches!(
            s.claim(&[key(1), key(2)], [1; 32], &other),
            Dedupe::Conflict
        ));
        s.unregister_post(&st, &ids);
        assert!(matches!(s.claim(&ids, [1; 32], &other), Dedupe::New));
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
        s.claim(&[key(1)], [0; 32], &st);
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
    fn the_registry_remembers_why_sessions_ended() {
        let r = Registry::new(1);
        let s = session();
        r.insert(Arc::clone(&s)).unwrap();
        assert_eq!(r.insert(session()), Err(TooManySessions(1)));
        assert!(r.remove(&s, NotFound::Deleted));
        assert!(r.get("id").is_none());
        assert_eq!(r.why_missing("digest"), NotFound::Deleted);
        assert_eq!(r.why_missing("other"), NotFound::Unknown);
    }

    #[test]
    fn ending_a_session_completes_its_streams() {
        let s = session();
        let st = stream(&s, &[key(1)]);
        s.claim(&[key(1)], [0; 32], &st);
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

    #[test]
    fn an_imaged_session_is_restored_with_its_streams_and_retry_records() {
        let s = session();
        let ids = [key(1)];
        let st = stream(&s, &ids);
        s.claim(&ids, [7; 32], &st);
        st.append(None, bytes::Bytes::from_static(b"{}"), Instant::now());
        let (image, positions) = s.image(1 << 20);
        assert_eq!(positions.get(st.key()), Some(&1));
        let copy = Session::restore(
            &image,
            "digest".into(),
            "pod-a",
            BufferLimits {
                max_events: 8,
                max_bytes: 1024,
                ttl: Duration::from_secs(60),
            },
            &PodBudget::new(u64::MAX),
        )
        .unwrap();
        assert!(copy.needs_rebuild());
        assert_eq!(copy.version(), s.version());
        assert_eq!(copy.journal(), s.journal());
        // A retried POST at the new holder attaches to the copied stream: no second dispatch.
        let retry = stream(&copy, &ids);
        match copy.claim(&ids, [7; 32], &retry) {
            Dedupe::Retry(found) => {
                assert_eq!(found.key(), st.key());
                assert_eq!(found.following().as_deref(), Some("pod-a"));
            }
            v => panic!("expected a retry, got {v:?}"),
        }
        assert!(matches!(
            copy.claim(&ids, [8; 32], &retry),
            Dedupe::Conflict
        ));
        let mut bad = image.clone();
        bad.version = "2026-07-28".into();
        assert!(
            Session::restore(
                &bad,
                "d".into(),
                "pod-a",
                BufferLimits {
                    max_events: 8,
                    max_bytes: 1024,
                    ttl: Duration::from_secs(60),
                },
                &PodBudget::new(u64::MAX)
            )
            .is_err(),
            "a stateless version has no session"
        );
    }

    #[tokio::test]
    async fn a_move_waits_for_entered_requests_and_holds_new_ones() {
        let s = session();
        let Entry::Entered(guard) = s.enter() else {
            panic!("a held session admits requests")
        };
        assert!(s.begin_move());
        assert!(!s.begin_move(), "one move at a time");
        assert_eq!(s.entering(), 1);
        assert!(matches!(s.enter(), Entry::Moving));
        drop(guard);
        assert_eq!(s.entering(), 0);
        assert!(!s.settled(Duration::from_millis(20)).await, "still moving");
        s.finish_move(Some("pod-b".into()));
        assert!(s.settled(Duration::from_millis(20)).await);
        assert!(matches!(s.enter(), Entry::Moved(uid) if uid == "pod-b"));
        let r = Registry::new(4);
        let kept = session();
        r.insert(Arc::clone(&kept)).unwrap();
        r.mark_moved(&kept, "pod-c");
        assert!(r.get("id").is_none());
        assert_eq!(r.moved_to("id").as_deref(), Some("pod-c"));
        assert!(
            r.departed("id").is_some(),
            "followed until its streams are sent"
        );
        r.forget_departed("id");
        assert!(r.departed("id").is_none());
        assert_eq!(r.adopt(session()), Ok(true));
        assert_eq!(
            r.adopt(session()),
            Ok(false),
            "a repeated push is acknowledged again"
        );
    }
}
