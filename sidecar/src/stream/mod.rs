//! One SSE stream of a session and the client connections that read it
//! (`docs/design/architecture.md#streams-and-the-replay-buffer`).
//!
//! A [`Stream`] is written by the upstream task that owns it (a POST's response, or the
//! standalone GET stream) and read by at most one client connection at a time through a
//! [`Feed`]. Clients are served from the [`StreamBuffer`], never straight from the upstream, so a
//! client that disconnects and resumes with `Last-Event-ID` misses nothing (spec L-01, R-03).
//! A new reader takes the stream over: the previous connection ends cleanly (never 409, T-09).

pub(crate) mod buffer;
mod feed;
mod stored;

pub(crate) use feed::{Feed, FeedItem};
pub(crate) use stored::{StoredReply, refuses_caller};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::CODE_INTERNAL;
use crate::mcp::jsonrpc::{RequestKey, error_response, response_id};
use crate::retained::BufferAccount;
use crate::retained::{Held, Shared};
use crate::stream::buffer::{BufferLimits, Evictions, ReplayError, StreamBuffer};

/// Sequence numbers skipped when a followed stream's writer dies: more than it can have
/// numbered without forwarding them.
pub(crate) const ABANDONED_WRITER_GAP: u64 = 1 << 20;

/// Events a running stream numbers before the replica of its session, which does not carry
/// them, is sent again with its numbering: half of [`ABANDONED_WRITER_GAP`], so a promoted
/// stream always numbers past what its lost holder sent.
pub(crate) const REPLICA_NUMBERING_STEP: u64 = ABANDONED_WRITER_GAP / 2;

/// What a stream carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// The response stream of a POST with one request.
    Post,
    /// The response stream of a 2025-03-26 batch (answers always arrive as events).
    Batch,
    /// The session's standalone GET stream (server-initiated messages).
    Standalone,
}

impl StreamKind {
    /// Whether the stream carries responses to client requests (and completes with them).
    pub(crate) fn answers_requests(self) -> bool {
        matches!(self, StreamKind::Post | StreamKind::Batch)
    }
}

/// How the upstream answered a POST.
#[derive(Clone, Debug)]
pub(crate) enum Head {
    /// An SSE stream, served from the buffer; its end-to-end headers pass to the client.
    Sse(HeaderMap),
    /// A complete non-SSE answer (JSON, 202, an error), replayed verbatim.
    Stored(StoredReply),
}

/// Where a new reader starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Strictly after this sequence number (0 = from the first event).
    After(u64),
    /// After the last event already written to some connection: a plain `GET` without
    /// `Last-Event-ID` gets what no client has been sent yet.
    Undelivered,
}

#[derive(Debug)]
struct State {
    buffer: StreamBuffer,
    /// Requests of the POST still waiting for their response.
    pending: Vec<RequestKey>,
    /// No more events will come.
    complete: bool,
    /// The upstream's non-SSE answer to the POST (JSON, 202 or an error), kept for retries.
    stored: Option<StoredReply>,
    /// `stored`'s bytes in its session's tally (once the stream belongs to a session).
    stored_held: Option<Held>,
    /// `stored` was handed to a client connection.
    reply_served: bool,
    /// The upstream answered with an SSE stream, with these end-to-end headers.
    sse: Option<HeaderMap>,
    /// Generation of readers; a reader that takes the stream over increments it, and readers
    /// of older generations end.
    reader_gen: u64,
    /// Readers attached (of any generation), each with its position: the sequence it was
    /// sent up to. The buffer's floor is the lowest of these and `delivered`.
    readers: Vec<Reader>,
    /// Id of the next reader to attach.
    next_reader: u64,
    /// Highest sequence number written to some connection.
    delivered: u64,
    /// Highest sequence number forwarded to the pod the session moved to.
    forwarded: u64,
    /// UID of the pod that still writes this stream (a handed-off stream whose request runs
    /// there; its events arrive through the peer protocol). No priming number is reserved
    /// here meanwhile, so the numbering stays the writer's.
    following: Option<String>,
    /// The session moved: readers get what is buffered, then `retry:` with this hint and a
    /// clean close, and resume at the new holder (negotiated ≥ 2025-11-25, spec R-06/R-07).
    moved_retry: Option<Duration>,
    /// The POST's request was not carried out ([`Stream::withdraw`]): `stored` answers the
    /// connections that waited for it, and it is no request's outcome.
    withdrawn: bool,
    /// A client may hold a cursor of it although none was sent an event here: it came from
    /// another pod (a handoff).
    read_elsewhere: bool,
}

/// One attached reader ([`Feed`]) and the sequence it was sent up to.
#[derive(Clone, Copy, Debug)]
struct Reader {
    id: u64,
    after: u64,
}

impl State {
    /// Whether no client was ever sent anything of the stream, nor reads it now: no cursor of
    /// it exists, only a retry of its request could read it (`--unread-ttl`).
    fn never_read(&self) -> bool {
        !self.read_elsewhere
            && self.readers.is_empty()
            && self.delivered == 0
            && self.forwarded == 0
            && !self.reply_served
    }

    /// How long its events stay: `--unread-ttl` while it was never read, else `buffer.ttl`.
    fn ttl(&self) -> Duration {
        if self.never_read() {
            self.buffer.unread_ttl()
        } else {
            self.buffer.ttl()
        }
    }

    /// Moves the buffer's floor to what every reader was sent (the lowest of their positions,
    /// and of the newest event written to a connection or forwarded to the new holder): events
    /// up to there may be evicted, later ones wait for their reader. Returns whether the floor
    /// rose (the writer may have room again).
    fn refloor(&mut self) -> bool {
        let floor = self
            .readers
            .iter()
            .map(|r| r.after)
            .fold(self.delivered.max(self.forwarded), u64::min);
        let rose = floor > self.buffer.floor();
        self.buffer.set_floor(floor);
        rose
    }
}

