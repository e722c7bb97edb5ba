//! Forwarding the tail of a handed-off session (`docs/design/handoff.md#moving-one-session`, step
//! 5): every event its still-running requests produce here, and the end of each stream, is sent to
//! the new holder (`POST /v2/tail`) as soon as it happens, until every stream is complete and sent.
//! A message the new holder does not take is sent again with backoff ([`RETRY_PAUSES`]) for up to
//! `spec.drain.timeout` of failures in a row; a new holder that left membership, refuses
//! connections or lost the session ends the follow with [`Followed::HolderLost`], and the session
//! is pushed again from here; one where the session ended (409 `ended`: the client deleted it,
//! it expired) ends it here too ([`Followed::Ended`]), so it never lives on elsewhere.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;

use super::image;
use super::{Handoff, MESSAGE_OVERHEAD};
use crate::cluster::membership::Peer;
use crate::mcp::cursor::StreamKey;
use crate::peer::TAIL_PATH;
use crate::peer::client::{Destination, SendError};
use crate::peer::wire::TailPush;
use crate::session::{Session, SessionSnapshot, Standalone};
use crate::stream::{Stream, StreamKind};

/// Longest wait between checks when nothing wakes the follower.
const IDLE_CHECK: Duration = Duration::from_millis(500);
/// How long the standalone stream stays open after the last call that ran here finished, when
/// the MCP server does not end the upstream session (it forbids client termination).
const STANDALONE_LINGER: Duration = Duration::from_millis(500);
/// How long the standalone stream may take to end after its upstream session ended (its pump
/// reads what the MCP server sent before the end; a busy pod may take a while).
const STANDALONE_END_WAIT: Duration = Duration::from_secs(5);
/// Pauses between attempts at a tail message the new holder did not take (the last repeats).
const RETRY_PAUSES: [Duration; 5] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];

/// How a follow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Followed {
    /// Every stream is complete and sent.
    Done,
    /// The new holder left, refuses connections, or lost the session.
    HolderLost,
    /// The session ended at the new holder.
    Ended,
    /// The new holder, still alive, took no message for `spec.drain.timeout`.
    GaveUp,
    /// The session was taken back here meanwhile.
    Reclaimed,
}

/// What became of one tail message.
enum Delivery {
    Taken,
    HolderLost,
    Ended,
    GaveUp,
}

/// What the receiver has of one stream.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Sent {
    /// Sequence it is at.
    position: u64,
    /// Pending requests it knows.
    pending: usize,
    /// Whether it knows the answer's head.
    head: bool,
    /// It has the complete stream.
    done: bool,
}

/// What the receiver has of each stream once it adopted `image` (taken with `positions`, see
/// [`Session::snapshot`]): the state *in the image*. Whatever happened to a stream while the
/// push was on its way (an answer, a refusal, its end) is news to the receiver.
pub(super) fn imaged(
    image: &SessionSnapshot,
    positions: &HashMap<StreamKey, u64>,
) -> HashMap<StreamKey, Sent> {
    image
        .streams
        .iter()
        .filter_map(|s| {
            let &position = positions.get(&s.key)?;
            let sent = Sent {
                position,
                pending: s.pending.len(),
                head: s.sse.is_some() || s.stored.is_some(),
                done: s.complete,
            };
            Some((s.key.clone(), sent))
        })
        .collect()
}

