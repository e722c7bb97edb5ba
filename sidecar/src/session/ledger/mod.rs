//! A session's retry ledger (`docs/design/buffering.md#retries`,
//! `docs/design/architecture.md#streams-and-the-replay-buffer`): the streams that carry its
//! requests' answers, the retry records that lead a request id to its stream, the answered
//! records that replace streams whose client was handed a complete reply, the tombstones of
//! requests answered and forgotten, the retry window that says how many stay replayable, and the
//! charges of all of it against the pod's retained bytes.
//!
//! A request's life in the ledger:
//!
//! ```text
//!   claim (new ids): a record per id, its stream registered
//!       │
//!       ▼
//!   ┌─────────┐  withdrawn (not carried out): its records go; a retry runs it again
//!   │ running │ ───────────────────────────────────────────────────────────────────▶
//!   └─────────┘
//!       │ answered
//!       ▼
//!   ┌──────────┐  settle: its client was handed the complete reply  ┌─────────────────┐
//!   │ answered │ ──────────────────────────────────────────────────▶ │ answered record │
//!   └──────────┘                                                     └─────────────────┘
//!       │ every event handed to a client, or older than the TTL              │
//!       ▼                                                                    │
//!   ┌───────┐ ◀──────────────────────────────────────────────────────────────┘
//!   │ spent │
//!   └───────┘
//!       │ beyond the window (count, bytes), the budget or the TTL: the stream is forgotten
//!       │ (a retry: no longer available); its record goes with a walk, its id buried
//!       ▼
//!   ┌───────────┐  the TTL
//!   │ tombstone │ ────────▶ forgotten: the id is new again
//!   └───────────┘
//! ```
//!
//! - A retry (the same ids, the same body) attaches to the running stream or replays its answer
//!   ([`Dedupe`]); the same id with another body is refused while the request runs and is a new
//!   request once answered; a buried id is "no longer available", never dispatched twice
//!   (unless the session reuses ids: then a new request).
//! - The window and the budget forget only what is spent: a stream someone may still read
//!   stays, even beyond them; a walk that found everything beyond the window in use makes the
//!   next wait [`WINDOW_WALK_PACE`]. New requests that do not fit in the session's budget
//!   (`--max-session-retry-bytes`) are refused ([`RetryLedger::claim`]); tombstones count in it
//!   and are never forgotten early.
//! - Hard bounds forget the oldest: beyond [`MAX_STREAMS`] streams, complete ones nobody reads;
//!   beyond [`MAX_REQUEST_RECORDS`] records, the oldest record (its id buried).
//!
//! The ledger lives under its session's lock; it knows nothing of handoffs or of who follows
//! the session (its [`super::Session`] tells them).

mod answered;
mod changes;
#[cfg(test)]
mod changes_tests;
mod tombstones;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::RequestKey;
use crate::retained::shares::Share;
use crate::retained::{Charge, Kind, Retained, Shared};
use crate::stream::{StoredReply, Stream, StreamKind, StreamSnapshot};

use super::bounded::Bounded;
use super::replica::{ReplicaParts, Shipped};
use answered::Answers;
use changes::{Changed, Changes};
pub(crate) use tombstones::Buried;
use tombstones::Tombstones;

/// Most streams (live or tombstones) one session keeps.
const MAX_STREAMS: usize = 4096;
/// Most request records one session keeps for retry de-duplication.
const MAX_REQUEST_RECORDS: usize = 16384;
/// Bytes a retry record takes besides its request id's text (its slot of the window's ring:
/// id, digest, stream key; the ring's room; its place in the index), for
/// `tether_retained_bytes{kind="records"}`.
const RECORD_OVERHEAD: u64 = 96;
/// How long after a walk of a session's retry state that could not bring it within its window
/// (`--retry-window`, `--retry-window-bytes`: everything beyond still in use) the next such
/// walk waits: until then the session may stay over its window — its budget
/// (`--max-session-retry-bytes`) is still enforced at once —, so that a flood of requests whose
/// answers nobody reads costs one walk per pace, not one walk of thousands of streams per
/// request.
const WINDOW_WALK_PACE: Duration = Duration::from_millis(50);

/// What the retry record of request `id` takes: its id and the rest.
fn record_bytes(id: &RequestKey) -> u64 {
    RECORD_OVERHEAD + id.as_json().len() as u64
}

#[derive(Debug)]
struct RequestRecord {
    digest: [u8; 32],
    stream: StreamKey,
}

/// Retry record `rec` of request `id`, as a snapshot carries it.
fn record(id: &RequestKey, rec: &RequestRecord) -> RetryRecord {
    RetryRecord {
        id: id.clone(),
        digest: rec.digest,
        stream: rec.stream.clone(),
    }
}

/// One retry record, as a [`super::SessionSnapshot`] carries it: a request id, the SHA-256 of
/// the POST body that carried it, and the stream carrying its response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RetryRecord {
    /// The JSON-RPC request id.
    pub(crate) id: RequestKey,
    /// SHA-256 of the POST body.
    pub(crate) digest: [u8; 32],
    /// The stream carrying its response.
    pub(crate) stream: StreamKey,
}

