//! The handoff part of the fuzzing face ([`crate::fuzzing`], `--cfg fuzzing` only): peer
//! messages decoded as the peer listener decodes them, and pushed sessions adopted, read by
//! clients and re-imaged as a receiving pod does. Here because the wire format stays inside
//! `handoff/`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::image;
use crate::peer::wire::{CancelPush, SessionPush, TailPush};
use crate::retained::Retained;
use crate::stream::buffer::BufferLimits;
use crate::stream::{FeedItem, Start, Stream, StreamKind};

/// The kinds of peer message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMessage {
    /// `POST /v2/sessions`.
    Session,
    /// `POST /v2/tail`.
    Tail,
    /// `POST /v2/cancel`.
    Cancel,
}

/// A decoded peer message encoded, decoded and encoded again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireTrip {
    /// The decoded message, encoded.
    pub encoded: Vec<u8>,
    /// Whether decoding `encoded` gave back the decoded message.
    pub same_value: bool,
    /// The message decoded from `encoded`, encoded again.
    pub reencoded: Vec<u8>,
}

/// See [`crate::fuzzing::wire_round_trip`].
pub(crate) fn wire_round_trip(kind: PeerMessage, body: &[u8]) -> Option<WireTrip> {
    match kind {
        PeerMessage::Session => trip::<SessionPush>(body),
        PeerMessage::Tail => trip::<TailPush>(body),
        PeerMessage::Cancel => trip::<CancelPush>(body),
    }
}

fn trip<M: Serialize + DeserializeOwned + PartialEq>(body: &[u8]) -> Option<WireTrip> {
    let message: M = serde_json::from_slice(body).ok()?;
    let encoded = serde_json::to_vec(&message).ok()?;
    let again: Option<M> = serde_json::from_slice(&encoded).ok();
    let reencoded = again
        .as_ref()
        .and_then(|m| serde_json::to_vec(m).ok())
        .unwrap_or_default();
    Some(WireTrip {
        same_value: again.as_ref() == Some(&message),
        encoded,
        reencoded,
    })
}

/// One stream of an adopted session, as the receiving pod holds it and as clients read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredStream {
    /// The stream key.
    pub key: String,
    /// `post`, `batch` or `standalone`.
    pub kind: &'static str,
    /// Whether the stream is complete.
    pub complete: bool,
    /// Whether the stream is still written by the sending pod.
    pub following: bool,
    /// Its last sequence number.
    pub last_seq: u64,
    /// Events at or below this sequence were evicted.
    pub evicted_through: u64,
    /// The buffered events: sequence, `event` field, data.
    pub events: Vec<(u64, Option<String>, Vec<u8>)>,
    /// What a client reading the stream from its start is sent (no keep-alives) before it
    /// would wait, with whether the pod primes the session's streams.
    pub replay: Vec<u8>,
    /// What a client at the stream's end is sent first (a priming event, where the session
    /// primes and the stream is not followed).
    pub at_end: Vec<u8>,
    /// For a followed stream: what a client reading from the start is sent once the sending
    /// pod is found dead and the stream abandoned (its pending requests failed).
    pub after_abandon: Option<Vec<u8>>,
}

/// A pushed session as the receiving pod adopted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adopted {
    /// Whether the session's streams get priming events (negotiated 2025-11-25 or later).
    pub primes: bool,
    /// The push as decoded, encoded.
    pub pushed: Vec<u8>,
    /// Whether a tail was applied after the push.
    pub tail_applied: bool,
    /// The push the receiver would send on (the image of the adopted session), encoded:
    /// adopting it elsewhere gives the same image again.
    pub reimaged: Vec<u8>,
    /// The adopted session's streams, by key.
    pub streams: Vec<RestoredStream>,
}

/// The buffer bounds of the adopting pod: the defaults of `spec.buffer`.
const LIMITS: BufferLimits = BufferLimits {
    max_events: 1024,
    max_bytes: 4 * 1024 * 1024,
    ttl: Duration::from_secs(600),
    unread_ttl: Duration::from_secs(60),
};

thread_local! {
    /// A runtime to read streams with (their feeds wait with tokio's timer).
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
}

