//! The compact record of a request answered with a complete (non-SSE) reply that its client
//! was handed (`docs/design/buffering.md#retries`): what a retry of the request replays, in
//! one allocation of the reply's bytes instead of a whole [`Stream`](crate::stream::Stream).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::mcp::cursor::StreamKey;
use crate::retained::Charge;
use crate::stream::{StoredReply, StreamKind, StreamSnapshot};

/// Bytes an answered record takes besides its reply's header fields and body: the record and
/// its entries in the answered-record table and the stream order (measured with massif,
/// `docs/design/buffering.md#what-a-request-costs`).
pub(super) const ANSWERED_OVERHEAD: u64 = 96;

/// Separates header names, values and the body in [`Answered::data`]: a byte no header name or
/// value holds.
const SEP: u8 = 0;

/// A request's complete answer, kept for retries once its stream was spent.
#[derive(Debug)]
pub(super) struct Answered {
    /// When this pod created the stream that carried it (the TTL counts from there).
    pub(super) created: Instant,
    status: StatusCode,
    /// Bytes of `data` before the body.
    head_len: u32,
    /// Every header as `name NUL value NUL`, then the body.
    data: Box<[u8]>,
}

/// A session's answered records by stream key, their bytes counted in the pod's tally of
/// replies.
#[derive(Debug)]
pub(super) struct Answers {
    records: HashMap<StreamKey, Box<Answered>>,
    charge: Charge,
}

impl Answers {
    /// None yet; `charge` counts them (`Kind::Replies`).
    pub(super) fn new(charge: Charge) -> Self {
        Self {
            records: HashMap::new(),
            charge,
        }
    }

    /// Keeps the record of `reply` for stream `key` (created at `created`); `false` when the
    /// reply cannot be encoded ([`Answered::of`]).
    pub(super) fn insert(&mut self, key: StreamKey, reply: &StoredReply, created: Instant) -> bool {
        let Some(answered) = Answered::of(reply, created) else {
            return false;
        };
        let bytes = self.charge.bytes() + answered.bytes();
        self.charge.resize(bytes);
        if let Some(old) = self.records.insert(key, Box::new(answered)) {
            let bytes = self.charge.bytes() - old.bytes();
            self.charge.resize(bytes);
        }
        true
    }

    /// Forgets the record of stream `key`, if there is one.
    pub(super) fn remove(&mut self, key: &StreamKey) {
        if let Some(old) = self.records.remove(key) {
            let bytes = self.charge.bytes() - old.bytes();
            self.charge.resize(bytes);
        }
    }

    /// The record of stream `key`.
    pub(super) fn get(&self, key: &StreamKey) -> Option<&Answered> {
        self.records.get(key).map(Box::as_ref)
    }

    /// Whether stream `key` has a record.
    pub(super) fn contains_key(&self, key: &StreamKey) -> bool {
        self.records.contains_key(key)
    }

    /// How many records there are.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Every record with its stream key.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&StreamKey, &Answered)> {
        self.records.iter().map(|(key, a)| (key, a.as_ref()))
    }

    /// Bytes the records take ([`ANSWERED_OVERHEAD`] each besides their data).
    pub(super) fn bytes(&self) -> u64 {
        self.charge.bytes()
    }
}

impl Answered {
    /// The record of `reply`; `None` for a reply whose headers do not fit the encoding (a value
    /// holding NUL, which `http` rejects anyway) or over 4 GiB.
    fn of(reply: &StoredReply, created: Instant) -> Option<Self> {
        let mut data = Vec::with_capacity(encoded_len(reply));
        for (name, value) in &reply.headers {
            if value.as_bytes().contains(&SEP) {
                return None;
            }
            data.extend_from_slice(name.as_str().as_bytes());
            data.push(SEP);
            data.extend_from_slice(value.as_bytes());
            data.push(SEP);
        }
        let head_len = u32::try_from(data.len()).ok()?;
        data.extend_from_slice(&reply.body);
        u32::try_from(data.len()).ok()?;
        Some(Self {
            created,
            status: reply.status,
            head_len,
            data: data.into_boxed_slice(),
        })
    }

    /// Bytes it takes, as counted: its data and [`ANSWERED_OVERHEAD`].
    fn bytes(&self) -> u64 {
        ANSWERED_OVERHEAD + self.data.len() as u64
    }

    /// The reply again, as the upstream gave it (header order kept).
    pub(super) fn reply(&self) -> StoredReply {
        let (head, body) = self.data.split_at(self.head_len as usize);
        let mut headers = HeaderMap::new();
        let mut fields = head.split(|&b| b == SEP);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.append(name, value);
            }
        }
        StoredReply {
            status: self.status,
            headers,
            body: Bytes::copy_from_slice(body),
        }
    }

    /// The stream `key` it stands for, as a handoff image carries it: complete, with its
    /// reply and no events.
    pub(super) fn snapshot(&self, key: &StreamKey) -> StreamSnapshot {
        StreamSnapshot {
            key: key.clone(),
            kind: StreamKind::Post,
            pending: Vec::new(),
            complete: true,
            stored: Some(self.reply()),
            sse: None,
            last_seq: 0,
            evicted_through: 0,
            events: Vec::new(),
            withdrawn: false,
        }
    }
}

/// Bytes `reply` takes encoded.
fn encoded_len(reply: &StoredReply) -> usize {
    let head: usize = reply
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 2)
        .sum();
    head + reply.body.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retained::{Kind, Retained};
    use http::HeaderValue;

    fn answers(pod: &Retained) -> Answers {
        Answers::new(pod.charge(Kind::Replies))
    }

    #[test]
    fn a_reply_comes_back_as_it_was_kept_and_its_bytes_are_counted_while_it_is() {
        let pod = Retained::new(u64::MAX);
        let mut kept = answers(&pod);
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-trace", HeaderValue::from_static("a"));
        headers.append("x-trace", HeaderValue::from_static("b"));
        headers.append("x-empty", HeaderValue::from_static(""));
        let reply = StoredReply {
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
        };
        let key = StreamKey::random();
        assert!(kept.insert(key.clone(), &reply, Instant::now()));
        assert_eq!(kept.get(&key).map(Answered::reply), Some(reply.clone()));
        let data = encoded_len(&reply) as u64;
        assert_eq!(kept.bytes(), ANSWERED_OVERHEAD + data);
        assert_eq!(pod.bytes(Kind::Replies), ANSWERED_OVERHEAD + data);
        assert!(kept.insert(key.clone(), &reply, Instant::now()));
        assert_eq!(kept.bytes(), ANSWERED_OVERHEAD + data, "a record replaced");
        kept.remove(&key);
        assert_eq!(kept.bytes(), 0, "given back with the record");
        assert_eq!(pod.bytes(Kind::Replies), 0);
    }

    #[test]
    fn an_empty_reply_round_trips() {
        let pod = Retained::new(u64::MAX);
        let mut kept = answers(&pod);
        let reply = StoredReply {
            status: StatusCode::ACCEPTED,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        let key = StreamKey::random();
        assert!(kept.insert(key.clone(), &reply, Instant::now()));
        assert_eq!(kept.get(&key).map(Answered::reply), Some(reply));
    }
}