/// What a POST's request ids mean for a session (retry de-duplication,
/// `docs/design/architecture.md#streams-and-the-replay-buffer`).
#[derive(Debug)]
pub(crate) enum Dedupe {
    /// New ids: dispatch upstream.
    New,
    /// The same ids with the same body: a retry; attach to the existing stream.
    Retry(Arc<Stream>),
    /// The same id with the same body: a retry of a request answered in full, whose client
    /// was handed this reply ([`RetryLedger::settle`]); replay it.
    Answered(StoredReply),
    /// An id whose request was answered, sent again with another body (or, in a session that
    /// reuses ids, an id answered and forgotten): a new request under a reused id, registered
    /// like [`Dedupe::New`]. Clients that number every request `1`, or each conversation of a
    /// pooled session from `1`, send these (`docs/design/buffering.md#retries`).
    Reused,
    /// An id whose request still runs, sent again with another body, or ids spread over
    /// several POSTs: 400 (spec S-09). Running both would leave two requests of one id in
    /// flight, whose answers and cancellations could not be told apart.
    Conflict,
    /// New ids, but the session's retry state would exceed its budget (this many bytes) even
    /// after its spent streams were forgotten: 413.
    SessionFull(u64),
    /// The session ended meanwhile: nothing was registered (its requests get 404).
    Ended,
    /// A request the session answered and forgot ([`RetryWindow`]): its result is no longer
    /// available, and it is not dispatched again.
    Expired(RequestKey),
}

/// What a new request's retry state must fit in ([`RetryLedger::claim`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryRoom {
    /// The session's budget for retry records, stored replies and tombstones, in bytes
    /// (`--max-session-retry-bytes`): beyond it, new requests get 413.
    pub(crate) session_bytes: u64,
    /// What stays replayable.
    pub(crate) window: RetryWindow,
}

/// How many answered requests a session keeps replayable for retries
/// (`docs/design/buffering.md#retries`): answered streams beyond the newest `requests`, beyond
/// `bytes` of retry state, or older than `ttl` are forgotten once they are spent, and their ids
/// leave a tombstone for `ttl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetryWindow {
    /// Streams kept (`--retry-window`).
    pub(crate) requests: usize,
    /// Bytes of retry state kept (`--retry-window-bytes`).
    pub(crate) bytes: u64,
    /// `buffer.ttl`.
    pub(crate) ttl: Duration,
}

impl RetryWindow {
    /// The flags' defaults: 256 requests, 1 MiB, 10 minutes.
    pub(crate) const DEFAULT: RetryWindow = RetryWindow {
        requests: 256,
        bytes: 1 << 20,
        ttl: Duration::from_secs(600),
    };
}

/// The streams, retry records, answered records and tombstones of one session.
#[derive(Debug)]
pub(super) struct RetryLedger {
    streams: HashMap<StreamKey, Arc<Stream>>,
    /// Streams of requests answered with a complete reply their clients were handed, as
    /// compact records ([`RetryLedger::settle`]); their keys are in `stream_order` too.
    answered: Answers,
    /// The keys of `streams` and `answered`, oldest first (and keys of streams forgotten
    /// since, until the next walk).
    stream_order: VecDeque<StreamKey>,
    requests: Bounded<RequestKey, RequestRecord>,
    /// The retry records' bytes, counted in the pod's tally.
    records_charge: Charge,
    /// The stored replies of the session's streams, counted in the pod's tally too.
    replies: Arc<Shared>,
    /// Requests answered and forgotten: a retry of one gets "no longer available".
    tombstones: Tombstones,
    /// The client sent an answered id again with another body ([`Dedupe::Reused`]): it reuses
    /// ids, so a forgotten id is a new request (tombstones keep no body to compare).
    reuses_ids: bool,
    /// The tombstones' bytes, counted in the pod's tally.
    tombstones_charge: Charge,
    /// How many answered requests stay replayable (the latest a request brought).
    window: RetryWindow,
    /// When the last walk of the retry state could not bring it within its window, everything
    /// beyond still in use; the next walk of the window waits [`WINDOW_WALK_PACE`] from then
    /// ([`RetryLedger::trim_window`]).
    crowded_at: Option<Instant>,
    /// What changed since the session's replica was last computed.
    changes: Changes,
}

impl RetryLedger {
    /// An empty ledger whose bytes count in `retained`.
    pub(super) fn new(retained: &Retained) -> Self {
        Self {
            streams: HashMap::new(),
            answered: Answers::new(retained.charge(Kind::Replies)),
            stream_order: VecDeque::new(),
            requests: Bounded::new(MAX_REQUEST_RECORDS),
            records_charge: retained.charge(Kind::Records),
            replies: Shared::new(retained, Kind::Replies),
            tombstones: Tombstones::default(),
            reuses_ids: false,
            tombstones_charge: retained.charge(Kind::Tombstones),
            window: RetryWindow::DEFAULT,
            crowded_at: None,
            changes: Changes::new(retained.charge(Kind::Replicas)),
        }
    }

    /// Counts the tombstones in `share` too (a principal's; the records and replies count in
    /// the pod's tally only).
    pub(super) fn attribute(&mut self, share: &Arc<Share>) {
        self.tombstones_charge.attribute(share);
    }

    /// The live stream `key`.
    pub(super) fn stream(&self, key: &StreamKey) -> Option<&Arc<Stream>> {
        self.streams.get(key)
    }

    /// Every live stream, in no order.
    pub(super) fn streams(&self) -> impl Iterator<Item = &Arc<Stream>> {
        self.streams.values()
    }

    /// The live streams, oldest first.
    pub(super) fn streams_in_order(&self) -> impl Iterator<Item = &Arc<Stream>> {
        self.stream_order
            .iter()
            .filter_map(|key| self.streams.get(key))
    }