/// A copy of a stream's state for another pod (a handoff): what it carries, where its
/// numbering and its answer stand, and (some of) its buffered events.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StreamSnapshot {
    /// The stream key (the first part of its event ids).
    pub(crate) key: StreamKey,
    /// What it carries.
    pub(crate) kind: StreamKind,
    /// Requests still waiting for their response.
    pub(crate) pending: Vec<RequestKey>,
    /// No more events will come, and every event is in this copy or in an earlier one.
    pub(crate) complete: bool,
    /// The upstream's non-SSE answer to the POST, when it gave one.
    pub(crate) stored: Option<StoredReply>,
    /// The end-to-end headers of the upstream's SSE answer, when it gave one.
    pub(crate) sse: Option<HeaderMap>,
    /// Sequence of the newest event or reserved (priming) number.
    pub(crate) last_seq: u64,
    /// Events at or below this sequence were evicted.
    pub(crate) evicted_through: u64,
    /// Buffered events after the receiver's position, oldest first.
    pub(crate) events: Vec<SnapshotEvent>,
    /// The POST's request was not carried out ([`Stream::withdraw`]).
    pub(crate) withdrawn: bool,
}

/// One buffered event of a [`StreamSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotEvent {
    /// Sequence number on its stream (the event id is `<key>-<seq>`).
    pub(crate) seq: u64,
    /// The SSE `event:` field, if any.
    pub(crate) event: Option<String>,
    /// The SSE `data:` payload (a JSON-RPC message).
    pub(crate) data: Bytes,
}

/// What tells a session's change feed (`session/feed.rs`) of a change: the session, and each
/// of its streams.
#[derive(Clone, Debug)]
pub(crate) struct Teller {
    changes: watch::Sender<()>,
    /// Subscribers that follow events too.
    event_followers: Arc<AtomicUsize>,
}