/// See [`crate::fuzzing::adopt`].
pub(crate) fn adopt(input: &[u8]) -> Result<Adopted, String> {
    let (push, tail) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], Some(&input[at + 1..])),
        None => (input, None),
    };
    let push: SessionPush = serde_json::from_slice(push).map_err(|e| e.to_string())?;
    let retained = Retained::new(u64::MAX);
    let session = image::restore_session(
        &push.session,
        crate::keys::test_key(),
        &push.from,
        LIMITS,
        &retained,
    )?;
    let tail: Option<TailPush> = tail.and_then(|t| serde_json::from_slice(t).ok());
    let tail_applied = tail.as_ref().is_some_and(|t| t.session == push.session.id);
    if let Some(tail) = tail.filter(|_| tail_applied) {
        image::import(&session, &tail.streams, &tail.requests, &tail.from, LIMITS);
    }
    let (snapshot, _) = session.snapshot(usize::MAX);
    let mut reimage = image::session_image(&snapshot);
    // The ages of accepted credentials grow with the wall clock between restore and snapshot;
    // the images compared are those with the ages left out.
    for accepted in &mut reimage.accepted {
        accepted.age_ms = 0;
    }
    // So do the times tombstones have left shrink: they are compared as a fixed time.
    if let Some(tombstones) = &mut reimage.tombstones {
        tombstones.ranges.iter_mut().for_each(|r| r.2 = 60_000);
        tombstones.ids.iter_mut().for_each(|i| i.1 = 60_000);
        tombstones.ids.sort_unstable();
    }
    let reimaged = serde_json::to_vec(&SessionPush {
        from: push.from.clone(),
        session: reimage,
    })
    .map_err(|e| e.to_string())?;
    let primes = session.primes();
    let mut streams: Vec<RestoredStream> = session
        .streams()
        .iter()
        .map(|s| restored(s, primes))
        .collect();
    streams.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Adopted {
        primes,
        pushed: serde_json::to_vec(&push).map_err(|e| e.to_string())?,
        tail_applied,
        reimaged,
        streams,
    })
}

fn restored(stream: &Arc<Stream>, primes: bool) -> RestoredStream {
    let (snapshot, _) = stream.snapshot(0, usize::MAX);
    let following = stream.following().is_some();
    let replay = read(stream, Start::After(0), primes);
    let at_end = read_first(stream, Start::After(stream.last_seq()), primes);
    let after_abandon = following.then(|| {
        stream.abandon_following(crate::stream::WriterLost::Handoff);
        read(stream, Start::After(0), primes)
    });
    RestoredStream {
        key: snapshot.key.to_string(),
        kind: match snapshot.kind {
            StreamKind::Post => "post",
            StreamKind::Batch => "batch",
            StreamKind::Standalone => "standalone",
        },
        complete: snapshot.complete,
        following,
        last_seq: snapshot.last_seq,
        evicted_through: snapshot.evicted_through,
        events: snapshot
            .events
            .into_iter()
            .map(|e| (e.seq, e.event, e.data.to_vec()))
            .collect(),
        replay,
        at_end,
        after_abandon,
    }
}

/// What a new reader at `start` is sent until it would wait (keep-alives left out).
fn read(stream: &Arc<Stream>, start: Start, primes: bool) -> Vec<u8> {
    let mut feed = stream.attach(start, false, primes, Duration::ZERO);
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let mut out = Vec::new();
            // Each item is a batch of events, so a few suffice; the bound keeps a stream that
            // keeps producing from looping.
            for _ in 0..16 {
                match feed.next().await {
                    FeedItem::Data(d) if d.as_ref() == crate::mcp::sse::KEEP_ALIVE => break,
                    FeedItem::Data(d) => out.extend_from_slice(&d),
                    FeedItem::End | FeedItem::Lost => break,
                }
            }
            out
        })
    })
}

/// The first thing a new reader at `start` is sent (empty: nothing before it would wait).
fn read_first(stream: &Arc<Stream>, start: Start, primes: bool) -> Vec<u8> {
    let mut feed = stream.attach(start, false, primes, Duration::ZERO);
    RUNTIME.with(|rt| {
        rt.block_on(async {
            match feed.next().await {
                FeedItem::Data(d) if d.as_ref() != crate::mcp::sse::KEEP_ALIVE => d.to_vec(),
                _ => Vec::new(),
            }
        })
    })
}