    /// Feeds what a replica of the ledger carries into `h`: its revision (every stream or
    /// retry record registered, settled or forgotten moves it) and each live stream as
    /// [`Stream::mark`] sees it.
    pub(super) fn mark(&self, h: &mut impl std::hash::Hasher, events: bool) {
        let live = self.streams.iter().fold(0u64, |sum, (key, stream)| {
            sum.wrapping_add(Shipped::stream_mark(key, |h| stream.mark(h, events)))
        });
        h.write_u64(self.changes.revision());
        h.write_u64(live);
    }

    /// Nobody follows the session's replica any more: its changes are not listed.
    pub(super) fn unfollow_replica(&mut self) {
        self.changes.unfollow();
    }

    /// Whether stream `key` was replaced by its answered record.
    pub(super) fn is_answered(&self, key: &StreamKey) -> bool {
        self.answered.contains_key(key)
    }

    /// The stream that carries the response to request `id`.
    pub(super) fn stream_of_request(&self, id: &RequestKey) -> Option<&Arc<Stream>> {
        let rec = self.requests.get(id)?;
        self.streams.get(&rec.stream)
    }

    /// The first standalone stream registered after stream `key`.
    pub(super) fn next_standalone(&self, key: &StreamKey) -> Option<&Arc<Stream>> {
        self.stream_order
            .iter()
            .skip_while(|k| *k != key)
            .skip(1)
            .filter_map(|k| self.streams.get(k))
            .find(|s| s.kind() == StreamKind::Standalone)
    }

    /// Whether the ledger keeps stream `key` (live, or as an answered record).
    fn holds(&self, key: &StreamKey) -> bool {
        self.streams.contains_key(key) || self.answered.contains_key(key)
    }

    /// Whether stream `key` still waits for its answer (its request runs, here or, for a
    /// stream followed through a handoff, at the pod that wrote it).
    fn runs(&self, key: &StreamKey) -> bool {
        self.streams.get(key).is_some_and(|s| !s.is_complete())
    }

    /// How many streams it keeps (live ones and answered records).
    fn stream_count(&self) -> usize {
        self.streams.len() + self.answered.len()
    }

    /// Forgets stream `key`, live or answered (its place in `stream_order` goes with the
    /// walk that called this, or the next one).
    fn forget(&mut self, key: &StreamKey) {
        if self.holds(key) {
            self.streams.remove(key);
            self.answered.remove(key);
            self.changes.stream(key);
        }
    }

    /// Forgets stream `key` and its place in the order now.
    pub(super) fn forget_stream(&mut self, key: &StreamKey) {
        self.forget(key);
        self.stream_order.retain(|k| k != key);
    }

    /// A copy of every stream (live ones, answered records), oldest first, with at most
    /// `max_bytes` of event data in all (each stream gets at least its oldest unsent event),
    /// and per stream the sequence the copy is at.
    pub(super) fn snapshot(
        &self,
        max_bytes: usize,
    ) -> (Vec<StreamSnapshot>, HashMap<StreamKey, u64>) {
        let mut budget = max_bytes;
        let mut positions = HashMap::with_capacity(self.streams.len());
        let mut streams = Vec::with_capacity(self.streams.len());
        for key in &self.stream_order {
            let Some(stream) = self.streams.get(key) else {
                if let Some(answered) = self.answered.get(key) {
                    positions.insert(key.clone(), 0);
                    streams.push(answered.snapshot(key));
                }
                continue;
            };
            let (snapshot, at) = stream.snapshot(0, budget);
            let size: usize = snapshot.events.iter().map(|e| e.data.len()).sum();
            budget = budget.saturating_sub(size);
            positions.insert(key.clone(), at);
            streams.push(snapshot);
        }
        (streams, positions)
    }

    /// What a replica of the ledger carries that `since` (what the replica pod holds) lacks:
    /// the streams new or changed since (each as [`Stream::mark`] sees it, with at most
    /// `max_bytes` of events in all) and the retry records new since, oldest first; what it
    /// holds and the ledger no longer keeps; and what it holds once it has them. Everything,
    /// without `since`.
    ///
    /// When the ledger listed what changed since the last replica ([`changes`]), only those
    /// streams and records and the live streams are looked at, and the parts are a change of
    /// `since` ([`ReplicaParts::change`]); otherwise the whole ledger is.
    pub(super) fn replica_parts(
        &mut self,
        events: bool,
        max_bytes: usize,
        since: Option<&Shipped>,
    ) -> ReplicaParts {
        let changed = self.changes.take();
        match (since, changed) {
            (Some(since), Some(changed)) => self.changed_parts(events, max_bytes, since, changed),
            (since, _) => {
                self.scanned_parts(events, max_bytes, since.unwrap_or(&Shipped::default()))
            }
        }
    }

    /// [`RetryLedger::replica_parts`] from a walk of every stream and record.
    fn scanned_parts(&self, events: bool, max_bytes: usize, since: &Shipped) -> ReplicaParts {
        let mut parts = ReplicaParts::default();
        let mut budget = max_bytes;
        for key in &self.stream_order {
            if let Some((mark, snapshot)) = self.stream_part(key, events, &mut budget, since) {
                parts.shipped.add_stream(key, mark);
                parts.streams.extend(snapshot);
            }
        }
        for (id, rec) in self.requests.iter() {
            let mark = Shipped::record_mark(&rec.digest, &rec.stream);
            if !since.has_request(id, mark) {
                parts.records.push(record(id, rec));
            }
            parts.shipped.add_request(id, mark);
        }
        parts.forget_what(since);
        parts
    }