impl Teller {
    /// A feed's teller, followed by nobody yet.
    pub(crate) fn new() -> Self {
        Self {
            changes: watch::channel(()).0,
            event_followers: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Tells every subscriber something changed. With nobody subscribed the send (a lock, on
    /// every change of every stream) is skipped: a later subscriber reads the change after
    /// subscribing.
    pub(crate) fn tell(&self) {
        if self.changes.receiver_count() > 0 {
            self.changes.send_replace(());
        }
    }

    /// Tells of an event that changed nothing else about its stream (no answer, no end): only
    /// subscribers that follow events hear of it.
    pub(crate) fn tell_event(&self) {
        if self.event_followers.load(Ordering::Relaxed) > 0 {
            self.tell();
        }
    }

    /// A new follower's end; with `events`, counted among those that follow events until it
    /// decrements the count returned.
    pub(crate) fn follow(&self, events: bool) -> (watch::Receiver<()>, Option<Arc<AtomicUsize>>) {
        let counted = events.then(|| {
            self.event_followers.fetch_add(1, Ordering::Relaxed);
            Arc::clone(&self.event_followers)
        });
        (self.changes.subscribe(), counted)
    }
}

/// Why a followed stream's writer will write no more: the error its pending requests end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriterLost {
    /// The pod that handed the session off stopped while the request still ran there
    /// (`data.reason` = `handoff_interrupted`).
    Handoff,
    /// The session's holder was lost without warning and its replica took over
    /// (`data.reason` = `holder_lost`, `docs/design/replication.md#promotion`).
    Holder,
}

impl WriterLost {
    /// The JSON-RPC error's message and `data.reason`.
    fn error(self) -> (&'static str, &'static str) {
        match self {
            Self::Handoff => (
                "the pod running this request stopped before it finished",
                "handoff_interrupted",
            ),
            Self::Holder => (
                "the pod running this request was lost before it finished",
                "holder_lost",
            ),
        }
    }
}

/// One stream: buffer, completion state and reader hand-over.
#[derive(Debug)]
pub(crate) struct Stream {
    key: StreamKey,
    kind: StreamKind,
    cancel: CancellationToken,
    state: Mutex<State>,
    changed: watch::Sender<()>,
    /// Woken when the buffer's floor rises: its writer may have room again
    /// ([`Stream::wait_room`]).
    room: Notify,
    /// Its session's change feed, told of every change.
    feed: OnceLock<Teller>,
    /// Woken (all waiters) when the stream completes: the pod's activity, which a drain waits on.
    activity: OnceLock<Arc<Notify>>,
    /// The session's tally of stored replies, which this stream's reply is counted in.
    replies: OnceLock<Arc<Shared>>,
    /// When this pod created it (the oldest answered streams are forgotten first).
    created: Instant,
}

impl Stream {
    /// A new open stream. `pending` lists the requests whose responses it will carry;
    /// `cancel` stops its upstream task (a child of the session's token).
    pub(crate) fn new(
        kind: StreamKind,
        pending: Vec<RequestKey>,
        limits: BufferLimits,
        budget: BufferAccount,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let buffer = StreamBuffer::new(limits, budget);
        Self::build(StreamKey::random(), kind, pending, buffer, cancel, None)
    }

    /// A copy of a stream another pod holds (a handoff, `docs/design/handoff.md`), written by
    /// pod `following` until `snapshot` says it is complete.
    pub(crate) fn from_snapshot(
        snapshot: &StreamSnapshot,
        limits: BufferLimits,
        budget: BufferAccount,
        cancel: CancellationToken,
        following: &str,
    ) -> Arc<Self> {
        let buffer = StreamBuffer::new(limits, budget);
        let following = Some(following.to_owned());
        let stream = Self::build(
            snapshot.key.clone(),
            snapshot.kind,
            Vec::new(),
            buffer,
            cancel,
            following,
        );
        stream.apply(snapshot);
        stream
    }

    fn build(
        key: StreamKey,
        kind: StreamKind,
        pending: Vec<RequestKey>,
        buffer: StreamBuffer,
        cancel: CancellationToken,
        following: Option<String>,
    ) -> Arc<Self> {
        let read_elsewhere = following.is_some();
        Arc::new(Self {
            key,
            kind,
            cancel,
            state: Mutex::new(State {
                buffer,
                pending,
                complete: false,
                stored: None,
                stored_held: None,
                reply_served: false,
                sse: None,
                reader_gen: 0,
                readers: Vec::new(),
                next_reader: 0,
                delivered: 0,
                forwarded: 0,
                following,
                moved_retry: None,
                withdrawn: false,
                read_elsewhere,
            }),
            changed: watch::channel(()).0,
            room: Notify::new(),
            feed: OnceLock::new(),
            activity: OnceLock::new(),
            replies: OnceLock::new(),
            created: Instant::now(),
        })
    }

    /// Applies what the writing pod sent: new events (numbered by it), its numbering, the
    /// pending requests, its answer's head, and completion (which ends the following).
    /// Returns how many events were new.
    pub(crate) fn apply(&self, snapshot: &StreamSnapshot) -> usize {
        let now = Instant::now();
        let mut st = self.state.lock();
        let mut added = 0;
        st.buffer.follow(0, snapshot.evicted_through);
        for ev in &snapshot.events {
            if st
                .buffer
                .put(ev.seq, ev.event.clone(), ev.data.clone(), now)
                .is_some()
            {
                added += 1;
            }
        }
        st.buffer
            .follow(snapshot.last_seq, snapshot.evicted_through);
        if !st.complete {
            st.pending.clone_from(&snapshot.pending);
            if let Some(stored) = &snapshot.stored {
                self.set_stored(&mut st, stored.clone());
            }
            if let Some(sse) = &snapshot.sse {
                st.sse = Some(sse.clone());
            }
            st.withdrawn |= snapshot.withdrawn;
            if snapshot.complete {
                st.complete = true;
                st.following = None;
            }
        }
        let complete = st.complete;
        drop(st);
        self.touch();
        if complete {
            self.finished();
        }
        added
    }

    /// A copy of the stream with the events after `after` (its receiver's position), at most
    /// `max_bytes` of event data (at least one event). Returns the copy and the sequence the
    /// receiver will be at once it applied it.
    pub(crate) fn snapshot(&self, after: u64, max_bytes: usize) -> (StreamSnapshot, u64) {
        let st = self.state.lock();
        let mut events = Vec::new();
        let mut bytes = 0;
        let mut position = after.max(st.buffer.evicted_through());
        let retained = st
            .buffer
            .events_after(position)
            .map(|it| it.collect::<Vec<_>>())
            .unwrap_or_default();
        let mut truncated = false;
        for ev in retained {
            let size = ev.data.len() + ev.event.as_ref().map_or(0, String::len);
            if !events.is_empty() && bytes + size > max_bytes {
                truncated = true;
                break;
            }
            bytes += size;
            position = ev.seq;
            events.push(SnapshotEvent {
                seq: ev.seq,
                event: ev.event.clone(),
                data: ev.data.clone(),
            });
        }
        let last_seq = if truncated {
            position
        } else {
            st.buffer.last_seq()
        };
        let snapshot = StreamSnapshot {
            key: self.key.clone(),
            kind: self.kind,
            pending: st.pending.clone(),
            complete: st.complete && !truncated,
            stored: st.stored.clone(),
            sse: st.sse.clone(),
            last_seq,
            evicted_through: st.buffer.evicted_through(),
            events,
            withdrawn: st.withdrawn,
        };
        (snapshot, last_seq)
    }

    /// The pod still writing this stream, while it is handed off and incomplete.
    pub(crate) fn following(&self) -> Option<String> {
        self.state.lock().following.clone()
    }

    /// Ends a followed stream whose writer is gone (killed mid-handoff, or the holder lost):
    /// pending requests get a JSON-RPC error (`data.reason` as `lost` says) so no client
    /// hangs. A standalone stream of a lost holder, which has no request to answer, counts
    /// everything up to the gap as evicted: a resume from before it is told its notifications
    /// may be gone (`cursor_evicted`), never handed an empty end.
    pub(crate) fn abandon_following(&self, lost: WriterLost) {
        {
            let mut st = self.state.lock();
            st.following = None;
            // The dead writer may have numbered (and sent clients) events that never arrived:
            // the error events are numbered past any of them, so every client sees them.
            let gap = st.buffer.last_seq() + ABANDONED_WRITER_GAP;
            // A lost holder's notifications since its last replica were never carried; a
            // handed-off stream's were forwarded as they came.
            let evicted = if self.kind == StreamKind::Standalone && lost == WriterLost::Holder {
                gap
            } else {
                0
            };
            st.buffer.follow(gap, evicted);
        }
        let pending = self.pending();
        let (message, reason) = lost.error();
        self.fail_pending(&pending, message, reason);
        self.complete();
    }

    /// Tells `feed` (its session's change feed) of every change from now on.
    pub(crate) fn feed_into(&self, feed: &Teller) {
        let _ = self.feed.set(feed.clone());
    }

    /// The session moved: readers get what is buffered, then `retry:` (`hint`) and a clean close.
    pub(crate) fn close_readers_for_move(&self, hint: Duration) {
        self.state.lock().moved_retry = Some(hint);
        self.touch();
    }

    /// Wakes readers and the session's change feed.
    fn touch(&self) {
        self.changed.send_replace(());
        if let Some(feed) = self.feed.get() {
            feed.tell();
        }
    }

    /// Wakes readers of an event that changed nothing else (no answer, no end); the session's
    /// change feed tells only those that follow events.
    fn touch_event(&self) {
        self.changed.send_replace(());
        if let Some(feed) = self.feed.get() {
            feed.tell_event();
        }
    }

    /// The stream's key (first part of its event ids).
    pub(crate) fn key(&self) -> &StreamKey {
        &self.key
    }

    /// What the stream carries.
    pub(crate) fn kind(&self) -> StreamKind {
        self.kind
    }

    /// Cancelled when the stream's upstream task must stop (cancellation, session end).
    pub(crate) fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Appends an event received from the upstream. A response to a pending request removes it
    /// from the pending list; the last one completes the stream. Returns what the append
    /// evicted.
    pub(crate) fn append(&self, event: Option<String>, data: Bytes, now: Instant) -> Evictions {
        let answered = response_id(&data);
        let mut st = self.state.lock();
        if st.complete {
            return Evictions::default();
        }
        let (_, evictions) = st.buffer.push(event, data, now);
        let (mut answers, mut completed) = (false, false);
        if let Some(id) = answered
            && let Some(pos) = st.pending.iter().position(|p| *p == id)
        {
            st.pending.remove(pos);
            answers = true;
            if st.pending.is_empty() && self.kind.answers_requests() {
                st.complete = true;
                completed = true;
            }
        }
        drop(st);
        if answers {
            self.touch();
        } else {
            self.touch_event();
        }
        if completed {
            self.finished();
        }
        evictions
    }

    /// Ends the stream: readers drain what is buffered, then their connection ends cleanly.
    pub(crate) fn complete(&self) {
        self.state.lock().complete = true;
        self.touch();
        self.finished();
    }

    /// The stream is complete: its upstream task stops, and whoever waits on the pod's
    /// activity re-checks what is still in flight.
    fn finished(&self) {
        self.cancel.cancel();
        if let Some(activity) = self.activity.get() {
            activity.notify_waiters();
        }
    }

    /// Wakes every waiter of `activity` when this stream completes.
    pub(crate) fn report_to(&self, activity: &Arc<Notify>) {
        let _ = self.activity.set(Arc::clone(activity));
    }

    /// Ends requests `ids` that are still pending with a JSON-RPC error event each (code
    /// -32603, `data.reason` = `reason`), so a client never hangs; the last one completes the
    /// stream.
    pub(crate) fn fail_pending(&self, ids: &[RequestKey], message: &str, reason: &str) {
        let now = Instant::now();
        for id in ids {
            if self.any_pending(std::slice::from_ref(id)) {
                let error = error_response(id, CODE_INTERNAL, message, reason);
                self.append(None, Bytes::from(error), now);
            }
        }
    }

    /// Ends the stream because its session ended: a POST still waiting for its answer gets
    /// `gone` as its reply; requests already streaming get a JSON-RPC error each.
    pub(crate) fn end_with_session(&self, gone: &StoredReply) {
        {
            let mut st = self.state.lock();
            if st.stored.is_none() && st.sse.is_none() && self.kind == StreamKind::Post {
                self.set_stored(&mut st, gone.clone());
            }
        }
        let pending = self.pending();
        self.fail_pending(&pending, "the session ended", "session_ended");
        self.complete();
    }

    /// Records the upstream's non-SSE answer and completes the stream.
    pub(crate) fn store_reply(&self, reply: StoredReply) {
        self.end_with_reply(reply, false);
    }

    /// Ends a POST stream whose request was not carried out — refused for its caller (401,
    /// 429…) or never received by the MCP server — with `reply`: the connections waiting for
    /// it get `reply`, a retry that joined it is dispatched again, and a handoff tells the
    /// new holder (`docs/design/handoff.md#moving-one-session`).
    pub(crate) fn withdraw(&self, reply: StoredReply) {
        self.end_with_reply(reply, true);
    }

    /// Keeps `reply` (an outcome, or `withdrawn`) and completes the stream.
    fn end_with_reply(&self, reply: StoredReply, withdrawn: bool) {
        {
            let mut st = self.state.lock();
            st.withdrawn = withdrawn;
            self.set_stored(&mut st, reply);
            // Complete with its reply, at once: whoever sees the reply sees the stream complete.
            st.complete = true;
        }
        self.touch();
        self.finished();
    }

    /// Whether the request was not carried out ([`Stream::withdraw`], here or at the pod
    /// that wrote the stream before a handoff).
    pub(crate) fn is_withdrawn(&self) -> bool {
        self.state.lock().withdrawn
    }

    /// Keeps `reply`, counted in the session's tally once there is one.
    fn set_stored(&self, st: &mut State, reply: StoredReply) {
        st.stored_held = self.replies.get().map(|t| t.hold(reply.retained_bytes()));
        st.stored = Some(reply);
    }

    /// Counts the stored reply (now and later) in `replies`, the tally of the session this
    /// stream belongs to; a stream belongs to one session for good.
    pub(crate) fn count_replies_in(&self, replies: &Arc<Shared>) {
        if self.replies.set(Arc::clone(replies)).is_err() {
            return;
        }
        let mut st = self.state.lock();
        if let Some(reply) = &st.stored {
            st.stored_held = Some(replies.hold(reply.retained_bytes()));
        }
    }

    /// When this pod created the stream.
    pub(crate) fn created(&self) -> Instant {
        self.created
    }

    /// Whether the stream may be forgotten to make room for retry state at `now`: it is
    /// complete, nobody reads it, and everything it carries was handed to a client connection
    /// (its stored reply, or every event) or is older than `buffer.ttl` (like a buffered event
    /// nobody read). A retry of its request after that finds nothing to replay.
    pub(crate) fn is_spent(&self, now: Instant) -> bool {
        let st = self.state.lock();
        let handed_out = match &st.stored {
            Some(_) => st.reply_served,
            None => st.delivered >= st.buffer.last_seq(),
        };
        st.complete
            && st.readers.is_empty()
            && (handed_out || now.saturating_duration_since(self.created) >= st.buffer.ttl())
    }

    /// The complete answer of a POST with one request once its client was handed it — no
    /// events, nobody reading, not withdrawn, written here — so a compact record can stand
    /// for the stream from now on; `None` otherwise.
    pub(crate) fn handed_answer(&self) -> Option<StoredReply> {
        let st = self.state.lock();
        let handed = self.kind == StreamKind::Post
            && st.complete
            && st.reply_served
            && !st.withdrawn
            && st.readers.is_empty()
            && st.following.is_none()
            && st.buffer.last_seq() == 0;
        handed.then(|| st.stored.clone()).flatten()
    }

    /// The event answering request `id`, while the buffer keeps it.
    pub(crate) fn answer(&self, id: &RequestKey) -> Option<Bytes> {
        let st = self.state.lock();
        let kept = st.buffer.events_after(st.buffer.evicted_through()).ok()?;
        kept.filter(|ev| response_id(&ev.data).as_ref() == Some(id))
            .last()
            .map(|ev| ev.data.clone())
    }

    /// Records that the upstream answered with an SSE stream carrying end-to-end `headers`
    /// (the reply is served from the buffer, with those headers).
    pub(crate) fn mark_sse(&self, headers: HeaderMap) {
        self.state.lock().sse = Some(headers);
        self.touch();
    }

    /// Waits until the upstream's answer is known.
    pub(crate) async fn wait_head(&self) -> Head {
        let mut rx = self.changed.subscribe();
        loop {
            {
                let mut st = self.state.lock();
                if let Some(stored) = &st.stored {
                    let head = Head::Stored(stored.clone());
                    st.reply_served = true;
                    return head;
                }
                if let Some(headers) = &st.sse {
                    return Head::Sse(headers.clone());
                }
                if st.complete {
                    return Head::Sse(HeaderMap::new());
                }
            }
            if rx.changed().await.is_err() {
                return Head::Sse(HeaderMap::new());
            }
        }
    }

    /// Forgets pending request `id` (the client cancelled it, spec L-02); completes the stream
    /// when nothing else is pending. Returns whether the request was pending here.
    pub(crate) fn cancel_request(&self, id: &RequestKey) -> bool {
        let mut st = self.state.lock();
        let Some(pos) = st.pending.iter().position(|p| p == id) else {
            return false;
        };
        st.pending.remove(pos);
        let now_complete = st.pending.is_empty();
        drop(st);
        if now_complete {
            self.complete();
        }
        true
    }

    /// Requests still waiting for their response.
    pub(crate) fn pending(&self) -> Vec<RequestKey> {
        self.state.lock().pending.clone()
    }

    /// Whether any of `ids` is still waiting for its response.
    pub(crate) fn any_pending(&self, ids: &[RequestKey]) -> bool {
        self.state.lock().pending.iter().any(|p| ids.contains(p))
    }

    /// Feeds what a replica of the stream carries into `h` (`docs/design/replication.md`):
    /// its pending requests, completion, answer and withdrawal; the numbering of a complete
    /// stream; with `events`, the numbering of a running one too (its events go along), and
    /// without, once every [`REPLICA_NUMBERING_STEP`] events (a promoted stream numbers past
    /// [`ABANDONED_WRITER_GAP`] events after the replica's last one). A change of any sends the
    /// session's replica again.
    pub(crate) fn mark(&self, h: &mut impl std::hash::Hasher, events: bool) {
        use std::hash::Hash;
        let st = self.state.lock();
        st.pending.len().hash(h);
        st.complete.hash(h);
        st.stored.is_some().hash(h);
        st.sse.is_some().hash(h);
        st.withdrawn.hash(h);
        let last = st.buffer.last_seq();
        if events || st.complete {
            last.hash(h);
        } else {
            (last / REPLICA_NUMBERING_STEP).hash(h);
        }
    }

    /// Whether no more events will come.
    pub(crate) fn is_complete(&self) -> bool {
        self.state.lock().complete
    }

    /// Whether some client connection reads the stream now.
    pub(crate) fn is_read(&self) -> bool {
        !self.state.lock().readers.is_empty()
    }

    /// Whether the stream keeps its session alive: a reader is attached, or a POST is still
    /// waiting for its response.
    pub(crate) fn is_active(&self) -> bool {
        let st = self.state.lock();
        !st.readers.is_empty() || (self.kind.answers_requests() && !st.complete)
    }

    /// Whether a reader after `seq` would get nothing more: the stream is complete and keeps no
    /// event after it. A followed stream whose writer died ([`Stream::abandon_following`]) is
    /// numbered past its last event with none there, so its last sequence number says nothing
    /// of where it ended.
    pub(crate) fn is_over_after(&self, seq: u64) -> bool {
        let st = self.state.lock();
        st.complete
            && st
                .buffer
                .events_after(seq)
                .is_ok_and(|mut after| after.next().is_none())
    }

    /// Sequence of the newest event.
    pub(crate) fn last_seq(&self) -> u64 {
        self.state.lock().buffer.last_seq()
    }

    /// Events and bytes currently buffered.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> (usize, u64) {
        let st = self.state.lock();
        (st.buffer.len(), st.buffer.bytes())
    }

    /// Evicts every buffered event some client connection was sent (the pod is over its byte
    /// cap); returns how many. Events nobody was sent stay.
    pub(crate) fn evict_sent(&self) -> u64 {
        self.state.lock().buffer.evict_sent()
    }

    /// When the oldest buffered event was received.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.state.lock().buffer.oldest()
    }