/// Follows `session` (moved to `target`, which has `sent` of it: [`imaged`]) until every
/// stream is complete and sent, the target is lost, or it takes nothing for
/// `spec.drain.timeout`.
pub(super) async fn follow(
    handoff: &Handoff,
    session: &Arc<Session>,
    target: &Peer,
    mut sent: HashMap<StreamKey, Sent>,
) -> Followed {
    let mut changes = session.subscribe(true);
    for stream in session.streams() {
        if let Some(at) = sent.get(stream.key()) {
            // The image carried them: here they may make room for the upstream's next.
            stream.forwarded(at.position);
        }
    }
    let to = handoff.destination(target);
    let budget = handoff
        .max_message_bytes
        .saturating_sub(MESSAGE_OVERHEAD)
        .max(1);
    // When the calls that ran here were over, and how long the standalone stream may stay.
    let mut calls_done_at: Option<(Instant, Duration)> = None;
    loop {
        if handoff.broker.departed_session(session.id()).is_none() {
            return Followed::Reclaimed;
        }
        changes.look();
        let (push, next, more) = delta(handoff, session, &sent, budget);
        if !push.streams.is_empty() {
            let events: usize = push.streams.iter().map(|s| s.events.len()).sum();
            let Ok(body) = serde_json::to_vec(&push) else {
                return Followed::GaveUp;
            };
            match send(handoff, target, to, Bytes::from(body)).await {
                Delivery::Taken => {}
                Delivery::HolderLost => return Followed::HolderLost,
                Delivery::Ended => return Followed::Ended,
                Delivery::GaveUp => return Followed::GaveUp,
            }
            handoff.metrics.tail_events_forwarded(events as u64);
            tracing::debug!(session = session.digest(), peer = %target.name, streams = push.streams.len(), events, "tail sent");
            for (stream, now) in next {
                // The new holder has them: here they may make room for the upstream's next.
                stream.forwarded(now.position);
                sent.insert(stream.key().clone(), now);
            }
        }
        if more {
            continue;
        }
        let streams = session.streams();
        let done = |s: &Arc<Stream>| sent.get(s.key()).is_some_and(|s| s.done);
        let requests_done = session.entering() == 0
            && streams
                .iter()
                .filter(|s| s.kind() != StreamKind::Standalone)
                .all(done);
        if requests_done && streams.iter().all(done) {
            return Followed::Done;
        }
        // The calls that ran here are over, so nothing this upstream session sends any more is
        // for the client but the messages they sent on the standalone stream, which travel on
        // another connection than their answers and may still be on their way. Ending the
        // upstream session makes the MCP server end the standalone stream after them: its pump
        // forwards them, then ends the stream (the client's next GET gets the new holder's). A
        // server that does not end it (or not in time) gets a short linger instead.
        let mut wait = IDLE_CHECK;
        if requests_done && let Standalone::Open(standalone) = session.standalone() {
            let (since, linger) = match calls_done_at {
                Some(done) => done,
                None => {
                    let ended = handoff.broker.end_departed_upstream(session).await;
                    let linger = if ended {
                        STANDALONE_END_WAIT
                    } else {
                        STANDALONE_LINGER
                    };
                    *calls_done_at.insert((Instant::now(), linger))
                }
            };
            if since.elapsed() >= linger {
                standalone.complete();
                session.clear_standalone(&standalone);
                continue;
            }
            wait = linger.saturating_sub(since.elapsed());
        }
        let _ = tokio::time::timeout(wait, changes.changed()).await;
    }
}

/// What changed since `sent`: the message, the receiver's state once applied, and whether more
/// remains than fitted in `budget` bytes of event data.
fn delta(
    handoff: &Handoff,
    session: &Session,
    sent: &HashMap<StreamKey, Sent>,
    budget: usize,
) -> (TailPush, Vec<(Arc<Stream>, Sent)>, bool) {
    let mut streams = Vec::new();
    let mut next = Vec::new();
    let mut new_keys = Vec::new();
    let mut left = budget;
    let mut more = false;
    for stream in session.streams() {
        let before = sent.get(stream.key()).cloned().unwrap_or_default();
        if before.done {
            continue;
        }
        if left == 0 {
            more = true;
            break;
        }
        let (snapshot, position) = stream.snapshot(before.position, left);
        let now = Sent {
            position,
            pending: snapshot.pending.len(),
            head: snapshot.sse.is_some() || snapshot.stored.is_some(),
            done: snapshot.complete,
        };
        if now == before && snapshot.events.is_empty() && sent.contains_key(stream.key()) {
            continue;
        }
        let size: usize = snapshot.events.iter().map(|e| e.data.len()).sum();
        left = left.saturating_sub(size.max(1));
        more |= position < stream.last_seq();
        if !sent.contains_key(stream.key()) {
            new_keys.push(stream.key().clone());
        }
        next.push((Arc::clone(&stream), now));
        streams.push(image::stream_image(&snapshot));
    }
    let push = TailPush {
        from: handoff.router.uid().to_owned(),
        session: session.id().to_owned(),
        requests: if new_keys.is_empty() {
            Vec::new()
        } else {
            image::request_images(&session.records_of(&new_keys))
        },
        streams,
    };
    (push, next, more)
}

/// Sends one tail message to `target` until it is taken, the target is lost (see
/// [`Followed::HolderLost`]; a 404 `not_held` says it lost the session), the session ended there
/// (409 `ended`), or it has taken nothing for `spec.drain.timeout`.
async fn send(handoff: &Handoff, target: &Peer, to: Destination<'_>, body: Bytes) -> Delivery {
    let give_up = Instant::now() + handoff.patience;
    let mut pauses = RETRY_PAUSES.iter().copied();
    loop {
        match handoff.client.post(to, TAIL_PATH, body.clone()).await {
            Ok(()) => return Delivery::Taken,
            Err(SendError::Refused { status, .. }) if status == StatusCode::NOT_FOUND => {
                return Delivery::HolderLost;
            }
            Err(e) if e.refused_for("ended") => return Delivery::Ended,
            Err(e) if !e.is_transient() => {
                tracing::warn!(peer = %target.name, error = %e, "a tail message was refused");
                return Delivery::GaveUp;
            }
            Err(_) if handoff.holder_gone(&target.uid) => return Delivery::HolderLost,
            Err(_) if Instant::now() >= give_up => return Delivery::GaveUp,
            Err(e) => {
                tracing::debug!(peer = %target.name, error = %e, "a tail message was not taken; retrying");
                let pause = pauses
                    .next()
                    .unwrap_or(RETRY_PAUSES[RETRY_PAUSES.len() - 1]);
                tokio::time::sleep(pause).await;
            }
        }
    }
}