    /// [`RetryLedger::replica_parts`] from what changed since `since` (`changed`) and the live
    /// streams: the parts are a change ([`ReplicaParts::change`]).
    fn changed_parts(
        &self,
        events: bool,
        max_bytes: usize,
        since: &Shipped,
        changed: Changed,
    ) -> ReplicaParts {
        let mut parts = ReplicaParts {
            change: true,
            ..ReplicaParts::default()
        };
        let mut budget = max_bytes;
        let listed: std::collections::HashSet<&StreamKey> = changed.streams.iter().collect();
        let live = self.streams.keys().filter(|key| !listed.contains(key));
        for key in changed.streams.iter().chain(live) {
            match self.stream_part(key, events, &mut budget, since) {
                Some((mark, Some(snapshot))) => {
                    parts.shipped.add_stream(key, mark);
                    parts.streams.push(snapshot);
                }
                Some((_, None)) => {}
                None if since.holds_stream(key) => parts.forgotten_streams.push(key.clone()),
                None => {}
            }
        }
        for id in &changed.requests {
            match self.requests.get(id) {
                Some(rec) => {
                    let mark = Shipped::record_mark(&rec.digest, &rec.stream);
                    if !since.has_request(id, mark) {
                        parts.records.push(record(id, rec));
                        parts.shipped.add_request(id, mark);
                    }
                }
                None if since.holds_request(id) => parts.forgotten_requests.push(id.clone()),
                None => {}
            }
        }
        parts
    }

    /// Stream `key` as a replica carries it, when the ledger keeps it: its mark, and its
    /// snapshot unless `since` has it as it is (events taken out of `budget`).
    fn stream_part(
        &self,
        key: &StreamKey,
        events: bool,
        budget: &mut usize,
        since: &Shipped,
    ) -> Option<(u64, Option<StreamSnapshot>)> {
        if let Some(stream) = self.streams.get(key) {
            let mark = Shipped::stream_mark(key, |h| stream.mark(h, events));
            if since.has_stream(key, mark) {
                return Some((mark, None));
            }
            let (snapshot, _) = stream.snapshot(0, *budget);
            let size: usize = snapshot.events.iter().map(|e| e.data.len()).sum();
            *budget = budget.saturating_sub(size);
            Some((mark, Some(snapshot)))
        } else if let Some(answered) = self.answered.get(key) {
            let mark = Shipped::stream_mark(key, |_| {});
            let snapshot = (!since.has_stream(key, mark)).then(|| answered.snapshot(key));
            Some((mark, snapshot))
        } else {
            None
        }
    }

    /// What a replica needs of requests `ids` alone: their streams (as [`Stream::mark`] sees
    /// them, with at most `max_bytes` of events in all) and their retry records; `shipped`
    /// lists only these. The rest of the ledger is not looked at: a request about to be
    /// dispatched has its record written ahead this way (`docs/design/replication.md#write-ahead`).
    pub(super) fn request_parts(
        &self,
        ids: &[RequestKey],
        events: bool,
        max_bytes: usize,
    ) -> ReplicaParts {
        let mut parts = ReplicaParts {
            change: true,
            ..ReplicaParts::default()
        };
        let mut budget = max_bytes;
        let none = Shipped::default();
        for id in ids {
            let Some(rec) = self.requests.get(id) else {
                continue;
            };
            parts.records.push(record(id, rec));
            parts
                .shipped
                .add_request(id, Shipped::record_mark(&rec.digest, &rec.stream));
            let key = &rec.stream;
            if parts.streams.iter().any(|s| &s.key == key) {
                continue;
            }
            if let Some((mark, snapshot)) = self.stream_part(key, events, &mut budget, &none) {
                parts.shipped.add_stream(key, mark);
                parts.streams.extend(snapshot);
            }
        }
        parts
    }

    /// The digest of request `id`'s retry record ([`Shipped::record_mark`]), if it has one.
    pub(super) fn record_mark(&self, id: &RequestKey) -> Option<u64> {
        self.requests
            .get(id)
            .map(|rec| Shipped::record_mark(&rec.digest, &rec.stream))
    }

    /// Retry records of the streams in `only` (every record with `None`), oldest first.
    pub(super) fn records(&self, only: Option<&[StreamKey]>) -> Vec<RetryRecord> {
        self.requests
            .iter()
            .filter(|(_, rec)| only.is_none_or(|keys| keys.contains(&rec.stream)))
            .map(|(id, rec)| record(id, rec))
            .collect()
    }

    /// Takes the retry records a peer sent: those of ids it knows are kept.
    pub(super) fn adopt_records(&mut self, records: &[RetryRecord]) {
        for r in records {
            if !self.requests.contains(&r.id) {
                self.insert_record(&r.id, r.digest, r.stream.clone());
            }
        }
    }

    /// Whether the request ids of a POST are new to the session (or reuse answered ids): what
    /// [`RetryLedger::claim`] would register rather than join, replay or refuse, as of now.
    pub(super) fn is_new(&self, ids: &[RequestKey], digest: [u8; 32]) -> bool {
        matches!(self.classify(ids, digest), Dedupe::New | Dedupe::Reused)
    }