    /// When the oldest buffered event is older than the buffer TTL.
    pub(crate) fn first_expiry(&self) -> Option<Instant> {
        let st = self.state.lock();
        st.buffer.oldest().map(|at| at + st.ttl())
    }

    /// Evicts events older than the buffer TTL: sent ones, and unsent ones too when nobody
    /// reads the stream.
    pub(crate) fn evict_expired(&self, now: Instant) -> Evictions {
        let mut st = self.state.lock();
        if st.never_read() {
            return st.buffer.evict_unread(now);
        }
        let unread = st.readers.is_empty();
        st.buffer.evict_expired(now, unread)
    }

    /// Evicts every buffered event when nobody reads the stream now (a full pod sheds the
    /// unread buffers of a caller over its fair share); a resume before them, or a retry of
    /// its request, gets `cursor_evicted`.
    pub(crate) fn shed_unread(&self) -> Evictions {
        let mut st = self.state.lock();
        if st.readers.is_empty() {
            st.buffer.shed()
        } else {
            Evictions::default()
        }
    }

    /// Whether the writer may append another event: the stream holds less than its bounds of
    /// events nobody was sent, and the pod is under its byte cap
    /// (`docs/design/buffering.md#backpressure`).
    pub(crate) fn has_room(&self) -> bool {
        self.state.lock().buffer.has_room()
    }

