//! Sessions, streams and request ids for unit tests of the crate (`#[cfg(test)]`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tether_crds::ProtocolVersion;

use super::journal::Journal;
use super::{RetryRoom, RetryWindow, Session};
use crate::mcp::jsonrpc::RequestKey;
use crate::stream::buffer::BufferLimits;
use crate::stream::{Stream, StreamKind};

/// A session with id `id` (digest `digest`), negotiated 2025-06-18, no upstream session yet.
pub(crate) fn session() -> Arc<Session> {
    Session::new(
        "id".into(),
        crate::keys::test_key(),
        None,
        ProtocolVersion::V2025_06_18,
        Journal::new(Value::Null),
        &crate::retained::Retained::new(u64::MAX),
    )
}

/// Room for any retry state: no session or pod budget, no retry window in the way.
pub(crate) const ANY_ROOM: RetryRoom = RetryRoom {
    session_bytes: u64::MAX,
    window: RetryWindow {
        requests: usize::MAX,
        bytes: u64::MAX,
        ttl: Duration::from_secs(60),
    },
};

/// The bounds of a test stream: 8 events, 1 KiB, 60 s.
pub(crate) fn limits() -> BufferLimits {
    BufferLimits {
        max_events: 8,
        max_bytes: 1024,
        ttl: Duration::from_secs(60),
        unread_ttl: Duration::from_secs(60),
    }
}

/// A POST stream of session `s` carrying the answers to `ids`.
pub(crate) fn stream(s: &Session, ids: &[RequestKey]) -> Arc<Stream> {
    Stream::new(
        StreamKind::Post,
        ids.to_vec(),
        limits(),
        s.account(),
        s.child_token(),
    )
}

/// The request id `i`.
pub(crate) fn key(i: i64) -> RequestKey {
    RequestKey::of(&Value::from(i))
}
