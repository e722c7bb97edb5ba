//! What a session's replica must carry, as a mark that changes with it
//! (`docs/design/replication.md#keeping-a-replica-current`): the holder sends a replica again
//! only when its mark changed, never for each event of a running request (without
//! `replication: Events`).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::{RetryRecord, Session, SessionSnapshot, Standalone};
use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::RequestKey;
use crate::stream::StreamSnapshot;

/// Bytes [`Shipped`] takes per stream or retry record it lists (key, mark, table room).
const SHIPPED_ENTRY_BYTES: u64 = 48;
/// Most tombstones a replica carries, of ranges of integer request ids and of other ids each,
/// those that expire last: they go with every change of the session, so a busy session whose
/// client numbers its requests with text ids would otherwise send thousands every round.
const REPLICA_BURIED_IDS: usize = 64;

/// What the replica pod's copy of a session holds, as its holder last had it acknowledged:
/// each stream with a digest of what its replica carries, and each retry record. A change
/// carries only what differs from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shipped {
    streams: HashMap<StreamKey, u64>,
    /// Each retry record with a digest of what it says (its body's digest, its stream): a
    /// reused id's new record differs.
    requests: HashMap<RequestKey, u64>,
}

impl Shipped {
    /// The digest of stream `key` whose [`crate::stream::Stream::mark`] `mark` feeds.
    pub(super) fn stream_mark(key: &StreamKey, mark: impl FnOnce(&mut DefaultHasher)) -> u64 {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        mark(&mut h);
        h.finish()
    }

    pub(super) fn has_stream(&self, key: &StreamKey, mark: u64) -> bool {
        self.streams.get(key) == Some(&mark)
    }

    /// Whether it lists stream `key`, as it is or not.
    pub(super) fn holds_stream(&self, key: &StreamKey) -> bool {
        self.streams.contains_key(key)
    }

    pub(super) fn add_stream(&mut self, key: &StreamKey, mark: u64) {
        self.streams.insert(key.clone(), mark);
    }

    /// The digest of a retry record for the body of SHA-256 `digest` whose answer is on
    /// stream `stream`.
    pub(super) fn record_mark(digest: &[u8; 32], stream: &StreamKey) -> u64 {
        let mut h = DefaultHasher::new();
        digest.hash(&mut h);
        stream.hash(&mut h);
        h.finish()
    }

    pub(super) fn has_request(&self, id: &RequestKey, mark: u64) -> bool {
        self.requests.get(id) == Some(&mark)
    }

    /// Whether it lists the retry record of request `id`, as it is or not.
    pub(super) fn holds_request(&self, id: &RequestKey) -> bool {
        self.requests.contains_key(id)
    }

    pub(super) fn add_request(&mut self, id: &RequestKey, mark: u64) {
        self.requests.insert(id.clone(), mark);
    }

    /// What the replica pod holds once it kept `change` of it.
    pub(crate) fn apply(&mut self, change: ShippedChange) {
        self.streams.extend(change.adds.streams);
        self.requests.extend(change.adds.requests);
        for key in &change.forgotten_streams {
            self.streams.remove(key);
        }
        for id in &change.forgotten_requests {
            self.requests.remove(id);
        }
    }

    /// Bytes it takes, for `tether_retained_bytes{kind="replicas"}` at the holder.
    pub(crate) fn bytes(&self) -> u64 {
        let keys: usize = self.requests.keys().map(|id| id.as_json().len()).sum();
        (self.streams.len() + self.requests.len()) as u64 * SHIPPED_ENTRY_BYTES + keys as u64
    }
}

/// A change of what a replica pod's copy of a session holds ([`Shipped::apply`]).
#[derive(Debug, Default)]
pub(crate) struct ShippedChange {
    /// Streams and records added or replaced.
    pub(crate) adds: Shipped,
    pub(crate) forgotten_streams: Vec<StreamKey>,
    pub(crate) forgotten_requests: Vec<RequestKey>,
}