    /// Waits until the buffer's floor rises (a reader was sent events, or a follower forwarded
    /// them) — the moment [`Stream::has_room`] may turn true; callers check again, and poll
    /// too, for room made otherwise (the pod's cap, the TTL).
    pub(crate) async fn wait_room(&self) {
        self.room.notified().await;
    }

    /// Records that events up to `seq` were forwarded to the pod the session moved to (the
    /// handoff's follower): like events sent to a reader, they may be evicted now.
    pub(crate) fn forwarded(&self, seq: u64) {
        let mut st = self.state.lock();
        st.forwarded = st.forwarded.max(seq);
        if st.refloor() {
            self.room.notify_one();
        }
    }

    /// Checks that a reader can start after `seq` without skipping an evicted event.
    ///
    /// # Errors
    /// [`ReplayError`] when `seq` is ahead of the stream or events after it were evicted.
    pub(crate) fn check_cursor(&self, seq: u64) -> Result<(), ReplayError> {
        let st = self.state.lock();
        match st.buffer.events_after(seq) {
            // A followed stream's writer may have sent the client an event that is still on
            // its way here: the reader waits for it.
            Err(ReplayError::Ahead { .. }) if st.following.is_some() => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn limits() -> BufferLimits {
        BufferLimits {
            max_events: 100,
            max_bytes: 1 << 20,
            ttl: Duration::from_secs(60),
            unread_ttl: Duration::from_secs(60),
        }
    }

    fn post_stream(ids: &[i64]) -> Arc<Stream> {
        Stream::new(
            StreamKind::Post,
            ids.iter()
                .map(|i| RequestKey::of(&Value::from(*i)))
                .collect(),
            limits(),
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        )
    }

    fn progress(n: u64) -> Bytes {
        Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progress":{n}}}}}"#
        ))
    }