    /// Classifies the request ids of a POST against the records and, when they are new and
    /// their records fit in `room`, registers `stream` for them. To make room, spent streams
    /// ([`Stream::is_spent`]) are forgotten first, oldest first, then records whose stream is
    /// gone.
    pub(super) fn claim(
        &mut self,
        ids: &[RequestKey],
        digest: [u8; 32],
        stream: &Arc<Stream>,
        room: RetryRoom,
    ) -> Dedupe {
        let verdict = self.classify(ids, digest);
        if !matches!(verdict, Dedupe::New | Dedupe::Reused) {
            return verdict;
        }
        let now = Instant::now();
        self.window = room.window;
        self.trim_window(now);
        // Tombstones count against the session's budget too; they are never forgotten early
        // (a retry would run again), so a session full of them waits for them to expire.
        let need = ids.iter().map(record_bytes).sum::<u64>() + self.tombstones_charge.bytes();
        let fits = room.session_bytes.saturating_sub(need);
        if need > room.session_bytes || !self.shed(fits, now) {
            return Dedupe::SessionFull(room.session_bytes);
        }
        self.insert_stream(stream);
        for id in ids {
            self.insert_record(id, digest, stream.key().clone());
        }
        if matches!(verdict, Dedupe::Reused) {
            self.reuses_ids = true;
        }
        verdict
    }

    fn classify(&self, ids: &[RequestKey], digest: [u8; 32]) -> Dedupe {
        let mut found: Option<&StreamKey> = None;
        let mut unknown = 0;
        let mut reused = false;
        let mut expired = None;
        for id in ids {
            match self.requests.get(id) {
                None if self.tombstones.contains(id) && self.reuses_ids => reused = true,
                None if self.tombstones.contains(id) => expired = expired.or(Some(id)),
                None => unknown += 1,
                // Another body under the id of a request still running: refused, never run
                // beside it.
                Some(rec) if rec.digest != digest && self.runs(&rec.stream) => {
                    return Dedupe::Conflict;
                }
                // Another body under the id of an answered request: a new request.
                Some(rec) if rec.digest != digest => reused = true,
                // Answered, and its stream forgotten: a tombstone in all but name.
                Some(rec) if !self.holds(&rec.stream) => {
                    expired = expired.or(Some(id));
                }
                Some(rec) => match found {
                    Some(key) if *key != rec.stream => return Dedupe::Conflict,
                    _ => found = Some(&rec.stream),
                },
            }
        }
        match (found, expired) {
            // Retries of some requests and new ones in one POST: ids spread over several.
            (Some(_), _) if unknown > 0 || reused => Dedupe::Conflict,
            (_, Some(id)) => Dedupe::Expired(id.clone()),
            (None, None) if reused => Dedupe::Reused,
            (None, None) => Dedupe::New,
            (Some(key), None) => match (self.streams.get(key), self.answered.get(key)) {
                (Some(stream), _) => Dedupe::Retry(Arc::clone(stream)),
                (None, Some(answered)) => Dedupe::Answered(answered.reply()),
                (None, None) => Dedupe::Conflict,
            },
        }
    }