/// A session's replica to send: whole, or what changed since what the replica pod holds
/// ([`Session::replica`]).
#[derive(Debug, Default)]
pub(crate) struct ReplicaParts {
    /// The streams to send: every stream, or those new or changed.
    pub(crate) streams: Vec<StreamSnapshot>,
    /// The retry records to send: every record, or those new.
    pub(crate) records: Vec<RetryRecord>,
    /// Streams the replica pod holds that the session no longer keeps.
    pub(crate) forgotten_streams: Vec<StreamKey>,
    /// Retry records the replica pod holds that the session no longer keeps.
    pub(crate) forgotten_requests: Vec<RequestKey>,
    /// What the replica pod holds once it applied these: all of it, or (with
    /// [`ReplicaParts::change`]) what these add to what it held.
    pub(crate) shipped: Shipped,
    /// [`ReplicaParts::shipped`] lists what these add, not all the replica pod holds.
    pub(crate) change: bool,
}

impl ReplicaParts {
    /// Lists what `since` holds that [`ReplicaParts::shipped`] no longer does.
    pub(super) fn forget_what(&mut self, since: &Shipped) {
        self.forgotten_streams = since
            .streams
            .keys()
            .filter(|key| !self.shipped.streams.contains_key(key))
            .cloned()
            .collect();
        self.forgotten_requests = since
            .requests
            .keys()
            .filter(|id| !self.shipped.requests.contains_key(id))
            .cloned()
            .collect();
    }
}

impl Session {
    /// A digest of what a replica of the session carries: its epoch, journal, binding and the
    /// credentials the MCP server accepted, the standalone stream's refusal, and its ledger
    /// (streams and retry records); with `events`, each stream's numbering too.
    pub(crate) fn replica_mark(&self, events: bool) -> u64 {
        let mut h = DefaultHasher::new();
        {
            let st = self.state.lock();
            st.holding.epoch().hash(&mut h);
            st.journal.hash(&mut h);
            matches!(st.standalone, Standalone::Unsupported(_)).hash(&mut h);
            st.ledger.mark(&mut h, events);
        }
        self.binding().map(|b| b.principal).hash(&mut h);
        self.is_credentialed().hash(&mut h);
        for (credential, _) in self.credentials.accepted_ages() {
            credential.hash(&mut h);
        }
        h.finish()
    }

    /// The session's replica: with `since` (what the replica pod holds), its head, the streams
    /// new or changed since and the retry records new since, and what the replica pod no longer
    /// keeps; with `None`, whole. Streams carry at most `max_bytes` of events in all.
    pub(crate) fn replica(
        &self,
        events: bool,
        max_bytes: usize,
        since: Option<&Shipped>,
    ) -> (SessionSnapshot, ReplicaParts) {
        let mut st = self.state.lock();
        let mut parts = st.ledger.replica_parts(events, max_bytes, since);
        let records = std::mem::take(&mut parts.records);
        let streams = std::mem::take(&mut parts.streams);
        (
            self.snapshot_of(&st, records, streams, REPLICA_BURIED_IDS),
            parts,
        )
    }

    /// Nobody follows the session's replica any more (the replicator stopped tracking it):
    /// what changes in its ledger is no longer listed.
    pub(crate) fn unfollow_replica(&self) {
        self.state.lock().ledger.unfollow_replica();
    }

    /// Whether `shipped` (what the replica pod's copy holds) has the retry records of
    /// requests `ids` as the session has them now.
    pub(crate) fn shipped_has(&self, shipped: &Shipped, ids: &[RequestKey]) -> bool {
        let st = self.state.lock();
        ids.iter().all(|id| {
            st.ledger
                .record_mark(id)
                .is_some_and(|mark| shipped.has_request(id, mark))
        })
    }

    /// The session's head with the streams and retry records of requests `ids` alone
    /// ([`super::ledger::RetryLedger::request_parts`]); the parts list only these.
    pub(crate) fn replica_of_requests(
        &self,
        ids: &[RequestKey],
        events: bool,
        max_bytes: usize,
    ) -> (SessionSnapshot, ReplicaParts) {
        let st = self.state.lock();
        let mut parts = st.ledger.request_parts(ids, events, max_bytes);
        let records = std::mem::take(&mut parts.records);
        let streams = std::mem::take(&mut parts.streams);
        (
            self.snapshot_of(&st, records, streams, REPLICA_BURIED_IDS),
            parts,
        )
    }
}