    fn text(item: FeedItem) -> String {
        match item {
            FeedItem::Data(b) => String::from_utf8(b.to_vec()).unwrap(),
            other => panic!("expected data, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn l01_events_are_buffered_without_a_reader_and_replayed_after_the_cursor() {
        let s = post_stream(&[5]);
        let now = Instant::now();
        for n in 1..=3 {
            s.append(None, progress(n), now);
        }
        let mut feed = s.attach(Start::After(1), true, false, Duration::from_secs(10));
        let got = text(feed.next().await);
        assert!(!got.contains(&format!("id: {}-1\n", s.key())));
        assert!(got.contains(&format!("id: {}-2\n", s.key())));
        assert!(got.contains(&format!("id: {}-3\n", s.key())));
        s.append(
            None,
            Bytes::from(r#"{"jsonrpc":"2.0","id":5,"result":{}}"#),
            now,
        );
        assert!(
            s.is_complete(),
            "the last pending response completes the stream"
        );
        assert!(text(feed.next().await).contains("\"id\":5"));
        assert_eq!(feed.next().await, FeedItem::End);
        assert!(
            s.cancel_token().is_cancelled(),
            "the upstream task is told to stop"
        );
    }

    #[tokio::test]
    async fn a_stream_nobody_ever_read_lives_the_unread_ttl_and_one_left_mid_way_the_ttl() {
        let short = BufferLimits {
            unread_ttl: Duration::from_secs(5),
            ..limits()
        };
        let make = || {
            Stream::new(
                StreamKind::Post,
                vec![],
                short,
                crate::retained::Retained::new(u64::MAX).account(),
                CancellationToken::new(),
            )
        };
        let t0 = Instant::now();
        let (unread, left) = (make(), make());
        for s in [&unread, &left] {
            for n in 1..=3 {
                s.append(None, progress(n), t0);
            }
        }
        let mut feed = left.attach(Start::After(0), true, false, Duration::from_secs(10));
        text(feed.next().await);
        drop(feed);
        assert_eq!(unread.first_expiry(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(left.first_expiry(), Some(t0 + Duration::from_secs(60)));
        let at = t0 + Duration::from_secs(6);
        assert_eq!(unread.evict_expired(at).unread_ttl, 3);
        assert_eq!(left.evict_expired(at), Evictions::default());
        assert_eq!(
            unread.check_cursor(0),
            Err(ReplayError::Evicted { oldest_kept: 4 }),
            "a retry of its request is told, not served nothing"
        );
        assert_eq!(left.evict_expired(t0 + Duration::from_secs(60)).ttl, 3);
    }

    #[tokio::test]
    async fn a_full_pod_sheds_a_stream_only_while_nobody_reads_it() {
        let s = post_stream(&[1]);
        for n in 1..=3 {
            s.append(None, progress(n), Instant::now());
        }
        let feed = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        assert_eq!(s.shed_unread(), Evictions::default(), "its reader keeps it");
        drop(feed);
        assert_eq!(s.shed_unread().principal_share, 3);
        assert_eq!(s.buffered(), (0, 0));
    }

    #[tokio::test]
    async fn t09_a_new_reader_takes_over_and_the_old_one_ends_cleanly() {
        let s = Stream::new(
            StreamKind::Standalone,
            vec![],
            limits(),
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        );
        let mut old = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        s.append(None, progress(1), Instant::now());
        assert!(text(old.next().await).contains("-1\n"));
        let mut new = s.attach(Start::Undelivered, true, false, Duration::from_secs(10));
        assert_eq!(old.next().await, FeedItem::End);
        s.append(None, progress(2), Instant::now());
        let got = text(new.next().await);
        assert!(got.contains("-2\n") && !got.contains("-1\n"), "{got}");
        drop(old);
        assert!(
            s.is_active(),
            "the old reader's drop must not detach the new one"
        );
        drop(new);
        assert!(!s.is_active());
    }

    #[tokio::test]
    async fn a_long_catch_up_is_written_in_chunks() {
        let s = post_stream(&[1]);
        let big = Bytes::from(vec![b'x'; 3000]);
        for _ in 0..60 {
            s.append(None, big.clone(), Instant::now());
        }
        let mut feed = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        let mut sizes = Vec::new();
        let mut events = 0;
        while events < 60 {
            let chunk = text(feed.next().await);
            events += chunk.matches("id: ").count();
            sizes.push(chunk.len());
        }
        assert!(sizes.len() >= 3, "{sizes:?}");
        assert!(
            sizes.iter().all(|n| *n < feed::CHUNK_BYTES + 3100),
            "at most one event past the bound: {sizes:?}"
        );
    }

    #[tokio::test]
    async fn a_joining_reader_does_not_end_the_first() {
        let s = post_stream(&[1]);
        let mut first = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        let mut retry = s.attach(Start::After(0), false, false, Duration::from_secs(10));
        s.append(None, progress(1), Instant::now());
        assert!(text(first.next().await).contains("-1\n"));
        assert!(text(retry.next().await).contains("-1\n"));
        drop(first);
        assert!(s.is_active(), "the other reader is still attached");
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_comments_on_idle_streams() {
        let s = post_stream(&[1]);
        let mut feed = s.attach(Start::After(0), true, true, Duration::from_millis(10));
        let priming = text(feed.next().await);
        assert_eq!(priming, format!("id: {}-0\ndata:\n\n", s.key()));
        assert_eq!(text(feed.next().await), ": keep-alive\n\n");
    }

    #[tokio::test]
    async fn r05_no_priming_ahead_of_events_still_to_send() {
        let s = post_stream(&[1]);
        s.append(None, progress(1), Instant::now());
        s.append(None, progress(2), Instant::now());
        let mut catching_up = s.attach(Start::After(1), true, true, Duration::from_secs(10));
        let first = text(catching_up.next().await);
        assert!(
            first.starts_with(&format!("id: {}-2\ndata: {{", s.key())),
            "{first}"
        );
        let mut at_end = s.attach(Start::After(2), true, true, Duration::from_secs(10));
        assert_eq!(
            text(at_end.next().await),
            format!("id: {}-3\ndata:\n\n", s.key())
        );
        let mut from_start = s.attach(Start::After(0), false, true, Duration::from_secs(10));
        assert_eq!(
            text(from_start.next().await),
            format!("id: {}-0\ndata:\n\n", s.key())
        );
    }

    #[tokio::test]
    async fn l02_cancelling_the_last_pending_request_completes_the_stream() {
        let s = post_stream(&[1, 2]);
        assert!(s.cancel_request(&RequestKey::of(&Value::from(1))));
        assert!(!s.is_complete());
        assert!(!s.cancel_request(&RequestKey::of(&Value::from(9))));
        assert!(s.cancel_request(&RequestKey::of(&Value::from(2))));
        assert!(s.is_complete());
        let mut feed = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        assert_eq!(feed.next().await, FeedItem::End);
    }

    #[tokio::test]
    async fn a_reader_behind_is_never_dropped_and_holds_its_writer_back() {
        let s = Stream::new(
            StreamKind::Post,
            vec![],
            BufferLimits {
                max_events: 2,
                ..limits()
            },
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        );
        let mut feed = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        for n in 1..=2 {
            assert!(s.has_room());
            s.append(None, progress(n), Instant::now());
        }
        assert!(
            !s.has_room(),
            "two events nobody was sent: the writer waits"
        );
        // An append anyway (an error event ending a request) evicts nothing unsent.
        s.append(None, progress(3), Instant::now());
        let got = text(feed.next().await);
        for n in 1..=3 {
            assert!(got.contains(&format!("-{n}\n")), "{got}");
        }
        assert!(s.has_room(), "the reader was sent them: they may go");
        let woken = tokio::time::timeout(Duration::from_millis(100), s.wait_room()).await;
        assert!(woken.is_ok(), "the writer was told there is room");
        s.append(None, progress(4), Instant::now());
        assert_eq!(
            s.buffered().0,
            3,
            "2 sent events in the replay window, and the unsent one"
        );
        assert!(text(feed.next().await).contains("-4\n"));
    }

    #[tokio::test]
    async fn a_reader_resuming_from_an_older_cursor_protects_the_events_it_still_needs() {
        let s = Stream::new(
            StreamKind::Post,
            vec![],
            BufferLimits {
                max_events: 3,
                ..limits()
            },
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        );
        let mut first = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        for n in 1..=3 {
            s.append(None, progress(n), Instant::now());
        }
        assert!(text(first.next().await).contains("-3\n"));
        drop(first);
        // Its client saw only event 1 arrive and resumes after it.
        let mut resumed = s.attach(Start::After(1), true, false, Duration::from_secs(10));
        s.append(None, progress(4), Instant::now());
        assert!(!s.has_room(), "events 2..=4 wait for the resumed reader");
        let got = text(resumed.next().await);
        assert!(got.contains("-2\n") && got.contains("-4\n"), "{got}");
    }

    #[tokio::test]
    async fn events_forwarded_to_the_new_holder_count_as_sent() {
        let s = Stream::new(
            StreamKind::Post,
            vec![],
            BufferLimits {
                max_events: 1,
                ..limits()
            },
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        );
        s.append(None, progress(1), Instant::now());
        assert!(!s.has_room());
        s.forwarded(1);
        assert!(s.has_room());
    }

    /// A copy of a stream from its snapshot, following pod `pod-a`.
    fn copy_of(snapshot: &StreamSnapshot) -> Arc<Stream> {
        Stream::from_snapshot(
            snapshot,
            limits(),
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
            "pod-a",
        )
    }

    #[tokio::test]
    async fn a_handed_off_stream_follows_its_writer_and_serves_resumes() {
        let writer = post_stream(&[7]);
        let now = Instant::now();
        writer.append(None, progress(1), now);
        writer.append(None, progress(2), now);
        let (image, at) = writer.snapshot(0, 1 << 20);
        assert_eq!((image.events.len(), at, image.complete), (2, 2, false));
        let copy = copy_of(&image);
        assert_eq!(copy.key(), writer.key());
        assert_eq!(copy.following().as_deref(), Some("pod-a"));
        // The client saw event 3 from the writer before the tail arrived: its resume waits.
        writer.append(None, progress(3), now);
        assert_eq!(copy.check_cursor(3), Ok(()));
        let mut feed = copy.attach(Start::After(3), true, true, Duration::from_secs(10));
        let (tail, at) = writer.snapshot(at, 1 << 20);
        assert_eq!(copy.apply(&tail), 1);
        assert_eq!(at, 3);
        writer.append(
            None,
            Bytes::from(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            now,
        );
        let (tail, _) = writer.snapshot(at, 1 << 20);
        assert!(tail.complete);
        assert_eq!(copy.apply(&tail), 1);
        let got = text(feed.next().await);
        assert!(
            got.starts_with(&format!("id: {}-4\n", copy.key())) && got.contains("\"id\":7"),
            "{got}"
        );
        assert_eq!(feed.next().await, FeedItem::End);
        assert_eq!(copy.following(), None, "complete: no longer following");
        assert_eq!(copy.check_cursor(9), Err(ReplayError::Ahead { last: 4 }));
    }

    #[tokio::test]
    async fn images_are_bounded_and_the_rest_follows() {
        let writer = post_stream(&[1]);
        for n in 1..=5 {
            writer.append(None, progress(n), Instant::now());
        }
        writer.complete();
        let one = progress(1).len();
        let (first, at) = writer.snapshot(0, 2 * one);
        assert_eq!((first.events.len(), at, first.complete), (2, 2, false));
        let copy = copy_of(&first);
        let (rest, at) = writer.snapshot(at, 1 << 20);
        assert_eq!((rest.events.len(), at, rest.complete), (3, 5, true));
        copy.apply(&rest);
        assert!(copy.is_complete());
        let mut feed = copy.attach(Start::After(0), true, false, Duration::from_secs(10));
        let got = text(feed.next().await);
        assert_eq!(got.matches("id: ").count(), 5, "{got}");
    }

    #[tokio::test]
    async fn r07_readers_of_a_moved_session_get_retry_and_a_clean_close() {
        let s = post_stream(&[1]);
        s.append(None, progress(1), Instant::now());
        let mut feed = s.attach(Start::After(0), true, false, Duration::from_secs(10));
        s.close_readers_for_move(Duration::from_millis(100));
        assert!(text(feed.next().await).contains("-1\n"));
        assert_eq!(text(feed.next().await), "retry: 100\n\n");
        assert_eq!(feed.next().await, FeedItem::End);
    }

    #[test]
    fn a_complete_stream_is_over_after_its_last_event_even_numbered_past_it() {
        let writer = post_stream(&[]);
        writer.append(None, progress(1), Instant::now());
        writer.append(None, progress(2), Instant::now());
        let (image, _) = writer.snapshot(0, 1 << 20);
        let copy = copy_of(&image);
        assert!(!copy.is_over_after(2), "still followed");
        copy.abandon_following(WriterLost::Handoff);
        assert!(
            copy.last_seq() > 2,
            "numbered past the dead writer's events"
        );
        assert!(!copy.is_over_after(1), "event 2 is still to read");
        assert!(copy.is_over_after(2));
    }

    #[tokio::test]
    async fn a_followed_stream_whose_writer_died_fails_its_requests_saying_why() {
        for (lost, reason) in [
            (WriterLost::Handoff, "handoff_interrupted"),
            (WriterLost::Holder, "holder_lost"),
        ] {
            let writer = post_stream(&[9]);
            let (image, _) = writer.snapshot(0, 1 << 20);
            let copy = copy_of(&image);
            copy.abandon_following(lost);
            assert!(copy.is_complete());
            let mut feed = copy.attach(Start::After(0), true, false, Duration::from_secs(10));
            let got = text(feed.next().await);
            assert!(got.contains(reason) && got.contains("\"id\":9"), "{got}");
        }
    }

    #[test]
    fn a_standalone_stream_whose_writer_died_tells_a_resume_its_notifications_may_be_gone() {
        let writer = Stream::new(
            StreamKind::Standalone,
            vec![],
            limits(),
            crate::retained::Retained::new(u64::MAX).account(),
            CancellationToken::new(),
        );
        writer.append(None, progress(1), Instant::now());
        let (image, _) = writer.snapshot(0, 1 << 20);
        let copy = copy_of(&image);
        assert_eq!(copy.check_cursor(1), Ok(()), "followed: event 1 and on");
        copy.abandon_following(WriterLost::Holder);
        assert!(copy.is_complete());
        // The writer may have sent notifications after event 1 that no copy has.
        for cursor in [0, 1, 2] {
            assert!(
                matches!(copy.check_cursor(cursor), Err(ReplayError::Evicted { .. })),
                "cursor {cursor}"
            );
        }
    }
}