    /// Registers `stream`; beyond [`MAX_STREAMS`] the oldest complete streams nobody reads
    /// are forgotten, as many as are beyond (a walk that stops there).
    pub(super) fn insert_stream(&mut self, stream: &Arc<Stream>) {
        stream.count_replies_in(&self.replies);
        self.streams
            .insert(stream.key().clone(), Arc::clone(stream));
        self.stream_order.push_back(stream.key().clone());
        self.changes.stream(stream.key());
        let mut budget = self.stream_order.len().saturating_sub(MAX_STREAMS);
        let mut i = 0;
        while budget > 0 && i < self.stream_order.len() {
            let forget = self
                .streams
                .get(&self.stream_order[i])
                .is_none_or(|s| s.is_complete() && !s.is_active());
            if forget {
                if let Some(key) = self.stream_order.remove(i) {
                    self.forget(&key);
                }
                budget -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// Adds the retry record of `id` (forgetting the oldest over [`MAX_REQUEST_RECORDS`]) and
    /// counts its bytes.
    fn insert_record(&mut self, id: &RequestKey, digest: [u8; 32], stream: StreamKey) {
        let mut bytes = self.records_charge.bytes();
        if !self.requests.contains(id) {
            bytes += record_bytes(id);
        }
        // A reused id is the session's newest request: it leaves the window last.
        self.changes.request(id);
        if let Some(forgotten) = self
            .requests
            .insert_newest(id.clone(), RequestRecord { digest, stream })
        {
            bytes -= record_bytes(&forgotten);
            self.changes.request(&forgotten);
            self.bury(&forgotten, Instant::now());
        }
        self.records_charge.resize(bytes);
    }

    /// Forgets the retry records that lead to stream `key` (its requests were not carried
    /// out: a retry dispatches them again).
    pub(super) fn forget_records_of(&mut self, key: &StreamKey) {
        let mut bytes = self.records_charge.bytes();
        let changes = &mut self.changes;
        self.requests.forget_where(|id, rec| {
            let forget = rec.stream == *key;
            if forget {
                bytes -= record_bytes(id);
                changes.request(id);
            }
            forget
        });
        self.records_charge.resize(bytes);
    }

    /// Replaces `stream` by a compact answered record of `reply`, the complete answer its
    /// client was handed: a retry of its request replays the reply, at a fraction of a
    /// stream's memory.
    pub(super) fn settle(&mut self, stream: &Stream, reply: &StoredReply) {
        if !self.streams.contains_key(stream.key()) {
            return;
        }
        if self
            .answered
            .insert(stream.key().clone(), reply, stream.created())
        {
            self.streams.remove(stream.key());
            self.changes.stream(stream.key());
        }
    }

    /// Bytes of replayable retry state (records and stored replies).
    fn retry_bytes(&self) -> u64 {
        self.records_charge.bytes() + self.replies.bytes() + self.answered.bytes()
    }

    /// Keeps the ledger within its retry window, then forgets spent streams and records of
    /// streams no longer held until its retry state takes at most `target` bytes; whether it
    /// does.
    pub(super) fn shed_retry_state(&mut self, target: u64, now: Instant) -> bool {
        self.trim_window(now);
        self.shed(target, now)
    }

    /// Keeps the ledger within its [`RetryWindow`]: the records of requests beyond the newest
    /// `requests` are forgotten, oldest first, once their streams are spent (a walk that steps
    /// over requests still in use only), their ids buried and their streams forgotten; then
    /// spent streams beyond the window (streams no record leads to) and retry state beyond
    /// `bytes` ([`RetryLedger::shed`]).
    ///
    /// A walk that falls short of ⅞ of the window, everything beyond still in use, makes the
    /// next one wait [`WINDOW_WALK_PACE`].
    fn trim_window(&mut self, now: Instant) {
        if self.paced(now) {
            return;
        }
        let limit = self.window.bytes;
        let over_bytes = self.retry_bytes() > limit;
        let crowded = self.walk_window(now);
        self.shed(limit, now);
        let shed_short = over_bytes && self.retry_bytes() > limit / 8 * 7;
        self.crowded_at = (crowded || shed_short).then_some(now);
    }

    /// Whether a walk less than [`WINDOW_WALK_PACE`] ago found the ledger crowded: it fell
    /// short of ⅞ of the window, everything beyond still in use.
    fn paced(&self, now: Instant) -> bool {
        self.crowded_at
            .is_some_and(|at| now.saturating_duration_since(at) < WINDOW_WALK_PACE)
    }

    /// Once the ledger keeps more than its window's count of records or streams, forgets
    /// what [`RetryLedger::trim_window`] forgets down to ⅞ of the count (room for the next
    /// requests without another walk), stepping over what is still in use; whether it fell
    /// short of ⅞.
    fn walk_window(&mut self, now: Instant) -> bool {
        let keep = self.window.requests;
        let room = keep - keep / 8;
        let mut short = false;
        if self.requests.len() > keep {
            let streams = &self.streams;
            let forgotten = self.requests.forget_oldest_beyond(room, |_, rec| {
                streams
                    .get(&rec.stream)
                    .is_none_or(|s| s.kind().answers_requests() && s.is_spent(now))
            });
            if !forgotten.is_empty() {
                let bytes =
                    self.records_charge.bytes() - forgotten.iter().map(record_bytes).sum::<u64>();
                self.records_charge.resize(bytes);
                for id in &forgotten {
                    self.changes.request(id);
                    self.bury(id, now);
                }
            }
            short = self.requests.len() > room;
        }
        if self.stream_count() > keep {
            let mut i = 0;
            while self.stream_count() > room && i < self.stream_order.len() {
                match self.streams.get(&self.stream_order[i]) {
                    Some(s) if !(s.kind().answers_requests() && s.is_spent(now)) => i += 1,
                    _ => {
                        if let Some(key) = self.stream_order.remove(i) {
                            self.forget(&key);
                        }
                    }
                }
            }
            short |= self.stream_count() > room;
        }
        short
    }

    /// The tombstones not expired at `now`, to take to another pod (at most `max` ranges and
    /// `max` digests, those that expire last).
    pub(super) fn buried(&self, now: Instant, max: usize) -> Option<Buried> {
        let mut buried = self.tombstones.buried(now, max)?;
        buried.reuses_ids = self.reuses_ids;
        Some(buried)
    }

    /// Takes the tombstones another pod sent, into a ledger that buried nothing yet (its
    /// session just taken over), and counts them.
    pub(super) fn adopt_buried(&mut self, buried: &Buried, now: Instant) {
        self.tombstones.adopt(buried, now, self.window.ttl);
        self.reuses_ids |= buried.reuses_ids;
        self.tombstones_charge.resize(self.tombstones.bytes());
    }

    /// Leaves a tombstone for request `id`, until the window's TTL from now.
    fn bury(&mut self, id: &RequestKey, now: Instant) {
        self.tombstones.insert(id, now + self.window.ttl);
        self.tombstones_charge.resize(self.tombstones.bytes());
    }

    /// Whether the retry state takes at most `limit` bytes, once spent streams were forgotten
    /// when it did not, oldest first, then the records of streams no longer held, oldest
    /// first, down to ⅞ of `limit` (room for the next requests without another walk).
    fn shed(&mut self, limit: u64, now: Instant) -> bool {
        if self.retry_bytes() <= limit {
            return true;
        }
        let target = limit / 8 * 7;
        let Self {
            streams,
            answered,
            stream_order,
            requests,
            records_charge,
            replies,
            changes,
            ..
        } = self;
        stream_order.retain(|key| {
            if records_charge.bytes() + replies.bytes() + answered.bytes() <= target {
                return true;
            }
            match streams.get(key) {
                Some(s) if !s.is_spent(now) => true,
                _ => {
                    // The ledger's maps held the last reference: its reply is given back now.
                    if streams.remove(key).is_some() || answered.contains_key(key) {
                        answered.remove(key);
                        changes.stream(key);
                    }
                    false
                }
            }
        });
        let mut bytes = records_charge.bytes();
        let mut buried = Vec::new();
        requests.forget_where(|id, rec| {
            let forget = bytes + replies.bytes() + answered.bytes() > target
                && !streams.contains_key(&rec.stream)
                && !answered.contains_key(&rec.stream);
            if forget {
                bytes -= record_bytes(id);
                buried.push(id.clone());
            }
            forget
        });
        records_charge.resize(bytes);
        for id in &buried {
            self.changes.request(id);
            self.bury(id, now);
        }
        self.retry_bytes() <= limit
    }

    /// The spent streams ([`Stream::is_spent`]) at `now`, with their creation times: what the
    /// pod forgets first when its retry budget is over.
    pub(super) fn spent_streams(&self, now: Instant) -> Vec<(Instant, StreamKey)> {
        let answered = self
            .answered
            .iter()
            .map(|(key, a)| (a.created, key.clone()));
        self.streams
            .values()
            .filter(|s| s.is_spent(now))
            .map(|s| (s.created(), s.key().clone()))
            .chain(answered)
            .collect()
    }

    /// Forgets stream `key` if it is still spent at `now`; its position in the stream order
    /// goes with the next walk.
    pub(super) fn forget_spent(&mut self, key: &StreamKey, now: Instant) {
        if self.streams.get(key).is_none_or(|s| s.is_spent(now)) {
            self.forget(key);
        }
    }

    /// Forgets answered streams spent for the TTL (the oldest ones, in creation order: the walk
    /// stops at the first younger one) and expired tombstones.
    pub(super) fn expire(&mut self, now: Instant) {
        let ttl = self.window.ttl;
        let mut i = 0;
        while i < self.stream_order.len() {
            let key = &self.stream_order[i];
            let (created, spent) = match (self.streams.get(key), self.answered.get(key)) {
                (Some(s), _) => (s.created(), s.kind().answers_requests() && s.is_spent(now)),
                (None, Some(a)) => (a.created, true),
                (None, None) => {
                    self.stream_order.remove(i);
                    continue;
                }
            };
            if now.saturating_duration_since(created) < ttl {
                break;
            }
            if spent && let Some(key) = self.stream_order.remove(i) {
                self.forget(&key);
            } else {
                i += 1;
            }
        }
        if self.tombstones.expire(now) > 0 {
            let bytes = self.tombstones.bytes();
            self.tombstones_charge.resize(bytes);
        }
    }

    /// When the first thing the ledger holds expires after `now`: an event, a stream or an
    /// answered record reaching the TTL, a tombstone.
    pub(super) fn next_expiry(&self, now: Instant) -> Option<Instant> {
        let ttl = self.window.ttl;
        self.streams
            .values()
            .flat_map(|s| {
                let forgotten = s.kind().answers_requests().then(|| s.created() + ttl);
                s.first_expiry().into_iter().chain(forgotten)
            })
            .chain(self.answered.iter().map(|(_, a)| a.created + ttl))
            .chain(self.tombstones.first_expiry())
            .filter(|&at| at > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::answered::ANSWERED_OVERHEAD;
    use super::tombstones::RANGE_BYTES;
    use super::*;
    use crate::session::fixtures::{key, limits};
    use crate::stream::Head;

    const TTL: Duration = Duration::from_secs(60);

    /// A window of `requests` and `bytes`, within no session budget, and a reply.
    fn window_of(requests: usize, bytes: u64) -> (RetryRoom, StoredReply) {
        let room = RetryRoom {
            session_bytes: u64::MAX,
            window: RetryWindow {
                requests,
                bytes,
                ttl: TTL,
            },
        };
        let reply = StoredReply {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(b"{}"),
        };
        (room, reply)
    }

    /// A POST stream of the pod `pod` carrying the answers to `ids`.
    fn stream(pod: &Retained, ids: &[RequestKey]) -> Arc<Stream> {
        Stream::new(
            StreamKind::Post,
            ids.to_vec(),
            limits(),
            pod.account(),
            CancellationToken::new(),
        )
    }

    /// Claims request `i` in `ledger` as a new one, and answers it with `reply` (unread).
    fn answered(
        ledger: &mut RetryLedger,
        pod: &Retained,
        i: i64,
        room: RetryRoom,
        reply: &StoredReply,
    ) -> Arc<Stream> {
        let st = stream(pod, &[key(i)]);
        assert!(matches!(
            ledger.claim(&[key(i)], [1; 32], &st, room),
            Dedupe::New
        ));
        st.store_reply(reply.clone());
        ledger.shed_retry_state(u64::MAX, Instant::now());
        st
    }

    /// What a retry of request `i` (the same body) finds.
    fn retry(ledger: &mut RetryLedger, pod: &Retained, i: i64, room: RetryRoom) -> Dedupe {
        let st = stream(pod, &[key(i)]);
        ledger.claim(&[key(i)], [1; 32], &st, room)
    }

    #[tokio::test]
    async fn the_retry_window_keeps_the_newest_answers_and_buries_the_rest() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (room, reply) = window_of(4, u64::MAX);
        let total = MAX_REQUEST_RECORDS as i64 + 100;
        for i in 1..=total {
            let st = answered(&mut ledger, &pod, i, room, &reply);
            assert!(matches!(st.wait_head().await, Head::Stored(_)), "served");
        }
        assert!(ledger.streams().count() <= 5);
        assert!(
            matches!(retry(&mut ledger, &pod, total, room), Dedupe::Retry(_)),
            "the newest is replayed"
        );
        assert!(
            matches!(
                retry(&mut ledger, &pod, total - 100, room),
                Dedupe::Expired(_)
            ),
            "forgotten, its record left: no longer available"
        );
        assert!(
            matches!(retry(&mut ledger, &pod, 1, room), Dedupe::Expired(_)),
            "its record forgotten too: a tombstone answers"
        );
        assert!(ledger.requests.len() <= MAX_REQUEST_RECORDS);
        assert_eq!(
            ledger.tombstones_charge.bytes(),
            RANGE_BYTES,
            "the 100 records forgotten, ids 1 to 100: one range"
        );
    }

    #[tokio::test]
    async fn a_window_crowded_with_answers_nobody_read_is_walked_once_per_pace() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (room, reply) = window_of(2, u64::MAX);
        let first = answered(&mut ledger, &pod, 1, room, &reply);
        let _unread = [2, 3].map(|i| answered(&mut ledger, &pod, i, room, &reply));
        assert!(
            ledger.crowded_at.is_some(),
            "three answers nobody read in a window of two: the walk forgot none"
        );
        assert!(matches!(first.wait_head().await, Head::Stored(_)), "served");
        let _fourth = answered(&mut ledger, &pod, 4, room, &reply);
        assert!(
            ledger.requests.contains(&key(1)),
            "within the pace, no walk: the spent record stays"
        );
        ledger.crowded_at = Some(Instant::now() - WINDOW_WALK_PACE);
        let _fifth = answered(&mut ledger, &pod, 5, room, &reply);
        assert!(
            !ledger.requests.contains(&key(1)),
            "the pace over, the walk forgot the spent record"
        );
        assert!(ledger.requests.contains(&key(2)), "an unread answer stays");
        assert!(
            ledger.crowded_at.is_some(),
            "still crowded: walked again later"
        );
    }

    #[tokio::test]
    async fn a_settled_stream_is_a_compact_record_until_the_ttl() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (room, reply) = window_of(8, u64::MAX);
        let st = answered(&mut ledger, &pod, 1, room, &reply);
        assert!(matches!(st.wait_head().await, Head::Stored(_)));
        let handed = st.handed_answer().expect("its client was handed the reply");
        ledger.settle(&st, &handed);
        assert_eq!(ledger.streams().count(), 0, "the stream gave way");
        drop(st);
        assert_eq!(ledger.replies.bytes(), 0, "the stream's reply went with it");
        assert_eq!(
            ledger.answered.bytes(),
            ANSWERED_OVERHEAD + reply.body.len() as u64,
            "the record's bytes are counted"
        );
        match retry(&mut ledger, &pod, 1, room) {
            Dedupe::Answered(again) => assert_eq!(again, reply),
            v => panic!("expected the answer again, got {v:?}"),
        }
        let (streams, _) = ledger.snapshot(usize::MAX);
        assert!(
            streams.len() == 1 && streams[0].complete,
            "an image carries it as a complete stream"
        );
        ledger.expire(Instant::now() + TTL + Duration::from_secs(1));
        assert_eq!(ledger.answered.len(), 0);
        assert_eq!(ledger.answered.bytes(), 0);
        assert!(
            matches!(retry(&mut ledger, &pod, 1, room), Dedupe::Expired(_)),
            "no longer available"
        );
    }

    #[test]
    fn tombstones_expire_with_the_ttl() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (room, reply) = window_of(1, u64::MAX);
        for i in 1..=3 {
            let st = answered(&mut ledger, &pod, i, room, &reply);
            drop(futures::executor::block_on(st.wait_head()));
        }
        assert!(
            ledger.tombstones.bytes() > 0,
            "a window of one request buries what it forgets"
        );
        let now = Instant::now();
        assert!(
            ledger.next_expiry(now).is_some_and(|at| at <= now + TTL),
            "the sweeper comes back for them"
        );
        ledger.expire(now + TTL + Duration::from_secs(1));
        assert_eq!(ledger.tombstones_charge.bytes(), 0);
        assert!(
            matches!(retry(&mut ledger, &pod, 1, room), Dedupe::New),
            "beyond the TTL a request id is new again"
        );
    }

    #[test]
    fn a_withdrawn_request_runs_again_on_a_retry() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (room, _) = window_of(8, u64::MAX);
        let st = stream(&pod, &[key(1)]);
        assert!(matches!(
            ledger.claim(&[key(1)], [1; 32], &st, room),
            Dedupe::New
        ));
        assert!(matches!(
            retry(&mut ledger, &pod, 1, room),
            Dedupe::Retry(_)
        ));
        let bytes = ledger.records_charge.bytes();
        ledger.forget_records_of(st.key());
        assert_eq!(
            ledger.records_charge.bytes(),
            bytes - record_bytes(&key(1)),
            "its record's bytes given back"
        );
        assert!(matches!(retry(&mut ledger, &pod, 1, room), Dedupe::New));
    }

    #[test]
    fn a_full_budget_refuses_new_requests_and_registers_nothing() {
        let pod = Retained::new(u64::MAX);
        let mut ledger = RetryLedger::new(&pod);
        let (window, _) = window_of(8, u64::MAX);
        let room = RetryRoom {
            session_bytes: record_bytes(&key(1)),
            ..window
        };
        let running = stream(&pod, &[key(1)]);
        assert!(matches!(
            ledger.claim(&[key(1)], [1; 32], &running, room),
            Dedupe::New
        ));
        let st = stream(&pod, &[key(2)]);
        assert!(matches!(
            ledger.claim(&[key(2)], [1; 32], &st, room),
            Dedupe::SessionFull(_)
        ));
        assert!(ledger.stream(st.key()).is_none(), "nothing registered");
        assert!(ledger.is_new(&[key(2)], [1; 32]));
    }
}
